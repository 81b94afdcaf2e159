package doccheck

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// listPackages returns the packages go list reports for patterns, run in
// dir, with their dependencies.
func listPackages(t *testing.T, dir string, patterns ...string) map[string]Package {
	t.Helper()
	args := append([]string{"list", "-deps", "-e", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .GoFiles \" \"}} {{join .CgoFiles \" \"}}"}, patterns...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string]Package{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 || f[1] == "" {
			continue
		}
		pkgs[f[0]] = Package{ImportPath: f[0], Dir: f[1], Files: strings.Fields(f[2])}
	}
	return pkgs
}

// TestGodoc: in every package of the module, every doc link resolves,
// every pkg.Name a doc comment names exists, and no doc comment tells
// history.
func TestGodoc(t *testing.T) {
	c := &Checker{Packages: listPackages(t, root(t), "./...")}
	pkgs := c.Sorted("effectively.dev")
	if len(pkgs) < 20 {
		t.Fatalf("only %d packages of the module found: %v", len(pkgs), pkgs)
	}
	for _, ip := range pkgs {
		if len(c.Packages[ip].Files) == 0 {
			continue // only tests
		}
		probs, err := c.Check(ip)
		if err != nil {
			t.Errorf("%s: %v", ip, err)
			continue
		}
		for _, p := range probs {
			t.Error(p)
		}
	}
}

// TestGodocRefusesBadDocs: the checks fail on a dangling link, a name the
// package does not declare and history words.
func TestGodocRefusesBadDocs(t *testing.T) {
	pkgs := listPackages(t, root(t), "strings")
	dir, err := filepath.Abs(filepath.Join("testdata", "bad"))
	if err != nil {
		t.Fatal(err)
	}
	pkgs["example.com/bad"] = Package{ImportPath: "example.com/bad", Dir: dir, Files: []string{"bad.go"}}
	c := &Checker{Packages: pkgs}
	probs, err := c.Check("example.com/bad")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(probs, "\n")
	for _, want := range []string{
		"names bad.Missing",
		"dangling doc link [Gone]",
		"dangling doc link [strings.NoSuchThing]",
		"dangling doc link [Good.NoMethod]",
		`tells history ("used to")`,
		`tells history ("red team's")`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q among the problems:\n%s", want, got)
		}
	}
	for _, p := range probs {
		if strings.Contains(p, "example.com/bad: Good:") || strings.Contains(p, "Good.Method:") {
			t.Errorf("a good doc comment refused: %s", p)
		}
	}
	if len(probs) != 7 {
		t.Errorf("%d problems, want 7:\n%s", len(probs), got)
	}
}
