package conformance_test

import (
	"strings"
	"testing"

	"effectively.dev/conformance"
	"effectively.dev/effects"
)

func TestMergeMatrix(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := conformance.MergeMatrix(dir); err == nil {
		t.Fatal("MergeMatrix of an empty directory succeeded: a suite that ran nothing is not a pass")
	}
	good := conformance.Report{
		Adapter:  "postgres",
		Contract: effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "pg"},
		Rows: []conformance.Row{
			{Scenario: conformance.ScenarioRedelivery, Verdict: conformance.Pass, Checks: 3, Counted: 2, MinEffects: 1, MaxEffects: 1},
			{Scenario: conformance.ScenarioRestart, Verdict: conformance.NotRun, Skipped: "no Restarter"},
		},
		Fields: []conformance.Field{
			{Field: "Guarantee", Declared: "effectively-once", Status: conformance.Verified, Why: "passed redelivery"},
			{Field: "Horizon", Declared: "0, until pruned", Status: conformance.NotVerified, Why: "horizon not run: no Ager"},
		},
	}
	journal := conformance.Report{Suite: "journal", Adapter: "memjournal",
		Rows: []conformance.Row{{Scenario: conformance.JournalLease, Verdict: conformance.Pass, Checks: 12}}}
	liarJournal := conformance.Report{Suite: "journal", Adapter: "counterexample: two leases", Evaluated: true,
		Rows: []conformance.Row{{Scenario: conformance.JournalLease, Verdict: conformance.Fail, Checks: 12, Failures: []string{"two attempts hold one lease"}}}}
	liar := conformance.Report{
		Adapter:   "counterexample/blind",
		Evaluated: true,
		Rows:      []conformance.Row{{Scenario: conformance.ScenarioRedelivery, Verdict: conformance.Fail, Checks: 1, Counted: 1, MinEffects: 5, MaxEffects: 5, Failures: []string{"5 effects | for one key"}}},
	}
	for _, r := range []conformance.Report{good, liar, journal, liarJournal} {
		if err := r.WriteFile(dir); err != nil {
			t.Fatal(err)
		}
	}
	table, failed, err := conformance.MergeMatrix(dir)
	if err != nil {
		t.Fatal(err)
	}
	if failed {
		t.Error("failed = true, but only a counterexample failed")
	}
	for _, want := range []string{
		"| postgres | effectively-once | redelivery | 1 per key (2 counts) | pass |",
		"| postgres | effectively-once | backend-restart | - | not run | no Restarter |",
		"### Counterexamples",
		`| FAIL | 5 effects \| for one key |`,
		"### Contract fields: verified or not, per adapter",
		"| postgres | verified (effectively-once) | - | NOT VERIFIED (0, until pruned): horizon not run: no Ager | - |",
		"### Journals (RunJournal)\n\n| journal | scenario | checks | verdict | notes |",
		"| memjournal | lease | 12 | pass |  |",
		"### Counterexample journals",
		"| counterexample: two leases | lease | 12 | FAIL | two attempts hold one lease |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("matrix lacks %q:\n%s", want, table)
		}
	}
	good.Rows[0].Verdict = conformance.Fail
	if err := good.WriteFile(dir); err != nil {
		t.Fatal(err)
	}
	if _, failed, _ := conformance.MergeMatrix(dir); !failed {
		t.Error("failed = false with a failing adapter")
	}
}
