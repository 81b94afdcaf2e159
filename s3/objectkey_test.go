package s3_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"effectively.dev/effects"
	"effectively.dev/s3"
)

func TestEscapeKey(t *testing.T) {
	for _, tc := range []struct {
		key  effects.Key
		want string
	}{
		{"billing:evt_1:receipt", "billing:evt_1:receipt"},
		{"a/b", "a%2Fb"},
		{"a%2Fb", "a%252Fb"},
		{".", "%2E"},
		{"..", "%2E."},
		{".hidden", "%2Ehidden"},
		{"a.b", "a.b"},
		{"with space", "with%20space"},
		{"é", "%C3%A9"},
		{"~", "%7E"},
		{"q?x#y&z=+", "q%3Fx%23y%26z%3D%2B"},
	} {
		if got := s3.EscapeKey(tc.key); got != tc.want {
			t.Errorf("EscapeKey(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

func TestEscapeKeyShortensLongKeys(t *testing.T) {
	long := effects.Key(strings.Repeat("é", effects.MaxKeyLen/2)) // 254 bytes, 762 escaped
	got := s3.EscapeKey(long)
	if len(got) > 200 || !utf8.ValidString(got) || !strings.Contains(got, "~") {
		t.Errorf("EscapeKey(long) = %q (%d bytes), want a hashed form of at most 200 bytes", got, len(got))
	}
	if head := got[:strings.Index(got, "~")]; strings.Contains(head[max(0, len(head)-2):], "%") {
		t.Errorf("escape sequence cut in half: %q", got)
	}
	if again := s3.EscapeKey(long); again != got {
		t.Errorf("not deterministic: %q then %q", got, again)
	}
	other := long[:len(long)-2] + "e"
	if s3.EscapeKey(other) == got {
		t.Error("two long keys with a common prefix escape alike")
	}
	// At the boundary: 200 escaped bytes stay readable.
	edge := effects.Key(strings.Repeat("k", 200))
	if got := s3.EscapeKey(edge); got != string(edge) {
		t.Errorf("a 200-byte key was shortened to %q", got)
	}
}

func FuzzEscapeKeyIsInjectiveAndSafe(f *testing.F) {
	f.Add("a/b", "a%2Fb")
	f.Add(".", "%2E")
	f.Add(strings.Repeat("é", 120), strings.Repeat("é", 119)+"e")
	f.Fuzz(func(t *testing.T, a, b string) {
		ka, kb := effects.Key(a), effects.Key(b)
		if ka.Validate() != nil || kb.Validate() != nil {
			return
		}
		ea, eb := s3.EscapeKey(ka), s3.EscapeKey(kb)
		if a != b && ea == eb {
			t.Fatalf("%q and %q both escape to %q", a, b, ea)
		}
		if len(ea) > 200 || strings.ContainsAny(ea, "/ ") || ea == "." || ea == ".." || strings.HasPrefix(ea, ".") {
			t.Fatalf("EscapeKey(%q) = %q is not a safe path component", a, ea)
		}
	})
}
