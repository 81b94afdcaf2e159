// Package bad is documentation that doccheck must refuse: bad.Missing
// is named but not declared, and [Gone] links to nothing.
package bad

import "strings"

// Good links to [strings.Builder], [Good.Method] and [Good], which exist.
type Good struct{ b strings.Builder }

// Method does nothing.
func (Good) Method() {}

// Bad links to [strings.NoSuchThing] and [Good.NoMethod]. It used to do
// more; the red team's version was slower.
func Bad() {}
