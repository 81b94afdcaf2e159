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
			{Field: "Guarantee", Declared: "effectively-once", Status: conformance.Verified, Why: "passed redelivery", VerifiedBy: []string{"redelivery"}},
			{Field: "Horizon", Declared: "0, until pruned", Status: conformance.NotVerified, Why: "left out: horizon (no Ager)",
				LeftOut: []conformance.LeftOut{{Scenario: "horizon", Why: "no Ager", Blocks: true}}, Allowed: "the clock cannot move"},
		},
		Unverified: "the clock cannot move",
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
		"| postgres | Guarantee | effectively-once | verified | redelivery | - |",
		"| postgres | Horizon | 0, until pruned | NOT VERIFIED, allowed: the clock cannot move | - | horizon (no Ager) |",
		"### Journals (RunJournal)\n\n| journal | scenario | checks | verdict | notes |",
		"| memjournal | lease | 12 | pass |  |",
		"### Counterexample journals",
		"| counterexample: two leases | lease | 12 | FAIL | two attempts hold one lease |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("matrix lacks %q:\n%s", want, table)
		}
	}
	// A field left unverified with no reason fails the matrix, as it
	// fails the Run that wrote the report.
	unallowed := good
	unallowed.Fields = append([]conformance.Field(nil), good.Fields...)
	unallowed.Fields[1].Allowed, unallowed.Unverified = "", ""
	if err := unallowed.WriteFile(dir); err != nil {
		t.Fatal(err)
	}
	if _, failed, _ := conformance.MergeMatrix(dir); !failed {
		t.Error("failed = false with an adapter whose horizon cannot be verified and no reason given")
	}
	good.Rows[0].Verdict = conformance.Fail
	if err := good.WriteFile(dir); err != nil {
		t.Fatal(err)
	}
	if _, failed, _ := conformance.MergeMatrix(dir); !failed {
		t.Error("failed = false with a failing adapter")
	}
}
