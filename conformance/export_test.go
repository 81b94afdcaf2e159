package conformance

import "testing"

// Names the package's external tests use; not part of its API.

// Scenario is one scenario's record.
type Scenario = scenarioRecord

// The four suites, as reports name them.
const (
	SuiteEffect  = suiteEffect
	SuiteJournal = suiteJournal
	SuiteSource  = suiteSource
	SuitePlan    = suitePlan
)

// Catalog returns every scenario's record, suite by suite.
func Catalog() []Scenario { return catalog() }

// ScenarioTable renders suite's records as docs/conformance.md's table.
func ScenarioTable(suite string) string { return scenarioTable(suite) }

// Maker and SourceMaker are the suite's harness constructors' types.
type (
	Maker[In any] = func(t testing.TB) Harness[In]
	SourceMaker   = func(t testing.TB) SourceHarness
)
