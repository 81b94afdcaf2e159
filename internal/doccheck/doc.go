// Package doccheck holds the test that keeps the repository's Markdown
// honest: every Go code block in README.md and docs/ compiles against the
// current packages (go vet), and every relative link points to a file that
// exists inside the repository. It has no code of its own.
//
// A Go block must be a whole file, starting with its package clause, so
// that a reader can copy it as it is. A block that is deliberately not Go
// (a shell session, an excerpt of output) uses another fence language.
package doccheck
