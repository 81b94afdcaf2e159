package conformance_test

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/effects"
)

// honestFields checks the rule the matrix rests on: a field reported
// verified has every scenario that verifies it (by its record) in the
// report as passed at full size, or as not applicable; none that did not
// run.
func honestFields(t *testing.T, rep conformance.Report) {
	t.Helper()
	suite := rep.Suite
	if suite == "" {
		suite = conformance.SuiteEffect
	}
	for _, f := range rep.Fields {
		if f.Status != conformance.Verified {
			continue
		}
		for _, sc := range conformance.Catalog() {
			if sc.Suite != suite || !slices.Contains(sc.Verifies, f.Field) {
				continue
			}
			row, ok := rep.Row(sc.Name)
			switch {
			case !ok:
				t.Errorf("%s verified, but %s is not in the report", f.Field, sc.Name)
			case row.NotApplicable:
			case row.Verdict != conformance.Pass || row.Reduced != "":
				t.Errorf("%s verified, but %s, which verifies it, is %s %s", f.Field, sc.Name, row.Verdict, row.Reduced)
			}
		}
	}
}

// TestStrictSlowReplyLiar: the ledger that reports its own deadline as
// ErrTransient, run with every capability but WithSlowReply, passes every
// scenario that runs; the strict rule still rejects it: the guarantee
// cannot be verified, and the failure names slow-reply and the option.
// With the option it is caught (TestSlowReplyCatchesTimeoutAsTransient).
func TestStrictSlowReplyLiar(t *testing.T) {
	offMatrix(t)
	mk := func(t testing.TB) conformance.Harness[Entry] {
		return ledgerVariant{&ledgerHarness{srv: startLedger(t, 0)}, func(l *Ledger) effects.Effect[Entry] {
			return deadlineLedger{l, true, 5 * time.Second} // above any wait of a loaded machine: only a held reply outlasts it
		}, 0}
	}
	rep := conformance.Run(t, "ledger: its own deadline as ErrTransient, without WithSlowReply", mk,
		conformance.WithLateRedelivery(time.Second), conformance.WithSuccessorProcess(attachLedger), conformance.ReportOnly())
	if failed := rep.Failed(); len(failed) > 0 {
		t.Errorf("scenarios failed %v: the lie shows only under a slow reply", failed)
	}
	err := rep.Verify()
	if !errors.Is(err, conformance.ErrUnverified) {
		t.Fatalf("Verify = %v, want ErrUnverified", err)
	}
	for _, want := range []string{"slow-reply: conformance.WithSlowReply was not given", "give conformance.WithSlowReply(d)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the failure does not say %q:\n%v", want, err)
		}
	}
	g, _ := rep.Field(conformance.FieldGuarantee)
	blocking := slices.DeleteFunc(slices.Clone(g.LeftOut), func(l conformance.LeftOut) bool { return !l.Blocks })
	if g.Status != conformance.NotVerified || len(blocking) != 1 || blocking[0].Scenario != conformance.ScenarioSlowReply {
		t.Errorf("Guarantee: %s, left out %v; want not verified for slow-reply alone", g, g.LeftOut)
	}
	honestFields(t, rep)
}

// strictChild is the environment variable under which TestStrictChild
// runs a strict Run, as the child of a test that expects it to fail.
const strictChild = "CONFORMANCE_TEST_STRICT_CHILD"

// TestStrictChild runs conformance.Run as the child of TestOnlyNeverPasses
// and TestReducedCapacityFailsRun; it is skipped otherwise.
func TestStrictChild(t *testing.T) {
	mode := os.Getenv(strictChild)
	if mode == "" {
		t.Skip("run by the tests of the strict rule")
	}
	offMatrix(t)
	switch mode {
	case "only":
		conformance.Run(t, "ledger", ledgerMaker(0), conformance.Only(conformance.ScenarioRedelivery))
	case "capacity":
		conformance.Run(t, "ledger", ledgerMaker(0), conformance.Only(conformance.ScenarioKeyCapacity), conformance.WithCapacity(1))
	}
}

// runStrictChild runs TestStrictChild in mode and returns its output; the
// child must fail.
func runStrictChild(t *testing.T, mode string) string {
	t.Helper()
	if os.Getenv(strictChild) != "" {
		t.Skip("a child runs TestStrictChild only")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestStrictChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), strictChild+"="+mode)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the strict Run passed (%s):\n%s", mode, out)
	}
	if strings.Contains(string(out), "--- FAIL: TestStrictChild/") {
		t.Errorf("a scenario failed; only the unverified contract should:\n%s", out)
	}
	return string(out)
}

// TestOnlyNeverPasses: a strict Run whose Only leaves out scenarios that
// verify a field fails, every scenario that ran having passed.
func TestOnlyNeverPasses(t *testing.T) {
	out := runStrictChild(t, "only")
	for _, want := range []string{"cannot be verified", "not selected (Only)", "leave it out of Only", `conformance.AllowUnverified("reason")`} {
		if !strings.Contains(out, want) {
			t.Errorf("the failure does not say %q:\n%s", want, out)
		}
	}
}

// TestReducedCapacityFailsRun: WithCapacity below defaultCapacity runs
// key-capacity reduced: it passes, the report says so, the fields it
// verifies are not verified, and a strict Run fails naming it.
func TestReducedCapacityFailsRun(t *testing.T) {
	out := runStrictChild(t, "capacity")
	if !strings.Contains(out, "key-capacity: reduced: WithCapacity(1) is below defaultCapacity (5000)") {
		t.Errorf("the failure does not name the reduced capacity:\n%s", out)
	}
	offMatrix(t)
	rep := conformance.Run(t, "ledger", ledgerMaker(0), conformance.Only(conformance.ScenarioKeyCapacity), conformance.WithCapacity(1), conformance.ReportOnly())
	row, _ := rep.Row(conformance.ScenarioKeyCapacity)
	if row.Verdict != conformance.Pass || !strings.Contains(row.Reduced, "WithCapacity(1)") {
		t.Errorf("key-capacity: %s, reduced %q; want pass, reduced", row.Verdict, row.Reduced)
	}
	if !strings.Contains(rep.Markdown(), "reduced: WithCapacity(1)") {
		t.Errorf("the matrix does not say the scenario ran reduced:\n%s", rep.Markdown())
	}
	for _, name := range []string{conformance.FieldGuarantee, conformance.FieldHorizon, conformance.FieldDetectsKeyReuse} {
		f, _ := rep.Field(name)
		if f.Status != conformance.NotVerified || !slices.ContainsFunc(f.LeftOut, func(l conformance.LeftOut) bool {
			return l.Scenario == conformance.ScenarioKeyCapacity && l.Blocks && strings.HasPrefix(l.Why, "reduced: ")
		}) {
			t.Errorf("%s: %s; want key-capacity left out as reduced", name, f)
		}
	}
	honestFields(t, rep)
}

// TestAttacherWithoutOption: a harness that implements Attacher without
// WithSuccessorProcess, or the option without Attacher, fails the
// successor-process scenario; with neither it is not run, and the fix
// names both.
func TestAttacherWithoutOption(t *testing.T) {
	offMatrix(t)
	only := conformance.Only(conformance.ScenarioProcess)
	hidden := func(t testing.TB) conformance.Harness[Entry] {
		return struct{ conformance.Harness[Entry] }{&ledgerHarness{srv: startLedger(t, 0)}}
	}
	for _, c := range []struct {
		name string
		mk   conformance.Maker[Entry]
		opts []conformance.EffectOption
		want conformance.Verdict
		says string
	}{
		{"Attacher without the option", ledgerMaker(0), nil, conformance.Fail, "implements conformance.Attacher but conformance.WithSuccessorProcess was not given"},
		{"the option without Attacher", hidden, []conformance.EffectOption{conformance.WithSuccessorProcess(attachLedger)}, conformance.Fail,
			"conformance.WithSuccessorProcess was given but the harness does not implement conformance.Attacher"},
		{"neither", hidden, nil, conformance.NotRun, "implement conformance.Attacher"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep := conformance.Run(t, "ledger: "+c.name, c.mk, append(append(c.opts, only), conformance.ReportOnly())...)
			row, _ := rep.Row(conformance.ScenarioProcess)
			got := strings.Join(append(row.Failures, row.Fix), "\n")
			if row.Verdict != c.want || !strings.Contains(got, c.says) {
				t.Errorf("successor-process: %s %q; want %s saying %q", row.Verdict, got, c.want, c.says)
			}
		})
	}
}

// TestScenarioRecords: every record names its suite, says what it does,
// verifies fields of its own suite, and names counterexamples that exist
// in package counterexamples.
func TestScenarioRecords(t *testing.T) {
	fields := map[string][]string{
		conformance.SuiteEffect:  {conformance.FieldGuarantee, conformance.FieldDuplicateWindow, conformance.FieldHorizon, conformance.FieldDetectsKeyReuse},
		conformance.SuiteJournal: {conformance.FieldLeases, conformance.FieldRecords, conformance.FieldDurability},
		conformance.SuiteSource:  {conformance.FieldDelivery, conformance.FieldAcks, conformance.FieldOrder},
		conformance.SuitePlan:    {conformance.FieldPlanContract, conformance.FieldSteps},
	}
	exported := map[string]bool{}
	pkgs, err := parser.ParseDir(token.NewFileSet(), "internal/counterexamples", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pkgs {
		for _, f := range p.Files {
			for name, obj := range f.Scope.Objects {
				if ast.IsExported(name) && (obj.Kind == ast.Typ || obj.Kind == ast.Var || obj.Kind == ast.Fun) {
					exported[name] = true
				}
			}
		}
	}
	names := map[string]map[string]bool{}
	for _, sc := range conformance.Catalog() {
		if names[sc.Suite] == nil {
			names[sc.Suite] = map[string]bool{}
		}
		if names[sc.Suite][sc.Name] {
			t.Errorf("%s suite: scenario %s twice", sc.Suite, sc.Name)
		}
		names[sc.Suite][sc.Name] = true
		if sc.Doc == "" {
			t.Errorf("%s/%s: no doc line", sc.Suite, sc.Name)
		}
		for _, f := range sc.Verifies {
			if !slices.Contains(fields[sc.Suite], f) {
				t.Errorf("%s/%s verifies %q, not a field of its suite", sc.Suite, sc.Name, f)
			}
		}
		for _, c := range sc.Counterexamples {
			if !exported[c] {
				t.Errorf("%s/%s names counterexample %s, which package counterexamples does not declare", sc.Suite, sc.Name, c)
			}
		}
	}
	for suite, want := range map[string][]string{conformance.SuiteEffect: conformance.Scenarios, conformance.SuiteJournal: conformance.JournalScenarios,
		conformance.SuiteSource: conformance.SourceScenarios, conformance.SuitePlan: conformance.PlanScenarios} {
		if len(names[suite]) != len(want) {
			t.Errorf("%s suite: %d records, %d scenario names", suite, len(names[suite]), len(want))
		}
	}
}

// TestAllowUnverifiedScoped: a reason that names scenarios covers only
// the fields those scenarios alone leave unverified.
func TestAllowUnverifiedScoped(t *testing.T) {
	offMatrix(t)
	noAger := func(t testing.TB) conformance.Harness[Entry] {
		return struct{ conformance.Harness[Entry] }{&ledgerHarness{srv: startLedger(t, 0)}}
	}
	var others []string
	for _, s := range conformance.Scenarios {
		if s != conformance.ScenarioRedelivery && s != conformance.ScenarioHorizon {
			others = append(others, s)
		}
	}
	only := conformance.Only(conformance.ScenarioRedelivery, conformance.ScenarioHorizon)
	rep := conformance.Run(t, "ledger without Ager", noAger, only, conformance.AllowUnverified("no clock to move", conformance.ScenarioHorizon), conformance.ReportOnly())
	if err := rep.Verify(); !errors.Is(err, conformance.ErrUnverified) || !strings.Contains(err.Error(), "not selected (Only)") {
		t.Errorf("a reason for horizon alone excused the scenarios Only left out: %v", err)
	}
	rep = conformance.Run(t, "ledger without Ager", noAger, only,
		conformance.AllowUnverified("this test runs two scenarios and has no clock to move", append(others, conformance.ScenarioHorizon)...), conformance.ReportOnly())
	if err := rep.Verify(); err != nil {
		t.Errorf("every blocking scenario named: %v", err)
	}
	if h, _ := rep.Field(conformance.FieldHorizon); h.Allowed == "" {
		t.Errorf("Horizon: %s, want allowed", h)
	}
}
