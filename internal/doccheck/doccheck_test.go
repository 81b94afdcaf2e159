package doccheck

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// block is one fenced Go code block of a Markdown file.
type block struct {
	file string // relative to the repository root
	line int    // of the opening fence
	code string
}

// root is the repository root: two directories up from this package.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s: %v", dir, err)
	}
	return dir
}

// markdown lists the files the checks cover: README.md, and every .md file
// under docs/ and cmd/.
func markdown(t *testing.T, dir string) []string {
	t.Helper()
	files := []string{"README.md", "BENCHMARKS.md", "RELIABILITY.md"}
	for _, sub := range []string{"docs", "cmd"} {
		err := filepath.WalkDir(filepath.Join(dir, sub), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".md") {
				rel, _ := filepath.Rel(dir, p)
				files = append(files, rel)
			}
			return nil
		})
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	var present []string
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			present = append(present, f)
		}
	}
	return present
}

// goBlocks returns the ```go blocks of one Markdown file.
func goBlocks(t *testing.T, dir, file string) []block {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out   []block
		cur   *block
		fence string
		n     int
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && fence == "" && strings.HasPrefix(trimmed, "```"):
			fence = "```"
			if strings.TrimSpace(strings.TrimPrefix(trimmed, "```")) == "go" {
				cur = &block{file: file, line: n}
			}
		case fence != "" && trimmed == fence:
			if cur != nil {
				out = append(out, *cur)
			}
			cur, fence = nil, ""
		case cur != nil:
			cur.code += line + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

var packageClause = regexp.MustCompile(`(?m)^package [a-z_][a-z0-9_]*\s*$`)

// TestGoBlocksCompile writes every Go block of the Markdown files into a
// throw-away directory inside the module (so that effectively.dev imports
// resolve to this checkout) and vets them all with one go command.
func TestGoBlocksCompile(t *testing.T) {
	dir := root(t)
	var blocks []block
	for _, f := range markdown(t, dir) {
		blocks = append(blocks, goBlocks(t, dir, f)...)
	}
	if len(blocks) == 0 {
		t.Fatal("no Go blocks found in README.md and docs/: the check would prove nothing")
	}
	tmp, err := os.MkdirTemp(dir, ".doccheck-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	where := map[string]block{}
	var pkgs []string
	for i, b := range blocks {
		if !packageClause.MatchString(b.code) {
			t.Errorf("%s:%d: a Go block must be a whole file starting with its package clause (use another fence language for excerpts)", b.file, b.line)
			continue
		}
		name := fmt.Sprintf("b%03d", i)
		pkgDir := filepath.Join(tmp, name)
		if err := os.MkdirAll(pkgDir, 0o755); err != nil {
			t.Fatal(err)
		}
		file := "main.go"
		if strings.Contains(b.code, "func Test") || strings.Contains(b.code, "func Example") {
			file = "block_test.go"
		}
		if err := os.WriteFile(filepath.Join(pkgDir, file), []byte(b.code), 0o644); err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dir, pkgDir)
		pkgs = append(pkgs, "./"+filepath.ToSlash(rel))
		where[name] = b
	}
	if t.Failed() {
		return
	}
	cmd := exec.Command("go", append([]string{"vet"}, pkgs...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		// Point each error at the Markdown file and line it came from.
		msg := string(out)
		for name, b := range where {
			msg = strings.ReplaceAll(msg, filepath.Join(filepath.Base(tmp), name)+string(filepath.Separator), fmt.Sprintf("[%s:%d] ", b.file, b.line))
		}
		t.Fatalf("Go blocks in the docs do not compile (go vet):\n%s", msg)
	}
}

var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestRelativeLinksResolve checks that every relative link of the Markdown
// files names a file or directory that exists inside the repository.
func TestRelativeLinksResolve(t *testing.T) {
	dir := root(t)
	checked := 0
	for _, f := range markdown(t, dir) {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				target, _, _ = strings.Cut(target, "#")
				p := filepath.Clean(filepath.Join(dir, filepath.Dir(f), target))
				checked++
				if rel, err := filepath.Rel(dir, p); err != nil || strings.HasPrefix(rel, "..") {
					t.Errorf("%s:%d: link %q points outside the repository", f, i+1, m[1])
					continue
				}
				if _, err := os.Stat(p); err != nil {
					t.Errorf("%s:%d: link %q: no such file", f, i+1, m[1])
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the check would prove nothing")
	}
}
