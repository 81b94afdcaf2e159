package conformance_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/conformance/internal/counterexamples"
	"effectively.dev/effects"
)

// closingSource is the memory log with its sources wrapped; a wrapper with
// a Close of its own (a client-side buffer) is closed before the member
// leaves, as its process would.
type closingSource struct {
	*memLog
	wrap func(effects.Source) effects.Source
}

func (w closingSource) Open(ctx context.Context, f *conformance.Faults) (conformance.SourceInstance, error) {
	si, err := w.memLog.Open(ctx, f)
	if err != nil {
		return si, err
	}
	si.Source = w.wrap(si.Source)
	if c, ok := si.Source.(interface{ Close(context.Context) error }); ok {
		leave := si.Close
		si.Close = func() { _ = c.Close(context.Background()); leave() }
	}
	return si, nil
}

// newSourceScenarios are the scenarios written for these liars; the
// others are the source suite they pass.
var newSourceScenarios = []string{conformance.SourcePublishOrder, conformance.SourceLivePublish, conformance.SourceCloseWithPrefetched}

// TestRunSourceCatchesOrderLiveAndPrefetch: a source that hands out each
// batch newest first, one that stops once it caught up and one that acks
// what it fetched on Close pass every scenario of the first source suite
// and fail the one written for them.
func TestRunSourceCatchesOrderLiveAndPrefetch(t *testing.T) {
	cases := []struct {
		name   string
		wrap   func(effects.Source) effects.Source
		caught string
	}{
		{"newest first", func(s effects.Source) effects.Source { return counterexamples.NewNewestFirst(s) }, conformance.SourcePublishOrder},
		{"stops when caught up", func(s effects.Source) effects.Source { return counterexamples.NewStopsWhenCaughtUp(s) }, conformance.SourceLivePublish},
		{"acks what it fetched on close", func(s effects.Source) effects.Source { return counterexamples.NewAckFetchedOnClose(s) }, conformance.SourceCloseWithPrefetched},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := conformance.RunSource(t, "counterexample: "+c.name, func(testing.TB) conformance.SourceHarness {
				return closingSource{newMemLog(3), c.wrap}
			}, conformance.WithRedeliveryWait(2*time.Second), conformance.ReportOnly())
			failed := rep.Failed()
			if !slices.Contains(failed, c.caught) {
				t.Errorf("%s passed a source that %s", c.caught, c.name)
			}
			for _, row := range rep.Rows {
				if !slices.Contains(newSourceScenarios, row.Scenario) && row.Verdict == conformance.Fail {
					t.Errorf("%s failed %v: the lie passes every scenario of the first source suite", row.Scenario, row.Failures)
				}
			}
		})
	}
}
