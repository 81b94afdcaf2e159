package pgharness_test

import (
	"os"
	"strings"
	"testing"
)

// readmeStart is the first line of the harness in the guide's code block.
const readmeStart = "package pgharness_test"

// TestSameAsTheGuide fails when the guide's harness and this copy drift
// apart: the copy proves the printed code compiles and passes outside the
// module only while they are the same.
func TestSameAsTheGuide(t *testing.T) {
	readme, err := os.ReadFile("../../../docs/writing-an-adapter.md")
	if err != nil {
		t.Fatal(err)
	}
	copied, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	block := string(readme)
	i := strings.Index(block, "```go\n"+readmeStart)
	if i < 0 {
		t.Fatalf("docs/writing-an-adapter.md has no Go block starting with %q: update this test and readme_test.go together with the guide", readmeStart)
	}
	block = block[i+len("```go\n"):]
	block = block[:strings.Index(block, "```\n")]
	j := strings.Index(string(copied), readmeStart)
	if j < 0 {
		t.Fatalf("readme_test.go lacks the line %q", readmeStart)
	}
	if got := string(copied[j:]); got != block {
		t.Errorf("readme_test.go differs from the guide's harness: copy the guide's code block (from %q to its end) over the end of readme_test.go", readmeStart)
	}
}
