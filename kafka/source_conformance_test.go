package kafka_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// sourceHarness runs kafka.Source over one topic of three partitions and
// one consumer group. Every instance's connections go through the suite's
// faults, so a crash (the faults severed) is a member that vanishes
// without committing or leaving: the group notices after the session
// timeout (kafkatest.GroupOpts: 3 s).
type sourceHarness struct {
	cluster      *kafkatest.Cluster
	topic, group string
	published    int
	wrap         func(effects.Source) effects.Source // the counterexample
}

func newSourceHarness(t testing.TB, wrap func(effects.Source) effects.Source) conformance.SourceHarness {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "source-conformance", 3)
	return &sourceHarness{cluster: c, topic: topic, group: "g-" + topic, wrap: wrap}
}

// Publish produces n records round robin over the partitions, each with
// its id in the key header (Delivery.ID).
func (h *sourceHarness) Publish(ctx context.Context, n int) ([]string, error) {
	return h.produce(ctx, n, func() int32 { return int32(h.published % 3) })
}

// Orderings and PublishTo make the harness a conformance.OrderingPublisher:
// its orderings are the topic's three partitions.
func (h *sourceHarness) Orderings() int { return 3 }

// PublishTo produces n records to partition k.
func (h *sourceHarness) PublishTo(ctx context.Context, k, n int) ([]string, error) {
	return h.produce(ctx, n, func() int32 { return int32(k) })
}

// produce produces n records, each to the partition part returns.
func (h *sourceHarness) produce(ctx context.Context, n int, part func() int32) ([]string, error) {
	cl, err := kgo.NewClient(h.cluster.Opts(kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ids := make([]string, n)
	recs := make([]*kgo.Record, n)
	for i := range recs {
		ids[i] = fmt.Sprintf("%s-%d", h.topic, h.published)
		recs[i] = &kgo.Record{Topic: h.topic, Partition: part(), Value: []byte(ids[i]),
			Headers: []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte(ids[i])}}}
		h.published++
	}
	return ids, cl.ProduceSync(ctx, recs...).FirstErr()
}

var _ conformance.OrderingPublisher = (*sourceHarness)(nil)

// Open starts a group member. Crash is left to the suite: it severs the
// member's connections, then Close returns without reaching the broker.
func (h *sourceHarness) Open(_ context.Context, f *conformance.Faults) (conformance.SourceInstance, error) {
	src, err := kafka.NewSource(h.cluster.Opts(append(kafkatest.GroupOpts(h.group, h.topic), kgo.Dialer(f.DialContext))...))
	if err != nil {
		return conformance.SourceInstance{}, err
	}
	var s effects.Source = src
	if h.wrap != nil {
		s = h.wrap(src)
	}
	return conformance.SourceInstance{Source: s, Close: func() { _ = src.Close() }}, nil
}

// TestSourceConformance holds kafka.Source to the effects.Source contract.
// It hands nothing back (no effects.Releaser: a partition's order is kept
// by retrying in place), so the released scenario does not run.
func TestSourceConformance(t *testing.T) {
	rep := conformance.RunSource(t, "kafka.Source", func(t testing.TB) conformance.SourceHarness {
		return newSourceHarness(t, nil)
	}, conformance.WithRedeliveryWait(30*time.Second))
	for _, row := range rep.Rows {
		want := conformance.Pass
		if row.Scenario == conformance.SourceReleased {
			want = conformance.NotRun
		}
		if row.Verdict != want {
			t.Errorf("%s: %s %s, want %s", row.Scenario, row.Verdict, row.Skipped, want)
		}
	}
}

// TestSourceCounterexampleAckOnNext: kafka.Source wrapped to ack every
// record as it hands it out (auto-commit) loses what was never handled.
func TestSourceCounterexampleAckOnNext(t *testing.T) {
	rep := conformance.RunSource(t, "counterexample: kafka.Source acking on Next", func(t testing.TB) conformance.SourceHarness {
		return newSourceHarness(t, func(s effects.Source) effects.Source { return ackOnNext{s} })
	}, conformance.WithRedeliveryWait(4*time.Second),
		conformance.Only(conformance.SourceUnackedAfterClose, conformance.SourceNeverAcked, conformance.SourceOutOfOrderAcks), conformance.ReportOnly())
	for _, s := range []string{conformance.SourceUnackedAfterClose, conformance.SourceNeverAcked, conformance.SourceOutOfOrderAcks} {
		if !slices.Contains(rep.Failed(), s) {
			t.Errorf("%s passed a source that acks on Next", s)
		}
	}
}

// ackOnNext acks every delivery as it hands it out: a source that commits
// what no handler has finished.
type ackOnNext struct{ effects.Source }

func (s ackOnNext) Next(ctx context.Context) (effects.Delivery, error) {
	d, err := s.Source.Next(ctx)
	if err == nil {
		err = s.Source.Ack(ctx, d)
	}
	return d, err
}
