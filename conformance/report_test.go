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
			{Scenario: conformance.ScenarioRedelivery, Verdict: conformance.Pass, Checks: 2, MinEffects: 1, MaxEffects: 1},
			{Scenario: conformance.ScenarioRestart, Verdict: conformance.NotRun, Notes: []string{"no Restarter"}},
		},
	}
	liar := conformance.Report{
		Adapter:   "counterexample/blind",
		Evaluated: true,
		Rows:      []conformance.Row{{Scenario: conformance.ScenarioRedelivery, Verdict: conformance.Fail, Checks: 1, MinEffects: 5, MaxEffects: 5, Failures: []string{"5 effects | for one key"}}},
	}
	for _, r := range []conformance.Report{good, liar} {
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
		"| postgres | effectively-once | redelivery | 1 per key (2 checks) | pass |",
		"| postgres | effectively-once | backend-restart | - | not run | no Restarter |",
		"### Counterexamples",
		`| FAIL | 5 effects \| for one key |`,
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
