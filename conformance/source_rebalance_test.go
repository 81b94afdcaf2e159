package conformance_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"effectively.dev/conformance"
)

// plainPublisher is the memory log without conformance.OrderingPublisher:
// it publishes round robin only.
type plainPublisher struct{ l *memLog }

func (p plainPublisher) Publish(ctx context.Context, n int) ([]string, error) {
	return p.l.Publish(ctx, n)
}

func (p plainPublisher) Open(ctx context.Context, f *conformance.Faults) (conformance.SourceInstance, error) {
	return p.l.Open(ctx, f)
}

// onePartition is the memory log of one partition: an OrderingPublisher
// with nothing to leave idle.
type onePartition struct{ *memLog }

// TestRebalanceNeedsOrderingPublisher: without an OrderingPublisher,
// rebalance-full-buffers does not run and leaves Delivery and Acks
// unverified, which AllowUnverified must name; an OrderingPublisher of
// one ordering fails it.
func TestRebalanceNeedsOrderingPublisher(t *testing.T) {
	offMatrix(t)
	only := conformance.Only(conformance.SourceRebalanceFullBuffers)
	rep := conformance.RunSource(t, "memlog without PublishTo", func(testing.TB) conformance.SourceHarness {
		return plainPublisher{newMemLog(3)}
	}, only, conformance.ReportOnly())
	row, _ := rep.Row(conformance.SourceRebalanceFullBuffers)
	if row.Verdict != conformance.NotRun || !strings.Contains(row.Skipped, "conformance.OrderingPublisher") {
		t.Errorf("%s: %s %q, want not run for want of conformance.OrderingPublisher", row.Scenario, row.Verdict, row.Skipped)
	}
	for _, name := range []string{conformance.FieldDelivery, conformance.FieldAcks} {
		if f, _ := rep.Field(name); f.Status != conformance.NotVerified {
			t.Errorf("%s: %s, want not verified", name, f)
		}
	}
	if err := rep.Verify(); !errors.Is(err, conformance.ErrUnverified) {
		t.Errorf("Verify: %v, want ErrUnverified", err)
	}

	rep = conformance.RunSource(t, "memlog of one partition", func(testing.TB) conformance.SourceHarness {
		return onePartition{newMemLog(1)}
	}, only, conformance.WithRedeliveryWait(time.Second), conformance.ReportOnly())
	if row, _ := rep.Row(conformance.SourceRebalanceFullBuffers); row.Verdict != conformance.Fail || !strings.Contains(strings.Join(row.Failures, "\n"), "Orderings() is 1") {
		t.Errorf("%s with one ordering: %s %v, want a failure naming Orderings()", row.Scenario, row.Verdict, row.Failures)
	}
}
