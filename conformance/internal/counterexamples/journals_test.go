package counterexamples_test

import (
	"context"
	"slices"
	"testing"

	"effectively.dev/conformance"
	"effectively.dev/conformance/internal/counterexamples"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
)

// journalHarness opens one shared journal for every instance.
type journalHarness struct{ j journal.Journal }

func (h journalHarness) Open(context.Context, *conformance.Faults) (journal.Journal, func(), error) {
	return h.j, nil, nil
}

// TestRunJournalCatchesCounterexamples is RunJournal's proof: each journal
// that breaks the protocol in one way fails the scenarios named for it.
func TestRunJournalCatchesCounterexamples(t *testing.T) {
	cases := []struct {
		name   string
		open   func() journal.Journal
		caught []string
	}{
		{"two attempts hold one lease", func() journal.Journal { return counterexamples.TwoLeases{Journal: memjournal.New(nil)} },
			[]string{conformance.JournalLease, conformance.JournalConcurrent, conformance.JournalCrashedHolder}},
		{"release without fencing", func() journal.Journal { return counterexamples.UnfencedRelease{Journal: memjournal.New(nil)} },
			[]string{conformance.JournalFencing}},
		{"leases never expire", func() journal.Journal { return counterexamples.NoExpiry{Journal: memjournal.New(nil)} },
			[]string{conformance.JournalLeaseExpiry, conformance.JournalCrashedHolder}},
		{"the last reference wins", func() journal.Journal { return counterexamples.NewLastRefWins() },
			[]string{conformance.JournalFirstRef}},
		{"Lookup ignores the fingerprint", func() journal.Journal {
			return counterexamples.LookupIgnoresFingerprint{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalLookupMarkDone}},
		{"MarkDone records nothing without Begin", func() journal.Journal {
			return counterexamples.MarkDoneNeedsBegin{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalLookupMarkDone}},
		{"a takeover adopts another fingerprint", func() journal.Journal {
			return counterexamples.FingerprintOnTakeover{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalLeaseExpiry, conformance.JournalKeyReuse}},
		{"leases cut to 200 ms", func() journal.Journal { return counterexamples.ShortLease{Journal: memjournal.New(nil)} },
			[]string{conformance.JournalLeaseExpiry}},
		{"Complete records a key never begun", func() journal.Journal {
			return counterexamples.CompleteCreates{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalFirstRef}},
		{"an empty ref is taken for not done", func() journal.Journal {
			return counterexamples.EmptyRefNotDone{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalFirstRef, conformance.JournalLookupMarkDone}},
		{"Lookup takes a released key for done", func() journal.Journal {
			return counterexamples.ReleaseMarksDone{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalLookupMarkDone}},
		// The red team's (redteam.go).
		{"Lookup takes a leased key for done", func() journal.Journal {
			return counterexamples.LookupLeasedDone{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalLookupMarkDone}},
		{"attempts numbered per lease", func() journal.Journal {
			return counterexamples.AttemptPerLease{Journal: memjournal.New(nil)}
		}, []string{conformance.JournalLeaseExpiry, conformance.JournalFencing}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := conformance.RunJournal(t, "counterexample: "+c.name, func(testing.TB) conformance.JournalHarness {
				return journalHarness{c.open()}
			}, conformance.Only(c.caught...), conformance.ReportOnly())
			for _, s := range c.caught {
				if !slices.Contains(rep.Failed(), s) {
					row, _ := rep.Row(s)
					t.Errorf("%s passed a journal where %s (verdict %s)", s, c.name, row.Verdict)
				}
			}
		})
	}
}
