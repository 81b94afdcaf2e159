package conformance

import (
	"fmt"
	"slices"
	"strings"

	"effectively.dev/effects"
)

// FieldStatus is what the scenarios made of one field of a contract.
type FieldStatus string

const (
	// Verified: every scenario that verifies the field ran at full size
	// and passed (scenarios that do not apply to the subject aside).
	Verified FieldStatus = "verified"
	// NotVerified: a scenario that verifies the field did not run (the
	// harness lacks a capability, Only or go test -run left it out), or
	// ran reduced ([WithCapacity] below 5,000). The
	// declaration is a claim, not a checked guarantee.
	NotVerified FieldStatus = "NOT VERIFIED"
	// Failed: a scenario that verifies the field failed.
	Failed FieldStatus = "FAILED"
	// NotApplicable: the subject claims nothing the field could be
	// checked on (no horizon for an effect that records no keys; key reuse
	// not claimed).
	NotApplicable FieldStatus = "n/a"
)

// The fields each suite verifies ([Field].Field).
const (
	// Effect suite: the fields of [effects.Contract].
	FieldGuarantee       = "Guarantee"
	FieldDuplicateWindow = "DuplicateWindow"
	FieldHorizon         = "Horizon"
	FieldDetectsKeyReuse = "DetectsKeyReuse"
	// Journal suite: leases (exclusive, expiring, fenced, by one clock),
	// records (the first reference kept, keys exact), durability (a
	// restart and a crash keep what was recorded).
	FieldLeases     = "Leases"
	FieldRecords    = "Records"
	FieldDurability = "Durability"
	// Source suite: nothing unacked is lost, nothing acked comes back,
	// each Ordering in publish order.
	FieldDelivery = "Delivery"
	FieldAcks     = "Acks"
	FieldOrder    = "Order"
	// Plan suite: the composite contract names the weakest step; every
	// step is held to its own contract under faults.
	FieldPlanContract = "PlanContract"
	FieldSteps        = "Steps"
)

// Field is the verification of one field of a declared contract.
type Field struct {
	// Field is one of the Field constants of its suite ([FieldGuarantee],
	// [FieldLeases], ...).
	Field string
	// Declared is the declared value, in words.
	Declared string
	Status   FieldStatus
	// Why says, in words, which scenarios verified the field, which failed
	// it and which were left out.
	Why string
	// VerifiedBy lists the scenarios that ran and passed.
	VerifiedBy []string `json:",omitempty"`
	// LeftOut lists the scenarios that verify the field but did not
	// verify it here, each with why.
	LeftOut []LeftOut `json:",omitempty"`
	// Allowed is the reason the harness gave with [AllowUnverified] for a
	// field that is NotVerified; empty otherwise.
	Allowed string `json:",omitempty"`
}

// LeftOut is a scenario that did not verify a field, and why.
type LeftOut struct {
	Scenario string
	// Why is the reason: a missing capability, a selection, a reduced
	// size, or why the scenario does not apply.
	Why string
	// Fix says what the harness must give for the scenario to verify the
	// field; empty when nothing can (it does not apply, or go test -run
	// left it out).
	Fix string `json:",omitempty"`
	// Blocks is true when the field cannot be verified for this reason,
	// so that the strict Run functions fail unless [AllowUnverified]
	// says why; false for scenarios that do not apply to the subject, and
	// for those go test -run left out (a developer's local selection).
	Blocks bool `json:",omitempty"`
}

// String renders the field for the matrix, e.g.
// "NOT VERIFIED (0, until pruned): left out: horizon (harness does not implement conformance.Ager)",
// with the reason given to [AllowUnverified] after the declared value.
func (f Field) String() string {
	if f.Allowed != "" {
		return fmt.Sprintf("%s (%s), allowed unverified: %s: %s", f.Status, f.Declared, f.Allowed, f.Why)
	}
	return fmt.Sprintf("%s (%s): %s", f.Status, f.Declared, f.Why)
}

// blocked reports whether a reason that blocks verification left the
// field unverified.
func (f Field) blocked() bool {
	return f.Status == NotVerified && slices.ContainsFunc(f.LeftOut, func(l LeftOut) bool { return l.Blocks })
}

// judgeField derives one field's status from the rows of the scenarios
// whose records say they verify it.
func judgeField(field, declared string, table []scenarioRecord, byName map[string]Row) Field {
	f := Field{Field: field, Declared: declared}
	var failed []string
	for _, sc := range table {
		if !slices.Contains(sc.Verifies, field) {
			continue
		}
		r, ok := byName[sc.Name]
		switch {
		case !ok:
			f.LeftOut = append(f.LeftOut, LeftOut{Scenario: sc.Name, Why: "no row in the report", Blocks: true})
		case r.Verdict == Fail:
			failed = append(failed, sc.Name)
		case r.NotApplicable:
			f.LeftOut = append(f.LeftOut, LeftOut{Scenario: sc.Name, Why: r.Skipped})
		case r.Verdict == Pass && r.Reduced != "":
			f.LeftOut = append(f.LeftOut, LeftOut{Scenario: sc.Name, Why: "reduced: " + r.Reduced, Fix: r.Fix, Blocks: true})
		case r.Verdict == Pass && r.Unconfirmed != "":
			f.LeftOut = append(f.LeftOut, LeftOut{Scenario: sc.Name, Why: "unconfirmed: " + r.Unconfirmed, Fix: r.Fix, Blocks: true})
		case r.Verdict == Pass:
			f.VerifiedBy = append(f.VerifiedBy, sc.Name)
		default:
			f.LeftOut = append(f.LeftOut, LeftOut{Scenario: sc.Name, Why: r.Skipped, Fix: r.Fix, Blocks: r.Skipped != notSelectedRun})
		}
	}
	var missing, na []string
	for _, l := range f.LeftOut {
		if l.Blocks || l.Why == notSelectedRun {
			missing = append(missing, l.Scenario+" ("+l.Why+")")
		} else {
			na = append(na, l.Scenario+" ("+l.Why+")")
		}
	}
	switch {
	case len(failed) > 0:
		f.Status, f.Why = Failed, "failed in "+strings.Join(failed, ", ")
	case len(missing) > 0:
		f.Status, f.Why = NotVerified, "left out: "+strings.Join(missing, "; ")
		if len(f.VerifiedBy) > 0 {
			f.Why += "; passed " + strings.Join(f.VerifiedBy, ", ")
		}
	case len(f.VerifiedBy) == 0:
		f.Status, f.Why = NotApplicable, "no scenario applies: "+strings.Join(na, "; ")
	default:
		f.Status, f.Why = Verified, "passed "+strings.Join(f.VerifiedBy, ", ")
		if len(na) > 0 {
			f.Why += " (not applicable: " + strings.Join(na, "; ") + ")"
		}
	}
	return f
}

// effectFields derives, from the rows and the contract, what each field
// of an effect's contract came to.
func effectFields(c effects.Contract, table []scenarioRecord, rows []Row) []Field {
	byName := rowsByName(rows)
	window := "none"
	if c.Guarantee == effects.AtLeastOnce {
		window = c.DuplicateWindow.Trigger.String()
	}
	out := []Field{
		judgeField(FieldGuarantee, c.Guarantee.String(), table, byName),
		judgeField(FieldDuplicateWindow, window, table, byName),
	}
	horizon := declaredHorizon(c)
	switch {
	case c.Guarantee == effects.AtLeastOnce && c.DuplicateWindow.Trigger == effects.AnyRedelivery && c.Horizon == 0:
		out = append(out, Field{Field: FieldHorizon, Declared: horizon, Status: NotApplicable,
			Why: "nothing records keys: any redelivery may duplicate"})
	default:
		out = append(out, assumedHorizon(c, judgeField(FieldHorizon, horizon, table, byName), byName))
	}
	if c.DetectsKeyReuse {
		out = append(out, judgeField(FieldDetectsKeyReuse, "yes", table, byName))
	} else {
		out = append(out, Field{Field: FieldDetectsKeyReuse, Declared: "no", Status: NotApplicable, Why: "not claimed"})
	}
	return out
}

// declaredHorizon renders a contract's Horizon for the report: "0, until
// pruned", "24h0m0s", or "24h0m0s (assumed)" for a horizon the enforcer
// does not publish ([effects.Contract.HorizonAssumed]).
func declaredHorizon(c effects.Contract) string {
	switch {
	case c.Horizon == 0:
		return "0, until pruned"
	case c.HorizonAssumed:
		return c.Horizon.String() + " (assumed)"
	}
	return c.Horizon.String()
}

// assumedHorizon keeps an assumed horizon ([effects.Contract.HorizonAssumed])
// not verified unless the horizon scenario ran and verified it: no other
// scenario reaches the end of a retention nobody publishes.
func assumedHorizon(c effects.Contract, f Field, byName map[string]Row) Field {
	if !c.HorizonAssumed || f.Status != Verified || slices.Contains(f.VerifiedBy, ScenarioHorizon) {
		return f
	}
	why := "did not run"
	if r, ok := byName[ScenarioHorizon]; ok && r.Skipped != "" {
		why = r.Skipped
	}
	f.LeftOut = append(f.LeftOut, LeftOut{Scenario: ScenarioHorizon, Why: "the horizon is assumed (the enforcer publishes none), and only this scenario checks it: " + why,
		Fix: "give the harness an Ager that reaches the key store", Blocks: true})
	f.Status, f.Why = NotVerified, "assumed, and the horizon scenario did not verify it; passed "+strings.Join(f.VerifiedBy, ", ")
	return f
}

// suiteFieldsOf derives the fields of a journal, source or plan report,
// each declared as the suite's protocol.
func suiteFieldsOf(suite string, table []scenarioRecord, rows []Row) []Field {
	byName := rowsByName(rows)
	var out []Field
	for _, name := range suiteFields[suite] {
		out = append(out, judgeField(name, "the "+suite+" protocol", table, byName))
	}
	return out
}

func rowsByName(rows []Row) map[string]Row {
	m := make(map[string]Row, len(rows))
	for _, r := range rows {
		m[r.Scenario] = r
	}
	return m
}

// Verify reports whether the report meets the strict rule of the Run
// functions: every field of the declared contract verified, failed, not
// applicable, or left unverified only with the reason given to
// [AllowUnverified]. The error wraps [ErrUnverified] and names, per field,
// each scenario left out, why, and what to give the harness. Failed
// scenarios are not its concern ([Report.Failed]).
func (r Report) Verify() error {
	var lines, fixes []string
	if !slices.ContainsFunc(r.Rows, func(row Row) bool { return row.Verdict != NotRun }) {
		lines = append(lines, "  no scenario ran")
	}
	for _, f := range r.Fields {
		if !f.blocked() || f.Allowed != "" {
			continue
		}
		// Scenarios left out for the same reason are named together.
		var whys []string
		by := map[string][]string{}
		for _, l := range f.LeftOut {
			if !l.Blocks {
				continue
			}
			if _, ok := by[l.Why]; !ok {
				whys = append(whys, l.Why)
			}
			by[l.Why] = append(by[l.Why], l.Scenario)
			if l.Fix != "" && !slices.Contains(fixes, l.Fix) {
				fixes = append(fixes, l.Fix)
			}
		}
		var parts []string
		for _, w := range whys {
			parts = append(parts, strings.Join(by[w], ", ")+": "+w)
		}
		lines = append(lines, fmt.Sprintf("  %s (%s) rests on scenarios that did not verify it: %s", f.Field, f.Declared, strings.Join(parts, "; ")))
	}
	if len(lines) == 0 {
		return nil
	}
	for i, f := range fixes {
		fixes[i] = "  - " + f
	}
	return fmt.Errorf("conformance: %s: %w, so it is a claim, not a guarantee:\n%s\nto verify it:\n%s\n"+
		"(see docs/writing-an-adapter.md), or say why the harness cannot with conformance.AllowUnverified(\"reason\")",
		r.Adapter, ErrUnverified, strings.Join(lines, "\n"), strings.Join(fixes, "\n"))
}

// allow marks each blocked field of rep with the reason given to
// [AllowUnverified], when every scenario that blocks it is one the reason
// covers.
func allow(rep *Report) {
	if rep.Unverified == "" {
		return
	}
	for i := range rep.Fields {
		f := &rep.Fields[i]
		if !f.blocked() {
			continue
		}
		covered := len(rep.UnverifiedFor) == 0 || !slices.ContainsFunc(f.LeftOut, func(l LeftOut) bool {
			return l.Blocks && !slices.Contains(rep.UnverifiedFor, l.Scenario)
		})
		if covered {
			f.Allowed = rep.Unverified
		}
	}
}
