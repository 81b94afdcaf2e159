package memjournal_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"effectively.dev/conformance"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memHarness opens the one in-memory journal for every instance: it is
// the "database" every process shares.
type memHarness struct{ j *memjournal.Journal }

func (h memHarness) Open(context.Context, *conformance.Faults) (journal.Journal, func(), error) {
	return h.j, nil, nil
}

// TestConformance holds the in-memory journal to the journal.Journal
// contract: the tests of every adapter that use it rest on it.
func TestConformance(t *testing.T) {
	rep := conformance.RunJournal(t, "memjournal", func(testing.TB) conformance.JournalHarness {
		return memHarness{memjournal.New(nil)}
	}, conformance.AllowUnverified("process memory: every instance is one journal value reading one clock, its calls make no round trip that could be lost, "+
		"and nothing survives a restart or a crash of the process",
		conformance.JournalClockSkew, conformance.JournalBackendRestart, conformance.JournalCrashRestart, conformance.JournalTripFaults))
	for _, row := range rep.Rows {
		// An in-memory journal survives neither a restart nor a crash, has
		// one clock, and makes no round trip a fault could hit.
		restarts := row.Scenario == conformance.JournalBackendRestart || row.Scenario == conformance.JournalCrashRestart
		if row.Verdict == conformance.NotRun && !restarts && row.Scenario != conformance.JournalClockSkew && row.Scenario != conformance.JournalTripFaults {
			t.Errorf("%s: not run: %s", row.Scenario, row.Skipped)
		}
	}
}
