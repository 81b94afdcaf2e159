package conformance

import (
	"fmt"
	"strings"

	"effectively.dev/effects"
)

// FieldStatus is what the scenarios made of one field of a contract.
type FieldStatus string

const (
	// Verified: every scenario the field rests on ran and passed.
	Verified FieldStatus = "verified"
	// NotVerified: a scenario the field rests on did not run (the harness
	// lacks a capability, or it was not selected). The declaration is a
	// claim, not a checked guarantee.
	NotVerified FieldStatus = "NOT VERIFIED"
	// Failed: a scenario the field rests on failed.
	Failed FieldStatus = "FAILED"
	// NotApplicable: the contract claims nothing the field could be
	// checked on (no horizon for an effect that records no keys; key reuse
	// not claimed).
	NotApplicable FieldStatus = "n/a"
)

// Field is the verification of one field of a declared contract.
type Field struct {
	// Field is "Guarantee", "DuplicateWindow", "Horizon" or
	// "DetectsKeyReuse".
	Field string
	// Declared is the declared value, in words.
	Declared string
	Status   FieldStatus
	// Why names the scenarios behind the status.
	Why string
	// Allowed is the reason the harness gave with [AllowUnverified] for a
	// field that is NotVerified because a scenario it rests on could not
	// run; empty otherwise.
	Allowed string `json:",omitempty"`

	// blocked lists the scenarios the field rests on that did not run for
	// a reason other than selection (a missing capability, a skip).
	blocked []string
}

// String renders the field for the matrix, e.g.
// "NOT VERIFIED (0, until pruned): horizon not run: harness does not implement conformance.Ager",
// with the reason given to [AllowUnverified] after the declared value.
func (f Field) String() string {
	if f.Allowed != "" {
		return fmt.Sprintf("%s (%s), allowed unverified: %s: %s", f.Status, f.Declared, f.Allowed, f.Why)
	}
	return fmt.Sprintf("%s (%s): %s", f.Status, f.Declared, f.Why)
}

// short renders the field for a matrix cell: the status and the declared
// value, and why only when it is not verified.
func (f Field) short() string {
	if f.Status == Verified {
		return fmt.Sprintf("%s (%s)", f.Status, f.Declared)
	}
	return f.String()
}

// guaranteeScenarios are the scenarios every guarantee rests on;
// guaranteeSupport those that add to it when they run.
var (
	guaranteeScenarios = []string{ScenarioRedelivery, ScenarioConcurrent, ScenarioLostReply, ScenarioCut,
		ScenarioCancel, ScenarioDistinctKeys, ScenarioStorm}
	guaranteeSupport = []string{ScenarioLateRedelivery, ScenarioRaceReuse, ScenarioRestart, ScenarioSlowReply, ScenarioKeyCapacity, ScenarioProcess,
		ScenarioCrashRestart, ScenarioSchedules, ScenarioAppFaults, ScenarioSlowBackend, ScenarioHostileKeys, ScenarioKeyScope, ScenarioKeyBytes}
)

// fields derives, from the rows and the contract, what each contract field
// came to.
func fields(c effects.Contract, rows []Row) []Field {
	byName := map[string]Row{}
	for _, r := range rows {
		byName[r.Scenario] = r
	}
	judge := func(field, declared string, required, support []string) Field {
		f := Field{Field: field, Declared: declared}
		var failed, missing, skipped []string
		for _, n := range append(append([]string(nil), required...), support...) {
			if byName[n].Verdict == Fail {
				failed = append(failed, n)
			}
		}
		for _, n := range required {
			if r := byName[n]; r.Verdict == NotRun {
				missing = append(missing, n+" not run: "+r.Skipped)
				if !notSelected(r) {
					f.blocked = append(f.blocked, n)
				}
			}
		}
		for _, n := range support {
			if r := byName[n]; r.Verdict == NotRun {
				skipped = append(skipped, n)
			}
		}
		switch {
		case len(failed) > 0:
			f.Status, f.Why = Failed, "failed in "+strings.Join(failed, ", ")
		case len(missing) > 0:
			f.Status, f.Why = NotVerified, strings.Join(missing, "; ")
		default:
			f.Status, f.Why = Verified, "passed "+strings.Join(required, ", ")
			if len(skipped) > 0 {
				f.Why += " (not run: " + strings.Join(skipped, ", ") + ")"
			}
		}
		if f.Status != NotVerified {
			f.blocked = nil
		}
		return f
	}
	window := "none"
	if c.Guarantee == effects.AtLeastOnce {
		window = c.DuplicateWindow.Trigger.String()
	}
	out := []Field{
		judge("Guarantee", c.Guarantee.String(), guaranteeScenarios, guaranteeSupport),
		judge("DuplicateWindow", window, guaranteeScenarios, guaranteeSupport),
	}
	horizon := "0, until pruned"
	if c.Horizon > 0 {
		horizon = c.Horizon.String()
	}
	if c.Guarantee == effects.AtLeastOnce && c.DuplicateWindow.Trigger == effects.AnyRedelivery {
		out = append(out, Field{Field: "Horizon", Declared: horizon, Status: NotApplicable,
			Why: "nothing records keys: any redelivery may duplicate"})
	} else {
		out = append(out, judge("Horizon", horizon, []string{ScenarioHorizon}, []string{ScenarioLateRedelivery, ScenarioKeyCapacity}))
	}
	if c.DetectsKeyReuse {
		out = append(out, judge("DetectsKeyReuse", "yes", []string{ScenarioKeyReuse, ScenarioRaceReuse}, []string{ScenarioKeyCapacity}))
	} else {
		out = append(out, Field{Field: "DetectsKeyReuse", Declared: "no", Status: NotApplicable, Why: "not claimed"})
	}
	return out
}
