package kafka_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// benchRounds is how many interleaved rounds BenchmarkProducerApply splits
// its calls into, to report the median and the range of the ratios.
const benchRounds = 5

// BenchmarkProducerApply compares one record produced per call, with a
// default kgo client (franz-go's 10 ms linger) on kfake, side by side:
//
//	produce_sync       client.ProduceSync of the record the Producer would build: the hand-written baseline
//	apply              Producer.Apply without a journal
//	apply_memjournal   Producer.Apply with an in-memory journal (Begin and Complete cost no I/O)
//	produce_promise    client.Produce and a wait on its promise: what Producer.Apply did before, waiting out the linger
//
// The variants run round-robin, call by call (starting with a different
// variant each call), so that drift hits all alike. b.N calls per variant
// are split into benchRounds rounds. The benchmark reports each variant's
// mean ns per call and, per variant, its median call time relative to
// produce_sync's median call time in the same round: the median, minimum
// and maximum of that ratio over the rounds. Medians of calls, because on
// a shared machine a few calls that lose the CPU would otherwise decide a
// round's ratio.
func BenchmarkProducerApply(b *testing.B) {
	c := kafkatest.Start(b)
	topic := c.Topic(b, "bench", 3)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...)) // franz-go's defaults
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cl.Close)
	plain, err := kafka.NewProducer(cl, topic)
	if err != nil {
		b.Fatal(err)
	}
	journaled, err := kafka.NewProducer(cl, topic, kafka.WithJournal(memjournal.New(nil)))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	msg := kafka.Message{Value: []byte(`{"cents":4200}`)}
	record := func(key effects.Key) *kgo.Record {
		return &kgo.Record{Topic: topic, Key: []byte(key), Value: msg.Value,
			Headers: []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte(key)}}}
	}
	apply := func(p *kafka.Producer) func(effects.Key) {
		return func(key effects.Key) {
			if _, err := p.Apply(ctx, key, msg); err != nil {
				b.Fatal(err)
			}
		}
	}
	variants := []struct {
		name string
		run  func(effects.Key)
	}{
		{"produce_sync", func(key effects.Key) {
			if err := cl.ProduceSync(ctx, record(key)).FirstErr(); err != nil {
				b.Fatal(err)
			}
		}},
		{"apply", apply(plain)},
		{"apply_memjournal", apply(journaled)},
		{"produce_promise", func(key effects.Key) {
			done := make(chan error, 1)
			cl.Produce(ctx, record(key), func(_ *kgo.Record, err error) { done <- err })
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		}},
	}
	// Warm up: the topic's metadata and the producer id, for every variant.
	for j, v := range variants {
		v.run(effects.MustKey("warm", fmt.Sprint(j)))
	}

	// took[round][variant] holds the duration of every call.
	took := make([][][]time.Duration, benchRounds)
	for r := range took {
		took[r] = make([][]time.Duration, len(variants))
	}
	b.ResetTimer()
	for i := range b.N {
		round := i * benchRounds / b.N
		for j := range variants {
			v := (i + j) % len(variants)
			key := effects.MustKey("bench", fmt.Sprint(i), variants[v].name)
			start := time.Now()
			variants[v].run(key)
			took[round][v] = append(took[round][v], time.Since(start))
		}
	}
	b.StopTimer()
	median := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[len(s)/2])
	}
	for v, variant := range variants {
		var total time.Duration
		var ratios []float64
		for r := range took {
			for _, d := range took[r][v] {
				total += d
			}
			if len(took[r][v]) > 0 && len(took[r][0]) > 0 {
				ratios = append(ratios, median(took[r][v])/median(took[r][0]))
			}
		}
		b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), variant.name+"-ns/call")
		if v == 0 || len(ratios) == 0 {
			continue
		}
		slices.Sort(ratios)
		b.ReportMetric(ratios[len(ratios)/2], variant.name+"/sync-median")
		b.ReportMetric(ratios[0], variant.name+"/sync-min")
		b.ReportMetric(ratios[len(ratios)-1], variant.name+"/sync-max")
	}
}
