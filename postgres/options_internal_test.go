package postgres

import "testing"

// TestOptionScopes: each option has exactly the scopes its doc names, so
// that one given where it does not apply does not compile.
func TestOptionScopes(t *testing.T) {
	for name, tc := range map[string]struct {
		opt                   any
		effect, batch, claims bool
	}{
		"AllowAsyncCommit":   {AllowAsyncCommit(), true, true, true},
		"WithMaxRetries":     {WithMaxRetries(1), true, true, false},
		"WithIsolation":      {WithIsolation(""), true, true, false},
		"WithLookupFirst":    {WithLookupFirst(), true, false, false},
		"WithoutGroupCommit": {WithoutGroupCommit(), true, false, false},
		"WithPrecheck":       {WithPrecheck(nil), false, true, false},
	} {
		_, effect := tc.opt.(EffectOption)
		_, batch := tc.opt.(BatchOption)
		_, claims := tc.opt.(Option)
		if effect != tc.effect || batch != tc.batch || claims != tc.claims {
			t.Errorf("%s: EffectOption %t, BatchOption %t, Option %t; want %t, %t, %t",
				name, effect, batch, claims, tc.effect, tc.batch, tc.claims)
		}
	}
}
