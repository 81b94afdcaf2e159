package counterexamples_test

import (
	"context"
	"slices"
	"testing"

	"effectively.dev/conformance"
	"effectively.dev/conformance/counterexamples"
	"effectively.dev/effects"
	"effectively.dev/internal/memjournal"
)

// journalHarness opens one shared journal for every instance.
type journalHarness struct{ j effects.Journal }

func (h journalHarness) Open(context.Context, *conformance.Faults) (effects.Journal, func(), error) {
	return h.j, nil, nil
}

// TestRunJournalCatchesCounterexamples is RunJournal's proof: each journal
// that breaks the protocol in one way fails the scenarios named for it.
func TestRunJournalCatchesCounterexamples(t *testing.T) {
	cases := []struct {
		name   string
		open   func() effects.Journal
		caught []string
	}{
		{"two attempts hold one lease", func() effects.Journal { return counterexamples.TwoLeases{Journal: memjournal.New(nil)} },
			[]string{conformance.JournalLease, conformance.JournalConcurrent, conformance.JournalCrashedHolder}},
		{"release without fencing", func() effects.Journal { return counterexamples.UnfencedRelease{Journal: memjournal.New(nil)} },
			[]string{conformance.JournalFencing}},
		{"leases never expire", func() effects.Journal { return counterexamples.NoExpiry{Journal: memjournal.New(nil)} },
			[]string{conformance.JournalLeaseExpiry, conformance.JournalCrashedHolder}},
		{"the last reference wins", func() effects.Journal { return counterexamples.NewLastRefWins() },
			[]string{conformance.JournalFirstRef}},
		{"Lookup ignores the fingerprint", func() effects.Journal {
			return counterexamples.LookupIgnoresFingerprint{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalLookupMarkDone}},
		{"MarkDone records nothing without Begin", func() effects.Journal {
			return counterexamples.MarkDoneNeedsBegin{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalLookupMarkDone}},
		{"a takeover adopts another fingerprint", func() effects.Journal {
			return counterexamples.FingerprintOnTakeover{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalLeaseExpiry, conformance.JournalKeyReuse}},
		{"leases cut to 200 ms", func() effects.Journal { return counterexamples.ShortLease{Journal: memjournal.New(nil)} },
			[]string{conformance.JournalLeaseExpiry}},
		{"Complete records a key never begun", func() effects.Journal {
			return counterexamples.CompleteCreates{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalFirstRef}},
		{"CompleteAll ignores the fingerprint", func() effects.Journal {
			return counterexamples.CompleteAllIgnoresFingerprint{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalCompleteAll}},
		{"CompleteAll reports success for all", func() effects.Journal {
			return counterexamples.CompleteAllReportsSuccess{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalCompleteAll}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := conformance.EvaluateJournal(t, "counterexample: "+c.name, func(testing.TB) conformance.JournalHarness {
				return journalHarness{c.open()}
			}, conformance.Only(c.caught...))
			for _, s := range c.caught {
				if !slices.Contains(rep.Failed(), s) {
					row, _ := rep.Row(s)
					t.Errorf("%s passed a journal where %s (verdict %s)", s, c.name, row.Verdict)
				}
			}
		})
	}
}
