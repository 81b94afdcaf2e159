package doccheck

import (
	"fmt"
	"go/ast"
	"go/doc"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Package is one Go package to check or to resolve links into: its import
// path, its directory and the files of its build (tests excluded).
type Package struct {
	ImportPath string
	Dir        string
	Files      []string
}

// Checker checks the doc comments of packages: every doc link resolves,
// every pkg.Name the text names exists, and no comment tells history.
// Packages maps each import path a link may name to its package.
type Checker struct {
	Packages map[string]Package

	docs map[string]*loaded
}

// loaded is a parsed package: its documentation and the packages its
// files import, by the name they are used under.
type loaded struct {
	doc     *doc.Package
	imports map[string]string // name -> import path ("" when two imports share it)
}

// History lists the phrases that tell a package's history instead of its
// behaviour; history belongs in CHANGES.md and git.
var History = []string{"used to", "earlier versions", "the red team", "red team's", "before this change", "no longer", "the essay's bug"}

// historyRE matches each phrase of History as whole words, in any case.
var historyRE = func() map[string]*regexp.Regexp {
	m := map[string]*regexp.Regexp{}
	for _, h := range History {
		m[h] = regexp.MustCompile(`(?i)\b` + regexp.QuoteMeta(h) + `\b`)
	}
	return m
}()

// passiveUse matches "is used to" and the like: a purpose, not history.
var passiveUse = regexp.MustCompile(`(?i)\b(is|are|be|been|being|gets|get)\s+used\s+to\b`)

// load parses the package at importPath, once.
func (c *Checker) load(importPath string) (*loaded, error) {
	if l, ok := c.docs[importPath]; ok {
		return l, nil
	}
	if c.docs == nil {
		c.docs = map[string]*loaded{}
	}
	p, ok := c.Packages[importPath]
	if !ok {
		return nil, fmt.Errorf("package %s is not among the packages the checker knows", importPath)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	imports := map[string]string{}
	for _, name := range p.Files {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
		for _, imp := range f.Imports {
			ip, _ := strconv.Unquote(imp.Path.Value)
			n := path.Base(ip)
			if imp.Name != nil {
				n = imp.Name.Name
			} else if q, ok := c.Packages[ip]; ok && len(q.Files) > 0 {
				if pn := packageName(fset, q); pn != "" {
					n = pn
				}
			}
			if prev, dup := imports[n]; dup && prev != ip {
				imports[n] = ""
			} else {
				imports[n] = ip
			}
		}
	}
	d, err := doc.NewFromFiles(fset, files, importPath)
	if err != nil {
		return nil, err
	}
	l := &loaded{doc: d, imports: imports}
	c.docs[importPath] = l
	return l, nil
}

// packageName returns the package clause of p's first file.
func packageName(fset *token.FileSet, p Package) string {
	f, err := parser.ParseFile(fset, filepath.Join(p.Dir, p.Files[0]), nil, parser.PackageClauseOnly)
	if err != nil {
		return ""
	}
	return f.Name.Name
}

// exists reports whether pkg declares recv.name (recv empty: name) among
// its exported names, methods and fields.
func (c *Checker) exists(importPath, recv, name string) (bool, error) {
	l, err := c.load(importPath)
	if err != nil {
		return false, err
	}
	if name == "" {
		return true, nil
	}
	return l.doc.Parser().LookupSym(recv, name), nil
}

// Check returns the problems of the doc comments of the package at
// importPath, each "file:line: what".
func (c *Checker) Check(importPath string) ([]string, error) {
	l, err := c.load(importPath)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, d := range comments(l.doc) {
		probs, err := c.checkText(importPath, l, d.text)
		if err != nil {
			return nil, err
		}
		for _, p := range probs {
			out = append(out, d.where+": "+p)
		}
	}
	return out, nil
}

// docText is one doc comment and where it is.
type docText struct{ where, text string }

// comments lists the package's doc comments: the package's own, then each
// exported name's.
func comments(d *doc.Package) []docText {
	out := []docText{{"package " + d.Name, d.Doc}}
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			out = append(out, docText{strings.Join(v.Names, ", "), v.Doc})
		}
	}
	funcs := func(fs []*doc.Func) {
		for _, f := range fs {
			name := f.Name
			if f.Recv != "" {
				name = strings.TrimPrefix(f.Recv, "*") + "." + f.Name
			}
			out = append(out, docText{name, f.Doc})
		}
	}
	values(d.Consts)
	values(d.Vars)
	funcs(d.Funcs)
	for _, t := range d.Types {
		out = append(out, docText{t.Name, t.Doc})
		values(t.Consts)
		values(t.Vars)
		funcs(t.Funcs)
		funcs(t.Methods)
	}
	for i := range out {
		out[i].where = d.ImportPath + ": " + out[i].where
	}
	return out
}

// candidate matches what could be a doc link in plain text: [Name],
// [Recv.Name], [pkg.Name], [pkg.Recv.Name], with an optional '*'.
var candidate = regexp.MustCompile(`\[\*?((?:[A-Za-z_][A-Za-z0-9_]*\.){0,2}[A-Z][A-Za-z0-9_]*)\]`)

// qualified matches pkg.Name and pkg.Recv.Name in text.
var qualified = regexp.MustCompile(`(^|[^A-Za-z0-9_./*\[])([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?`)

func (c *Checker) checkText(self string, l *loaded, text string) ([]string, error) {
	if strings.TrimSpace(text) == "" {
		return nil, nil
	}
	var out []string
	for _, h := range History {
		n := len(historyRE[h].FindAllString(text, -1))
		if h == "used to" {
			n -= len(passiveUse.FindAllString(text, -1))
		}
		if n <= 0 {
			continue
		}
		out = append(out, fmt.Sprintf("tells history (%q): say what the code does; history goes in CHANGES.md", h))
	}
	var walkErr error
	var plain, all strings.Builder
	var visit func(ts []comment.Text)
	visit = func(ts []comment.Text) {
		for _, t := range ts {
			switch t := t.(type) {
			case comment.Plain:
				plain.WriteString(string(t))
				plain.WriteString(" ")
				all.WriteString(string(t))
			case comment.Italic:
				plain.WriteString(string(t))
				plain.WriteString(" ")
				all.WriteString(string(t))
			case *comment.Link:
				visit(t.Text)
			case *comment.DocLink:
				all.WriteString(" ")
				if t.ImportPath == "" || t.ImportPath == self {
					continue // the parser found it in this package
				}
				if _, known := c.Packages[t.ImportPath]; !known {
					out = append(out, fmt.Sprintf("doc link to %s, a package this module does not build", t.ImportPath))
					continue
				}
				ok, err := c.exists(t.ImportPath, t.Recv, t.Name)
				if err != nil {
					walkErr = err
				} else if !ok {
					out = append(out, fmt.Sprintf("dangling doc link [%s]: %s declares no such name", linkName(t), t.ImportPath))
				}
			}
		}
	}
	parsed := l.doc.Parser().Parse(text)
	for _, b := range parsed.Content {
		switch b := b.(type) {
		case *comment.Paragraph:
			visit(b.Text)
		case *comment.Heading:
			visit(b.Text)
		case *comment.List:
			for _, it := range b.Items {
				for _, ib := range it.Content {
					if p, ok := ib.(*comment.Paragraph); ok {
						visit(p.Text)
						plain.WriteString("\n")
						all.WriteString("\n")
					}
				}
			}
		case *comment.Code:
			all.WriteString(b.Text)
		}
		plain.WriteString("\n")
		all.WriteString("\n")
	}
	if walkErr != nil {
		return nil, walkErr
	}
	s := plain.String()
	for _, m := range candidate.FindAllStringSubmatchIndex(s, -1) {
		if !linkBoundary(s[:m[0]], s[m[1]:]) {
			continue
		}
		out = append(out, fmt.Sprintf("dangling doc link [%s]: no such name in scope (a package must be imported by the package to be linked by its name)", s[m[2]:m[3]]))
	}
	probs, err := c.checkQualified(self, l, all.String())
	if err != nil {
		return nil, err
	}
	return append(out, probs...), nil
}

// checkQualified checks every pkg.Name (and pkg.Recv.Name) in text whose
// pkg is this package or a package of the same module that it imports.
// A name of another module's package, which may share the name of this
// one (stripe-go's stripe), is left to that module.
func (c *Checker) checkQualified(self string, l *loaded, text string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, m := range qualified.FindAllStringSubmatch(text, -1) {
		pkg, a, b := m[2], m[3], m[4]
		var ip string
		switch {
		case pkg == l.doc.Name:
			ip = self
		case l.imports[pkg] != "" && sameModule(self, l.imports[pkg]):
			ip = l.imports[pkg]
		default:
			continue
		}
		if _, known := c.Packages[ip]; !known {
			continue
		}
		recv, name := "", a
		if b != "" {
			recv, name = a, b
		}
		ok, err := c.exists(ip, recv, name)
		if err != nil {
			return nil, err
		}
		if !ok && b != "" {
			// pkg.Name.Field of a value, or a sentence's full stop: the
			// first name must exist.
			ok, err = c.exists(ip, "", a)
			if err != nil {
				return nil, err
			}
			if ok {
				continue
			}
		}
		ref := strings.TrimPrefix(m[0], m[1])
		if !ok && !seen[ref] {
			seen[ref] = true
			out = append(out, fmt.Sprintf("names %s, which %s does not declare", ref, ip))
		}
	}
	return out, nil
}

// sameModule reports whether import paths a and b share their first
// element (the module's domain, effectively.dev).
func sameModule(a, b string) bool {
	first := func(s string) string { f, _, _ := strings.Cut(s, "/"); return f }
	return strings.Contains(first(a), ".") && first(a) == first(b)
}

func linkName(l *comment.DocLink) string {
	s := l.Name
	if l.Recv != "" {
		s = l.Recv + "." + s
	}
	return path.Base(l.ImportPath) + "." + s
}

// linkBoundary reports whether text between before and after would be
// taken for a doc link: punctuation or space on both sides, as the
// go/doc/comment parser requires.
func linkBoundary(before, after string) bool {
	if before != "" {
		r, _ := utf8.DecodeLastRuneInString(before)
		if !unicode.IsPunct(r) && !unicode.IsSpace(r) {
			return false
		}
	}
	if after != "" {
		r, _ := utf8.DecodeRuneInString(after)
		if !unicode.IsPunct(r) && !unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// Sorted returns the import paths of c's packages under prefix, sorted.
func (c *Checker) Sorted(prefix string) []string {
	var out []string
	for ip := range c.Packages {
		if ip == prefix || strings.HasPrefix(ip, prefix+"/") {
			out = append(out, ip)
		}
	}
	sort.Strings(out)
	return out
}
