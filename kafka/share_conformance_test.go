package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// shareHarness runs kafka.ShareSource over one topic of three partitions
// and one share group reading from the earliest offset, on a cluster with
// a 3 s acquisition lock. A crash (the faults severed) is a member whose
// records come back when their locks expire or the group evicts it.
type shareHarness struct {
	sourceHarness // Publish
}

func newShareHarness(t testing.TB) conformance.SourceHarness {
	c := kafkatest.Start(t, kafkatest.ShareBrokerConfigs(shareTestLock, 0))
	topic := c.Topic(t, "share-conformance", 3)
	group := "sg-" + topic
	c.ShareFromEarliest(t, group)
	return &shareHarness{sourceHarness{cluster: c, topic: topic, group: group}}
}

// Open starts a share-group member (a ShareSource of two clients).
func (h *shareHarness) Open(_ context.Context, f *conformance.Faults) (conformance.SourceInstance, error) {
	src, err := kafka.NewShareSource(h.cluster.Opts(kgo.ShareGroup(h.group), kgo.ConsumeTopics(h.topic), kgo.Dialer(f.DialContext)),
		kafka.WithShareMembers(2))
	if err != nil {
		return conformance.SourceInstance{}, err
	}
	var s effects.Source = src
	return conformance.SourceInstance{Source: s, Close: func() { _ = src.Close() }}, nil
}

// TestShareSourceConformance holds kafka.ShareSource to the effects.Source
// contract.
func TestShareSourceConformance(t *testing.T) {
	rep := conformance.RunSource(t, "kafka.ShareSource", newShareHarness, conformance.WithRedeliveryWait(30*time.Second))
	for _, row := range rep.Rows {
		if row.Verdict != conformance.Pass {
			t.Errorf("%s: %s %s", row.Scenario, row.Verdict, row.Skipped)
		}
	}
}
