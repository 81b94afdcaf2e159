package conformance

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"effectively.dev/effects"
)

// Verdict is a scenario's outcome.
type Verdict int

const (
	// NotRun: the scenario did not run (not selected, or the harness cannot
	// support it). Never counted as passed.
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

// Row is one scenario's result.
type Row struct {
	Scenario string
	Verdict  Verdict
	// Checks is how many times the scenario counted a key's effects in the
	// backend; MinEffects and MaxEffects are the fewest and most effects one
	// check saw.
	Checks, MinEffects, MaxEffects int
	// Failures says which checks broke the contract, and how.
	Failures []string `json:",omitempty"`
	// Notes records what was done and why a scenario was not run.
	Notes []string `json:",omitempty"`

	contract *effects.Contract
}

func (r *Row) observe(n int) {
	if r.Checks == 0 || n < r.MinEffects {
		r.MinEffects = n
	}
	if r.Checks == 0 || n > r.MaxEffects {
		r.MaxEffects = n
	}
	r.Checks++
}

// Effects renders what the backend showed, e.g. "1 per key (17 checks)".
func (r Row) Effects() string {
	switch {
	case r.Checks == 0:
		return "-"
	case r.MinEffects == r.MaxEffects:
		return fmt.Sprintf("%d per key (%d checks)", r.MinEffects, r.Checks)
	}
	return fmt.Sprintf("%d-%d per key (%d checks)", r.MinEffects, r.MaxEffects, r.Checks)
}

// Report is one adapter's results across the scenarios.
type Report struct {
	Adapter  string
	Contract effects.Contract
	Rows     []Row
	// Evaluated is true for reports made by [Evaluate], whose failures do
	// not fail a test: counterexamples, listed apart in the matrix.
	Evaluated bool
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

// Markdown renders the report as rows of the matrix table (adapter ×
// scenario → effects observed, verdict), with a header.
func (r Report) Markdown() string {
	var b strings.Builder
	b.WriteString(MatrixHeader)
	b.WriteString(r.markdownRows())
	return b.String()
}

// MatrixHeader is the header of the Markdown matrix.
const MatrixHeader = "| adapter | contract | scenario | effects observed | verdict | notes |\n|---|---|---|---|---|---|\n"

func (r Report) markdownRows() string {
	var b strings.Builder
	for _, row := range r.Rows {
		notes := append(append([]string(nil), row.Failures...), row.Notes...)
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.Adapter, r.contractCell(), row.Scenario,
			row.Effects(), row.Verdict, cell(strings.Join(notes, "; ")))
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
		s += ", horizon " + c.Horizon.String()
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

// WriteFile writes the report as dir/<adapter>.json, to be merged into a
// matrix by [MergeMatrix].
func (r Report) WriteFile(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, unsafeName.ReplaceAllString(r.Adapter, "_")+".json"), b, 0o644)
}

// ReportEnv names the environment variable that, when set to a directory,
// makes [Run] write each adapter's report there.
const ReportEnv = "CONFORMANCE_REPORT"

func (r Report) writeEnv() error {
	dir := os.Getenv(ReportEnv)
	if dir == "" {
		return nil
	}
	return r.WriteFile(dir)
}

// MergeMatrix reads every report written into dir and renders the Markdown
// matrix, adapters in name order: first the adapters held to their contract
// by [Run], then, under their own heading, the reports made by [Evaluate]
// (counterexamples, which must fail). failed reports whether any scenario of
// a [Run] report failed.
func MergeMatrix(dir string) (table string, failed bool, err error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return "", false, err
	}
	sort.Strings(paths)
	var held, evaluated strings.Builder
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return "", false, err
		}
		var r Report
		if err := json.Unmarshal(data, &r); err != nil {
			return "", false, fmt.Errorf("%s: %w", p, err)
		}
		if r.Evaluated {
			evaluated.WriteString(r.markdownRows())
			continue
		}
		held.WriteString(r.markdownRows())
		failed = failed || len(r.Failed()) > 0
	}
	if held.Len() == 0 && evaluated.Len() == 0 {
		return "", false, fmt.Errorf("conformance: no reports in %s", dir)
	}
	var b strings.Builder
	if held.Len() > 0 {
		b.WriteString("### Adapters (held to their declared contract)\n\n" + MatrixHeader + held.String())
	}
	if evaluated.Len() > 0 {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		b.WriteString("### Counterexamples (each must FAIL in a named scenario)\n\n" + MatrixHeader + evaluated.String())
	}
	return b.String(), failed, nil
}

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
