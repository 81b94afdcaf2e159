package mysql

import "testing"

// TestOptionScopes: each option has exactly the scopes its doc names, so
// that one given where it does not apply does not compile.
func TestOptionScopes(t *testing.T) {
	for name, tc := range map[string]struct {
		opt             any
		effect, journal bool
	}{
		"AllowUnsafeFlush":      {AllowUnsafeFlush(), true, true},
		"AllowUnsafeBinlogSync": {AllowUnsafeBinlogSync(), true, true},
		"WithMaxRetries":        {WithMaxRetries(1), true, false},
		"WithIsolation":         {WithIsolation(0), true, false},
	} {
		_, effect := tc.opt.(EffectOption)
		_, journal := tc.opt.(Option)
		if effect != tc.effect || journal != tc.journal {
			t.Errorf("%s: EffectOption %t, Option %t; want %t, %t", name, effect, journal, tc.effect, tc.journal)
		}
	}
}
