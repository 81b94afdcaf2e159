package httpkey

import "testing"

// The default path template writes every version segment, of each form,
// as {version} and leaves the other segments as they are.
func TestVersionlessPath(t *testing.T) {
	for in, want := range map[string]string{
		"/checkout/v71/payments/2024-06-01/x/v2.1": "/checkout/{version}/payments/{version}/x/{version}",
		"/payments/vip/2024-6-1/v":                 "/payments/vip/2024-6-1/v",
		"":                                         "",
	} {
		if got := versionlessPath(in); got != want {
			t.Errorf("versionlessPath(%q) = %q, want %q", in, got, want)
		}
	}
}
