package conformance

import (
	"strings"
	"testing"
	"time"

	"effectively.dev/effects"
)

// TestHorizonField: how the Horizon field is judged from the rows, for a
// contract with duplicates on any redelivery, an assumed horizon, and a
// horizon row whose Age reached nothing.
func TestHorizonField(t *testing.T) {
	table := records(effectTable[struct{}]())
	anyRedelivery := effects.Window{Trigger: effects.AnyRedelivery, Between: "any repeat"}
	pass := func(name string) Row { return Row{Scenario: name, Verdict: Pass, Checks: 1} }
	na := func(name string) Row {
		return Row{Scenario: name, Verdict: NotRun, Skipped: "not applicable: x", NotApplicable: true}
	}
	unconfirmed := pass(ScenarioHorizon)
	unconfirmed.Unconfirmed, unconfirmed.Fix = "Age did not reach whatever enforces the keys", "fix"
	for _, tc := range []struct {
		name     string
		c        effects.Contract
		rows     []Row
		status   FieldStatus
		declared string
	}{
		{"until pruned, nothing records keys", effects.Contract{Guarantee: effects.AtLeastOnce, DuplicateWindow: anyRedelivery},
			[]Row{na(ScenarioHorizon), na(ScenarioLateRedelivery), pass(ScenarioKeyCapacity), pass(ScenarioKeyBytes)}, NotApplicable, "0, until pruned"},
		{"a horizon without a replay signal", effects.Contract{Guarantee: effects.AtLeastOnce, DuplicateWindow: anyRedelivery, Horizon: time.Hour},
			[]Row{pass(ScenarioHorizon), na(ScenarioLateRedelivery), pass(ScenarioKeyCapacity), pass(ScenarioKeyBytes)}, Verified, "1h0m0s"},
		{"a horizon the Age did not reach", effects.Contract{Guarantee: effects.EffectivelyOnce, Horizon: time.Hour},
			[]Row{unconfirmed, pass(ScenarioLateRedelivery), pass(ScenarioKeyCapacity), pass(ScenarioKeyBytes)}, NotVerified, "1h0m0s"},
		{"an assumed horizon the horizon scenario verified", effects.Contract{Guarantee: effects.EffectivelyOnce, Horizon: time.Hour, HorizonAssumed: true},
			[]Row{pass(ScenarioHorizon), pass(ScenarioLateRedelivery), pass(ScenarioKeyCapacity), pass(ScenarioKeyBytes)}, Verified, "1h0m0s (assumed)"},
		{"an assumed horizon only other scenarios passed", effects.Contract{Guarantee: effects.EffectivelyOnce, Horizon: time.Hour, HorizonAssumed: true},
			[]Row{na(ScenarioHorizon), pass(ScenarioLateRedelivery), pass(ScenarioKeyCapacity), pass(ScenarioKeyBytes)}, NotVerified, "1h0m0s (assumed)"},
	} {
		var f Field
		for _, g := range effectFields(tc.c, table, tc.rows) {
			if g.Field == FieldHorizon {
				f = g
			}
		}
		if f.Status != tc.status || f.Declared != tc.declared {
			t.Errorf("%s: %s, want %s (%s)", tc.name, f, tc.status, tc.declared)
		}
		if tc.status == NotVerified && !f.blocked() {
			t.Errorf("%s: %s does not block the strict run", tc.name, f)
		}
	}
	rep := Report{Contract: effects.Contract{Guarantee: effects.EffectivelyOnce, Horizon: time.Hour, HorizonAssumed: true}}
	if cell := rep.contractCell(); !strings.Contains(cell, "horizon 1h0m0s (assumed)") {
		t.Errorf("contract cell %q, want the horizon marked assumed", cell)
	}
}
