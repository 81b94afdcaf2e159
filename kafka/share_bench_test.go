package kafka_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// Workload of BenchmarkShareSource.
const (
	benchShareRecords  = 400
	benchShareParts    = 2
	benchShareHandlers = 16
	benchShareLatency  = 2 * time.Millisecond // each effect's fixed latency
	benchShareStuck    = time.Second          // the stuck record's effect
	benchShareSettle   = 2 * time.Second      // for the group to settle before the workload
)

// BenchmarkShareSource compares, on the same workload (400 records on 2
// partitions, an consume.Consumer with 16 handlers, every effect taking a
// fixed 2 ms), the partition-ordered kafka.Source (the baseline: at most
// one handler per partition) with kafka.ShareSource (no ordering: every
// handler busy), each also with one stuck record (the first record of
// partition 0, whose effect takes 1 s):
//
//	partition          kafka.Source
//	share              kafka.ShareSource (4 members)
//	partition_stuck    kafka.Source, one stuck record: its partition waits behind it
//	share_stuck        kafka.ShareSource, one stuck record: nothing waits behind it
//
// A run is the time from the first delivery to the moment every record
// but the stuck one was handled (so a run measures the records behind the
// stuck one, not the stuck one itself); group joins are not timed. Each
// b.N is a round of all four variants on fresh topics and groups, in an
// order rotated every round. The benchmark reports each variant's median
// records/s and, for share and the stuck variants, the median, minimum and
// maximum over the rounds of its run time relative to partition's run time
// in the same round. Run it with -benchtime=5x (five rounds).
func BenchmarkShareSource(b *testing.B) {
	c := kafkatest.Start(b, kafkatest.ShareBrokerConfigs(30*time.Second, 0))
	type variant struct {
		name  string
		share bool
		stuck bool
	}
	variants := []variant{{"partition", false, false}, {"share", true, false}, {"partition_stuck", false, true}, {"share_stuck", true, true}}
	took := make([][]time.Duration, len(variants)) // [variant][round]
	b.ResetTimer()
	for i := range b.N {
		for j := range variants {
			v := (i + j) % len(variants)
			b.StopTimer()
			d := benchShareRun(b, c, variants[v].share, variants[v].stuck)
			b.StartTimer()
			took[v] = append(took[v], d)
		}
	}
	b.StopTimer()
	median := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[len(s)/2]
	}
	others := float64(benchShareRecords)
	for v, variant := range variants {
		var rates, ratios []float64
		n := others
		if variant.stuck {
			n--
		}
		for r, d := range took[v] {
			rates = append(rates, n/d.Seconds())
			ratios = append(ratios, float64(d)/float64(took[0][r]))
		}
		b.ReportMetric(median(rates), variant.name+"-records/s")
		if v == 0 {
			continue
		}
		slices.Sort(ratios)
		b.ReportMetric(ratios[len(ratios)/2], variant.name+"/partition-time-median")
		b.ReportMetric(ratios[0], variant.name+"/partition-time-min")
		b.ReportMetric(ratios[len(ratios)-1], variant.name+"/partition-time-max")
	}
}

// benchShareRun runs one variant on a fresh topic and group, and returns
// the time from the first delivery until every record but the stuck one
// was handled.
func benchShareRun(b *testing.B, c *kafkatest.Cluster, share, stuck bool) time.Duration {
	ctx := context.Background()
	topic, err := c.CreateTopic(ctx, "bench-share", benchShareParts)
	if err != nil {
		b.Fatal(err)
	}
	group := "g-" + topic
	cl, err := kgo.NewClient(c.Opts(kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		b.Fatal(err)
	}
	recs := make([]*kgo.Record, benchShareRecords)
	for i := range recs {
		id := fmt.Sprintf("%s-%d", topic, i)
		recs[i] = &kgo.Record{Topic: topic, Partition: int32(i % benchShareParts), Value: []byte(id),
			Headers: []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte(id)}}}
	}
	defer cl.Close()
	stuckID := topic + "-0" // the first record of partition 0
	var src effects.Source
	var closeSrc func() error
	if share {
		if err := c.SetShareFromEarliest(ctx, group); err != nil {
			b.Fatal(err)
		}
		s, err := kafka.NewShareSource(c.Opts(kgo.ShareGroup(group), kgo.ConsumeTopics(topic)))
		if err != nil {
			b.Fatal(err)
		}
		src, closeSrc = s, s.Close
	} else {
		s, err := kafka.NewSource(c.Opts(kafkatest.GroupOpts(group, topic)...))
		if err != nil {
			b.Fatal(err)
		}
		src, closeSrc = s, s.Close
	}
	want := int64(benchShareRecords)
	if stuck {
		want--
	}
	var (
		handled   atomic.Int64
		firstOnce sync.Once
		first     time.Time
		done      = make(chan time.Time, 1)
	)
	cons, err := consume.New(src, func(ctx context.Context, d effects.Delivery) error {
		firstOnce.Do(func() { first = time.Now() })
		latency := benchShareLatency
		if stuck && d.ID == stuckID {
			latency = benchShareStuck
		}
		select {
		case <-time.After(latency):
		case <-ctx.Done():
			return ctx.Err()
		}
		if !(stuck && d.ID == stuckID) && handled.Add(1) == want {
			done <- time.Now()
		}
		return nil
	}, consume.WithConcurrency(benchShareHandlers), consume.WithoutDeadLetter())
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- cons.Run(rctx) }()
	// The group settles first (joins, assignments); then the workload.
	time.Sleep(benchShareSettle)
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		b.Fatal(err)
	}
	var end time.Time
	select {
	case end = <-done:
	case <-time.After(time.Minute):
		b.Fatalf("share %t stuck %t: %d of %d handled in a minute", share, stuck, handled.Load(), want)
	}
	cancel()
	if err := <-ran; err != nil {
		b.Fatal(err)
	}
	if err := closeSrc(); err != nil {
		b.Fatal(err)
	}
	firstOnce.Do(func() {}) // first is set: a record was handled
	return end.Sub(first)
}
