package counterexamples_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/conformance"
	"effectively.dev/conformance/internal/counterexamples"
	"effectively.dev/effects"
)

// TestSuiteCatchesForgetfulKeys: a dedup that keeps only the newest keys
// passes the replay storm and fails key-capacity; one that forgets
// payloads after a day passes redelivery after aging and fails horizon,
// which also reuses the aged key with another payload.
func TestSuiteCatchesForgetfulKeys(t *testing.T) {
	cases := []struct {
		name   string
		build  func(*pgxpool.Pool) effects.Effect[counterexamples.Payment]
		caught string
		passes []string
		says   string
	}{
		{"newest-keys-only", func(p *pgxpool.Pool) effects.Effect[counterexamples.Payment] {
			return counterexamples.NewNewestKeysOnly(p)
		},
			conformance.ScenarioKeyCapacity, []string{conformance.ScenarioStorm, conformance.ScenarioRedelivery}, "redelivery after 5000 other keys"},
		{"payload-forgotten", func(p *pgxpool.Pool) effects.Effect[counterexamples.Payment] {
			return counterexamples.PayloadForgotten{DB: p}
		},
			conformance.ScenarioHorizon, []string{conformance.ScenarioKeyReuse, conformance.ScenarioRedelivery}, "another payload after aging"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := conformance.Run(t, "counterexample/"+c.name, maker(simple(c.build)),
				conformance.Only(append([]string{c.caught}, c.passes...)...), conformance.ReportOnly())
			row, _ := rep.Row(c.caught)
			if row.Verdict != conformance.Fail || !strings.Contains(strings.Join(row.Failures, "\n"), c.says) {
				t.Errorf("%s: %s %q, want FAIL saying %q", c.caught, row.Verdict, row.Failures, c.says)
			}
			for _, s := range c.passes {
				if slices.Contains(rep.Failed(), s) {
					r, _ := rep.Row(s)
					t.Errorf("%s failed %v: the lie should show only where it is caught", s, r.Failures)
				}
			}
		})
	}
}
