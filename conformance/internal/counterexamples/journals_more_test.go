package counterexamples_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/conformance/internal/counterexamples"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
)

// skewHarness opens instances over one in-memory store; skewed ones
// judge leases by their own clock when instanceClock is set, by the
// store's otherwise (the honest control).
type skewHarness struct {
	m             *memjournal.Journal
	instanceClock bool
}

func (h skewHarness) Open(context.Context, *conformance.Faults) (journal.Journal, func(), error) {
	return counterexamples.InstanceClock{Journal: h.m}, nil, nil
}

func (h skewHarness) OpenSkewed(_ context.Context, _ *conformance.Faults, skew time.Duration) (journal.Journal, func(), error) {
	if !h.instanceClock {
		skew = 0
	}
	return counterexamples.InstanceClock{Journal: h.m, Skew: skew}, nil, nil
}

// TestRunJournalCatchesInstanceClock: a journal that judges leases by each
// instance's clock passes every other journal scenario and fails
// clock-skew; the same store judged by one clock passes it.
func TestRunJournalCatchesInstanceClock(t *testing.T) {
	for _, lie := range []bool{false, true} {
		var opts []conformance.JournalOption
		if !lie {
			opts = append(opts, conformance.Only(conformance.JournalClockSkew)) // the control: the other scenarios are memjournal's
		}
		rep := conformance.RunJournal(t, "instance clock", func(testing.TB) conformance.JournalHarness {
			return skewHarness{memjournal.New(nil), lie}
		}, append(opts, conformance.ReportOnly())...)
		for _, row := range rep.Rows {
			want := conformance.Pass
			switch {
			case row.Scenario == conformance.JournalBackendRestart || row.Scenario == conformance.JournalCrashRestart ||
				row.Scenario == conformance.JournalTripFaults || // memjournal makes no round trip
				(!lie && row.Scenario != conformance.JournalClockSkew):
				want = conformance.NotRun
			case row.Scenario == conformance.JournalClockSkew && lie:
				want = conformance.Fail
			}
			if row.Verdict != want {
				t.Errorf("instance clock %v: %s: %s %v %s, want %s", lie, row.Scenario, row.Verdict, row.Failures, row.Skipped, want)
			}
		}
		if lie && !slices.Contains(rep.Failed(), conformance.JournalClockSkew) {
			t.Errorf("clock-skew passed a journal that judges leases by each instance's clock")
		}
	}
}
