package conformance

import (
	"fmt"
	"strings"
)

// The four suites, as they appear in reports ([Report].Suite).
const (
	suiteEffect  = "effect"
	suiteJournal = "journal"
	suiteSource  = "source"
	suitePlan    = "plan"
)

// scenarioRecord is one scenario of a suite, as one record: everything the
// suite, its report and its documentation know about it. The fields a
// report verifies, the reasons a scenario did not run, the options a suite
// accepts and the tables of the package documentation and
// docs/conformance.md are derived from these records (catalog).
type scenarioRecord struct {
	// Suite is [SuiteEffect], [SuiteJournal], [SuiteSource] or [SuitePlan].
	Suite string
	// Name is the scenario's name: its subtest and its row in the report.
	Name string
	// Doc says in one line what the scenario does.
	Doc string
	// Needs names what the harness must give for the scenario to run (an
	// optional interface such as "conformance.Ager", or an option such as
	// "conformance.WithSlowReply"); empty when it always runs.
	Needs []string
	// Verifies names the fields of the declared contract the scenario can
	// falsify: each is verified only when every scenario that verifies it
	// ran (or does not apply to the subject) and passed.
	Verifies []string
	// Options names the options that tune the scenario.
	Options []string
	// Counterexamples names the types of package
	// effectively.dev/conformance/internal/counterexamples the scenario catches.
	Counterexamples []string
}

// scenario is one row of a suite's scenario table: its record, the
// capabilities it cannot run without, and what it does.
type scenario[H any] struct {
	scenarioRecord
	needs []capability
	run   func(c *checker, h H)
}

// rec builds a scenario of the table; the record's Needs come from needs.
func rec[H any](suite, name, doc string, needs []capability, verifies, options, proofs []string, run func(*checker, H)) scenario[H] {
	r := scenarioRecord{Suite: suite, Name: name, Doc: doc, Verifies: verifies, Options: options, Counterexamples: proofs}
	for _, c := range needs {
		r.Needs = append(r.Needs, c.name)
	}
	return scenario[H]{scenarioRecord: r, needs: needs, run: run}
}

// list is a shorthand for the string lists of a record.
func list(s ...string) []string { return s }

// capability is what a scenario needs of the harness or the options: an
// optional interface, an option, or both.
type capability struct {
	name string // as the report names it: "conformance.Ager"
	// missing returns why the scenario cannot run with h and cfg ("" when
	// it can) and what to give it; wrong returns a mistake in how the
	// harness offers the capability ("" when there is none), which fails
	// the scenario.
	missing func(h any, cfg *config) (why, fix string)
	wrong   func(h any, cfg *config) string
}

// iface is a capability that is an optional interface of the harness.
func iface[I any](name, fix string) capability {
	return capability{name: name, missing: func(h any, _ *config) (string, string) {
		if _, ok := h.(I); ok {
			return "", ""
		}
		return "harness does not implement " + name, fix
	}}
}

var (
	capAttacher = capability{name: "conformance.Attacher+WithSuccessorProcess",
		missing: func(h any, cfg *config) (string, string) {
			_, att := h.(Attacher)
			if !att && cfg.successor == nil {
				return "harness does not implement conformance.Attacher and WithSuccessorProcess was not given",
					"implement conformance.Attacher (Attachment() string: how a second process reaches the backend) and give conformance.WithSuccessorProcess(attach)"
			}
			return "", ""
		},
		wrong: func(h any, cfg *config) string {
			_, att := h.(Attacher)
			switch {
			case att && cfg.successor == nil:
				return "the harness implements conformance.Attacher but conformance.WithSuccessorProcess was not given: " +
					"the suite cannot build the harness in a child process; give the option with the attach function"
			case !att && cfg.successor != nil:
				return "conformance.WithSuccessorProcess was given but the harness does not implement conformance.Attacher: " +
					"the child process cannot be told how to reach the backend; implement Attachment() string"
			}
			return ""
		}}
	capRestarter = iface[Restarter]("conformance.Restarter",
		"implement conformance.Restarter (Restart(ctx): stop the backend cleanly and start it on the same data and address)")
	capAger = iface[Ager]("conformance.Ager",
		"implement conformance.Ager (Age(ctx, d): move the backend's clock, or its records' timestamps, d ahead)")
	capCrashRestarter = iface[CrashRestarter]("conformance.CrashRestarter",
		"implement conformance.CrashRestarter (CrashRestart(ctx): stop the backend at once, no clean shutdown, and start it again)")
	capSlowReply = capability{name: "conformance.WithSlowReply",
		missing: func(_ any, cfg *config) (string, string) {
			if cfg.slowReplySet {
				return "", ""
			}
			return "conformance.WithSlowReply was not given",
				"give conformance.WithSlowReply(d), d longer than the adapter's own per-call deadline"
		}}
	capClockSkewer = capability{name: "conformance.ClockSkewer",
		missing: func(h any, _ *config) (string, string) {
			if _, ok := h.(ClockSkewer); ok {
				return "", ""
			}
			return "harness does not implement conformance.ClockSkewer",
				"implement conformance.ClockSkewer (OpenSkewed: an instance whose clock runs ahead)"
		}}
)

// catalog returns every scenario of every suite, suite by suite in the
// order [Run], [RunJournal], [RunSource] and [RunPlan] run them.
func catalog() []scenarioRecord {
	var out []scenarioRecord
	for _, t := range [][]scenarioRecord{records(effectTable[struct{}]()), records(journalTable()), records(sourceTable()), records(planTable[struct{}]())} {
		out = append(out, t...)
	}
	return out
}

func records[H any](table []scenario[H]) []scenarioRecord {
	out := make([]scenarioRecord, len(table))
	for i, sc := range table {
		out[i] = sc.scenarioRecord
	}
	return out
}

func names[H any](table []scenario[H]) []string {
	out := make([]string, len(table))
	for i, sc := range table {
		out[i] = sc.Name
	}
	return out
}

// suiteFields lists each suite's fields, in report order.
var suiteFields = map[string][]string{
	suiteEffect:  {FieldGuarantee, FieldDuplicateWindow, FieldHorizon, FieldDetectsKeyReuse},
	suiteJournal: {FieldLeases, FieldRecords, FieldDurability},
	suiteSource:  {FieldDelivery, FieldAcks, FieldOrder},
	suitePlan:    {FieldPlanContract, FieldSteps},
}

// scenarioTable renders the records of suite as the Markdown table that
// the package documentation and docs/conformance.md show: scenario, what
// it does, what it needs, what it verifies, the counterexamples it
// catches. A test keeps the documents equal to it.
func scenarioTable(suite string) string {
	var b strings.Builder
	b.WriteString("| scenario | what it does | needs | verifies | catches |\n|---|---|---|---|---|\n")
	for _, r := range catalog() {
		if r.Suite != suite {
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.Name, cell(r.Doc), orDash(codes(r.Needs)), orDash(strings.Join(r.Verifies, ", ")), orDash(strings.Join(r.Counterexamples, ", ")))
	}
	return b.String()
}

func codes(xs []string) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = "`" + x + "`"
	}
	return strings.Join(out, ", ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
