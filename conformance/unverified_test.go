package conformance_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"effectively.dev/conformance"
	"effectively.dev/effects"
)

// unwiredHarness builds the Ledger with a plain dialer: none of its round
// trips goes through the suite's Faults, so no fault can fire.
type unwiredHarness struct{ *ledgerHarness }

func (h unwiredHarness) Make(context.Context, *conformance.Faults) (effects.Effect[Entry], func(), error) {
	var d net.Dialer
	return &Ledger{addr: h.srv.Addr(), dial: d.DialContext}, nil, nil
}

func unwiredMaker(t testing.TB) conformance.Harness[Entry] {
	return unwiredHarness{&ledgerHarness{srv: startLedger(t, 0)}}
}

// unverifiedChild is the environment variable under which
// TestUnverifiedChild runs: as the child of TestRunFailsWhenUnverified.
const unverifiedChild = "CONFORMANCE_TEST_UNVERIFIED_CHILD"

// TestUnverifiedChild is conformance.Run on a harness whose faults never
// fire; it runs only as TestRunFailsWhenUnverified's child, which expects
// it to fail.
func TestUnverifiedChild(t *testing.T) {
	if os.Getenv(unverifiedChild) == "" {
		t.Skip("run by TestRunFailsWhenUnverified")
	}
	offMatrix(t)
	conformance.Run(t, "ledger dialling around the faults", unwiredMaker,
		conformance.Only(conformance.ScenarioRedelivery, conformance.ScenarioLostReply))
}

// TestRunFailsWhenUnverified: Run on a harness whose faults never fire
// fails the test, naming the fields it could not verify and the option
// that would allow it; every scenario that ran passed, so nothing else
// fails it.
func TestRunFailsWhenUnverified(t *testing.T) {
	if os.Getenv(unverifiedChild) != "" {
		t.Skip("the child runs TestUnverifiedChild only")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestUnverifiedChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), unverifiedChild+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("Run passed on a harness whose faults never fire:\n%s", out)
	}
	for _, want := range []string{
		"cannot be verified", "Guarantee (effectively-once)", "lost-reply: the adapter made no round trip",
		"f.RoundTrip", `conformance.AllowUnverified("reason")`,
		"unverified_test.go:", // the failure points at the harness's call of Run
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the failure does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "--- FAIL: TestUnverifiedChild/") {
		t.Errorf("a scenario failed; only the unverified contract should:\n%s", out)
	}
}

// TestAllowUnverified: with a reason the same run passes, and each field
// that could not be verified carries the reason, in the report and the
// matrix, fields left out by Only included (Only is no reason by itself).
func TestAllowUnverified(t *testing.T) {
	offMatrix(t)
	const why = "the ledger client has no dialer to hook"
	rep := conformance.Run(t, "ledger dialling around the faults", unwiredMaker,
		conformance.Only(conformance.ScenarioRedelivery, conformance.ScenarioLostReply),
		conformance.AllowUnverified(why))
	g, _ := rep.Field("Guarantee")
	if g.Status != conformance.NotVerified || g.Allowed != why {
		t.Errorf("Guarantee: %+v, want not verified, allowed for %q", g, why)
	}
	if !strings.Contains(rep.Markdown(), "NOT VERIFIED, allowed: "+why) {
		t.Errorf("the matrix does not show the reason:\n%s", rep.Markdown())
	}
	if k, _ := rep.Field("DetectsKeyReuse"); k.Status != conformance.NotVerified || k.Allowed != why {
		t.Errorf("DetectsKeyReuse: %+v; left out by Only, it is not verified, allowed only for the reason given", k)
	}
	if err := rep.Verify(); err != nil {
		t.Errorf("Verify with AllowUnverified: %v", err)
	}
	row, _ := rep.Row(conformance.ScenarioLostReply)
	if row.Verdict != conformance.NotRun || row.Effects() != "-" {
		t.Errorf("lost-reply: %s, effects %q; want not run, shown as -", row.Verdict, row.Effects())
	}
}

// TestRaceWindowNotWidened: when the racers' round trips bypass the
// Faults, the concurrency scenarios say their race window was not
// widened.
func TestRaceWindowNotWidened(t *testing.T) {
	offMatrix(t)
	rep := conformance.Run(t, "ledger dialling around the faults", unwiredMaker,
		conformance.Only(conformance.ScenarioConcurrent, conformance.ScenarioRaceReuse), conformance.ReportOnly())
	for _, s := range []string{conformance.ScenarioConcurrent, conformance.ScenarioRaceReuse} {
		row, _ := rep.Row(s)
		if !strings.Contains(strings.Join(row.Notes, "\n"), "race window not widened") {
			t.Errorf("%s: notes %v do not say the race window was not widened", s, row.Notes)
		}
	}
	rep = conformance.Run(t, "ledger", ledgerMaker(0), conformance.Only(conformance.ScenarioConcurrent), conformance.ReportOnly())
	if row, _ := rep.Row(conformance.ScenarioConcurrent); strings.Contains(strings.Join(row.Notes, "\n"), "not widened") {
		t.Errorf("concurrent-duplicates through the Faults: notes %v say the window was not widened", row.Notes)
	}
}

// verifiedBut requires every field of rep to be verified or not
// applicable, except fields left unverified, with the reason given to
// AllowUnverified, by the scenarios named in but and no other.
func verifiedBut(t *testing.T, rep conformance.Report, but ...string) {
	t.Helper()
	if len(rep.Fields) == 0 {
		t.Fatalf("%s: no fields in the report", rep.Adapter)
	}
	for _, f := range rep.Fields {
		switch f.Status {
		case conformance.Verified, conformance.NotApplicable:
			continue
		case conformance.NotVerified:
			if f.Allowed == "" {
				t.Errorf("field %s: not verified and not allowed", f)
			}
			for _, l := range f.LeftOut {
				if l.Blocks && !slices.Contains(but, l.Scenario) {
					t.Errorf("field %s: %s left out (%s), want only %v", f.Field, l.Scenario, l.Why, but)
				}
			}
		default:
			t.Errorf("field %s", f)
		}
	}
}
