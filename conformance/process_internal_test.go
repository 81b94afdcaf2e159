package conformance

import "testing"

// TestRunPattern checks that a child process is started for exactly the
// test that called Run: every element anchored and quoted.
func TestRunPattern(t *testing.T) {
	for _, tc := range []struct{ scenario, want string }{
		{"TestConformance/postgres/successor-process", `^TestConformance$/^postgres$`},
		{"TestX/postgres_(WithLookupFirst)/successor-process", `^TestX$/^postgres_\(WithLookupFirst\)$`},
		{"TestY/successor-process", `^TestY$`},
	} {
		if got := runPattern(parentTest(tc.scenario)); got != tc.want {
			t.Errorf("runPattern(parentTest(%q)) = %q, want %q", tc.scenario, got, tc.want)
		}
	}
}
