package conformance_test

import (
	"flag"
	"os"
	"strings"
	"testing"

	"effectively.dev/conformance"
)

var update = flag.Bool("update", false, "rewrite the scenario tables of docs/conformance.md from the records")

// docPath is the user's guide to the suite, from this package.
const docPath = "../docs/conformance.md"

// TestDocTables: the scenario tables of docs/conformance.md are the
// records' (conformance.ScenarioTable), so a scenario added, renamed or
// given another capability or field fails here until the document says
// so. With -update it rewrites them.
func TestDocTables(t *testing.T) {
	b, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	out := doc
	for _, suite := range []string{conformance.SuiteEffect, conformance.SuiteJournal, conformance.SuiteSource, conformance.SuitePlan} {
		begin, end := "<!-- scenarios "+suite, "<!-- end scenarios "+suite+" -->"
		i := strings.Index(out, begin)
		j := strings.Index(out, end)
		if i < 0 || j < i {
			t.Fatalf("%s has no %q ... %q block for the %s suite's table", docPath, begin, end, suite)
		}
		i += strings.Index(out[i:], "-->\n") + len("-->\n")
		want := conformance.ScenarioTable(suite)
		if got := out[i:j]; got != want {
			if !*update {
				t.Errorf("%s: the %s suite's table differs from the records; run go test ./conformance/ -run TestDocTables -update\n got:\n%s\nwant:\n%s", docPath, suite, got, want)
			}
			out = out[:i] + want + out[j:]
		}
	}
	if *update && out != doc {
		if err := os.WriteFile(docPath, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDocGoNamesEveryScenario: the package documentation names every
// scenario of every suite, so that go doc lists none the suite lacks and
// leaves none out.
func TestDocGoNamesEveryScenario(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, sc := range conformance.Catalog() {
		if !strings.Contains(doc, sc.Name) {
			t.Errorf("doc.go does not name the %s suite's scenario %s", sc.Suite, sc.Name)
		}
	}
}
