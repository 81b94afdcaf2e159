package conformance

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"effectively.dev/effects"
)

// Verdict is a scenario's outcome.
type Verdict int

const (
	// NotRun: the scenario did not run (not selected, or the harness cannot
	// support it), or ran without making a single check. Never counted as
	// passed.
	NotRun Verdict = iota
	// Pass: every check held against the declared contract.
	Pass
	// Fail: at least one check broke the declared contract.
	Fail
)

// String returns "not run", "pass" or "FAIL".
func (v Verdict) String() string {
	switch v {
	case Pass:
		return "pass"
	case Fail:
		return "FAIL"
	}
	return "not run"
}

// MarshalText renders the verdict for JSON reports.
func (v Verdict) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText parses a verdict written by MarshalText.
func (v *Verdict) UnmarshalText(b []byte) error {
	switch string(b) {
	case "pass":
		*v = Pass
	case "FAIL":
		*v = Fail
	case "not run":
		*v = NotRun
	default:
		return fmt.Errorf("conformance: unknown verdict %q", b)
	}
	return nil
}

// Row is one scenario's result. Its Verdict is derived from what the
// scenario recorded, in one place: any failed check makes it Fail; a
// scenario that was skipped, or made no check at all, is NotRun; otherwise
// it is Pass.
type Row struct {
	Scenario string
	Verdict  Verdict
	// Checks is how many assertions the scenario made.
	Checks int
	// Counted is how many times the scenario counted a key's effects in
	// the backend; MinEffects and MaxEffects are the fewest and most
	// effects one count saw.
	Counted, MinEffects, MaxEffects int
	// Failures says which checks broke the contract, and how.
	Failures []string `json:",omitempty"`
	// Notes records what was done.
	Notes []string `json:",omitempty"`
	// Skipped says why the scenario did not run, if it did not.
	Skipped string `json:",omitempty"`
	// Fix says what the harness must give for a scenario that did not
	// run, ran reduced or passed unconfirmed, to verify its fields.
	Fix string `json:",omitempty"`
	// NotApplicable is true for a scenario that did not run because it
	// does not apply to the subject (what it checks is not claimed): its
	// fields rest on the other scenarios.
	NotApplicable bool `json:",omitempty"`
	// Reduced says why a scenario that passed ran smaller than the
	// suite's default ([WithCapacity] below 5,000): the
	// fields it verifies are not verified.
	Reduced string `json:",omitempty"`
	// Unconfirmed says why a scenario that passed verifies none of its
	// fields: what it checked held, but the harness did not show that the
	// check could fail (the horizon scenario's Age changed nothing the
	// backend reads).
	Unconfirmed string `json:",omitempty"`

	contract *effects.Contract // the effect's declared contract, once learned
}

// rowMu guards rows that checks on several goroutines write.
var rowMu sync.Mutex

func (r *Row) checked() {
	rowMu.Lock()
	defer rowMu.Unlock()
	r.Checks++
}

func (r *Row) fail(msg string) {
	rowMu.Lock()
	defer rowMu.Unlock()
	r.Checks++
	r.Failures = append(r.Failures, msg)
}

func (r *Row) note(msg string) {
	rowMu.Lock()
	defer rowMu.Unlock()
	r.Notes = append(r.Notes, msg)
}

func (r *Row) skip(why string) {
	rowMu.Lock()
	defer rowMu.Unlock()
	r.Skipped = why
}

// unconfirmed marks a passing row as verifying none of its fields, with
// why and what the harness must give.
func (r *Row) unconfirmed(why, fix string) {
	rowMu.Lock()
	defer rowMu.Unlock()
	r.Unconfirmed, r.Fix = why, fix
}

func (r *Row) observe(n int) {
	rowMu.Lock()
	defer rowMu.Unlock()
	if r.Counted == 0 || n < r.MinEffects {
		r.MinEffects = n
	}
	if r.Counted == 0 || n > r.MaxEffects {
		r.MaxEffects = n
	}
	r.Counted++
}

// settle derives the verdict from the checks.
func (r *Row) settle() {
	switch {
	case len(r.Failures) > 0:
		r.Verdict = Fail
	case r.Skipped != "":
		r.Verdict = NotRun
	case r.Checks == 0:
		r.Verdict = NotRun
		r.Skipped = "the scenario made no check"
	default:
		r.Verdict = Pass
	}
}

// Effects renders what the backend showed, e.g. "1 per key (17 counts)",
// or "-" for a row that did not run (whatever it counted before it
// stopped verified nothing).
func (r Row) Effects() string {
	switch {
	case r.Counted == 0 || r.Verdict == NotRun:
		return "-"
	case r.MinEffects == r.MaxEffects:
		return fmt.Sprintf("%d per key (%d counts)", r.MinEffects, r.Counted)
	}
	return fmt.Sprintf("%d-%d per key (%d counts)", r.MinEffects, r.MaxEffects, r.Counted)
}

// Report is one subject's results across a suite's scenarios: an adapter's
// ([Run]), a journal's ([RunJournal]) or a source's ([RunSource]).
type Report struct {
	// Suite is "effect", "journal", "source" or "plan".
	Suite string
	// Adapter names the subject under test.
	Adapter string
	// Contract is the effect's declared contract (effect suite only).
	Contract effects.Contract
	Rows     []Row
	// Fields says, per field of the declared contract (for a journal,
	// source or plan, of the suite's protocol), whether the scenarios
	// verified it, which did, and which were left out and why.
	Fields []Field `json:",omitempty"`
	// Evaluated is true for reports made with [ReportOnly], whose
	// failures do not fail a test: counterexamples, listed apart in the
	// matrix.
	Evaluated bool
	// Unverified is the reason the harness gave with [AllowUnverified]
	// for fields it cannot verify; the matrix shows it beside them.
	Unverified string `json:",omitempty"`
	// UnverifiedFor lists the scenarios the reason covers; empty: every
	// one.
	UnverifiedFor []string `json:",omitempty"`
}

// Row returns the row of the named scenario.
func (r Report) Row(scenario string) (Row, bool) {
	for _, row := range r.Rows {
		if row.Scenario == scenario {
			return row, true
		}
	}
	return Row{}, false
}

// Failed returns the names of the scenarios that failed.
func (r Report) Failed() []string {
	var out []string
	for _, row := range r.Rows {
		if row.Verdict == Fail {
			out = append(out, row.Scenario)
		}
	}
	return out
}

// Field returns the verification of the named field ([FieldGuarantee],
// [FieldLeases], ...; an effect's Enforcer is a description, not
// verified).
func (r Report) Field(name string) (Field, bool) {
	for _, f := range r.Fields {
		if f.Field == name {
			return f, true
		}
	}
	return Field{}, false
}

// Markdown renders the report as rows of the matrix table, with a header,
// followed for an effect by its contract fields' verification.
func (r Report) Markdown() string {
	var b strings.Builder
	b.WriteString(header(r.Suite))
	b.WriteString(r.markdownRows())
	if len(r.Fields) > 0 {
		b.WriteString("\n" + fieldsHeader + r.fieldsRows())
	}
	return b.String()
}

// matrixHeader is the header of the Markdown matrix of effect adapters.
const matrixHeader = "| adapter | contract | scenario | effects observed | verdict | notes |\n|---|---|---|---|---|---|\n"

// fieldsHeader is the header of the Markdown table that says, per subject
// and field of its declared contract, whether the scenarios verified it,
// which did, and which were left out and why.
const fieldsHeader = "| subject | field | declared | status | verified by | left out (why) |\n|---|---|---|---|---|---|\n"

// subjectHeader is the header of the journal and source matrices.
const subjectHeader = "| %s | scenario | checks | verdict | notes |\n|---|---|---|---|---|\n"

func header(suite string) string {
	switch suite {
	case suiteJournal, suiteSource, suitePlan:
		return fmt.Sprintf(subjectHeader, suite)
	}
	return matrixHeader
}

func (r Report) markdownRows() string {
	var b strings.Builder
	for _, row := range r.Rows {
		if r.Evaluated && row.Verdict == NotRun && strings.HasPrefix(row.Skipped, "not selected") {
			continue // a counterexample is run only where it is caught
		}
		notes := append(append([]string(nil), row.Failures...), row.Notes...)
		if row.Reduced != "" {
			notes = append([]string{"reduced: " + row.Reduced}, notes...)
		}
		if row.Unconfirmed != "" {
			notes = append([]string{"unconfirmed: " + row.Unconfirmed}, notes...)
		}
		if row.Skipped != "" {
			notes = append([]string{row.Skipped}, notes...)
		}
		switch r.Suite {
		case suiteJournal, suiteSource, suitePlan:
			fmt.Fprintf(&b, "| %s | %s | %d | %s | %s |\n", cell(r.Adapter), row.Scenario, row.Checks, row.Verdict, cell(strings.Join(notes, "; ")))
		default:
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", cell(r.Adapter), r.contractCell(), row.Scenario,
				row.Effects(), row.Verdict, cell(strings.Join(notes, "; ")))
		}
	}
	return b.String()
}

func (r Report) fieldsRows() string {
	var b strings.Builder
	for _, f := range r.Fields {
		status := string(f.Status)
		if f.Allowed != "" {
			status += ", allowed: " + f.Allowed
		}
		var left []string
		for _, l := range f.LeftOut {
			left = append(left, l.Scenario+" ("+l.Why+")")
		}
		why := strings.Join(left, "; ")
		if f.Status == NotApplicable && len(f.LeftOut) == 0 {
			why = f.Why
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", cell(r.Adapter), f.Field, cell(f.Declared), cell(status),
			orDash(strings.Join(f.VerifiedBy, ", ")), orDash(cell(why)))
	}
	return b.String()
}

func (r Report) contractCell() string {
	c := r.Contract
	s := c.Guarantee.String()
	if c.Guarantee == effects.AtLeastOnce {
		s += ", duplicates " + c.DuplicateWindow.Trigger.String() + ": " + c.DuplicateWindow.Between
	}
	if c.Horizon > 0 {
		s += ", horizon " + declaredHorizon(c)
	}
	return cell(s)
}

func cell(s string) string {
	s = strings.ReplaceAll(s, "|", "\\|")
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 400 {
		s = s[:400] + "..."
	}
	return s
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// WriteFile writes the report as dir/<suite>-<adapter>.json, to be merged
// into a matrix by [MergeMatrix].
func (r Report) WriteFile(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	suite := r.Suite
	if suite == "" {
		suite = suiteEffect
	}
	return os.WriteFile(filepath.Join(dir, unsafeName.ReplaceAllString(suite+"-"+r.Adapter, "_")+".json"), b, 0o644)
}

// reportEnv names the environment variable that, when set to a directory,
// makes the Run functions write each report there.
const reportEnv = "CONFORMANCE_REPORT"

func (r Report) writeEnv() error {
	dir := os.Getenv(reportEnv)
	if dir == "" {
		return nil
	}
	return r.WriteFile(dir)
}

// MergeMatrix reads every report written into dir and renders the Markdown
// matrix, subjects in name order: the effect adapters held to their
// contract by [Run], the verification of each adapter's contract fields,
// the journals and sources held by [RunJournal] and [RunSource], then,
// under their own heading, the reports made with [ReportOnly]
// (counterexamples, which must fail). failed reports whether any scenario
// of a report held to its contract failed, or any such report has a
// field that cannot be verified ([Report.Verify]).
func MergeMatrix(dir string) (table string, failed bool, err error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return "", false, err
	}
	sort.Strings(paths)
	var reports []Report
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return "", false, err
		}
		var r Report
		if err := json.Unmarshal(data, &r); err != nil {
			return "", false, fmt.Errorf("%s: %w", p, err)
		}
		if r.Suite == "" {
			r.Suite = suiteEffect
		}
		reports = append(reports, r)
		if !r.Evaluated {
			failed = failed || len(r.Failed()) > 0 || r.Verify() != nil
		}
	}
	if len(reports) == 0 {
		return "", false, fmt.Errorf("conformance: no reports in %s", dir)
	}
	var b strings.Builder
	section := func(title string, suite string, evaluated bool, rows func(Report) string, head string) {
		var body strings.Builder
		for _, r := range reports {
			if r.Suite == suite && r.Evaluated == evaluated {
				body.WriteString(rows(r))
			}
		}
		if body.Len() == 0 {
			return
		}
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		b.WriteString("### " + title + "\n\n" + head + body.String())
	}
	section("Adapters (held to their declared contract)", suiteEffect, false, Report.markdownRows, matrixHeader)
	section("Contract fields: verified or not, per adapter", suiteEffect, false, Report.fieldsRows, fieldsHeader)
	section("Journals (RunJournal)", suiteJournal, false, Report.markdownRows, header(suiteJournal))
	section("Journal fields", suiteJournal, false, Report.fieldsRows, fieldsHeader)
	section("Sources (RunSource)", suiteSource, false, Report.markdownRows, header(suiteSource))
	section("Source fields", suiteSource, false, Report.fieldsRows, fieldsHeader)
	section("Plans (RunPlan)", suitePlan, false, Report.markdownRows, header(suitePlan))
	section("Plan fields", suitePlan, false, Report.fieldsRows, fieldsHeader)
	section("Counterexamples (each must FAIL in a named scenario)", suiteEffect, true, Report.markdownRows, matrixHeader)
	section("Counterexample journals (each must FAIL in a named scenario)", suiteJournal, true, Report.markdownRows, header(suiteJournal))
	section("Counterexample sources (each must FAIL in a named scenario)", suiteSource, true, Report.markdownRows, header(suiteSource))
	section("Counterexample plans (each must FAIL in a named scenario)", suitePlan, true, Report.markdownRows, header(suitePlan))
	return b.String(), failed, nil
}
