package effects_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"effectively.dev/effects"
)

// The fuzz targets state the core's promises as properties. Their seed
// corpora (testdata/fuzz) run as ordinary tests; scripts/test fuzzes some
// of them briefly, and a longer run is
//
//	go test -run '^$' -fuzz '^FuzzNewKey$' -fuzztime 5m ./effects/

// FuzzNewKey: NewKey is deterministic, its keys are valid and at most
// MaxKeyLen bytes, and it is injective: two pairs of parts give the same key
// only if they are the same pair. An unhashed key decodes back to its parts
// (which proves injectivity for all of them); a hashed key has the
// documented shape.
func FuzzNewKey(f *testing.F) {
	f.Add("billing", "evt_42", "billing", "evt_43")
	f.Add("a:b", "c", "a", "b:c")
	f.Add("a%3Ab", "c", "a:b", "c")
	f.Add(" k", "v", "k", "v")
	f.Add("k", "v\u00a0", "k", "v")
	f.Add("\xff", "x", "%FF", "x")
	f.Add(strings.Repeat("x", 200), strings.Repeat("y", 100), strings.Repeat("x", 201), strings.Repeat("y", 99))
	f.Add(strings.Repeat("%", 100), "z", strings.Repeat("€", 60), "z")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		k1, err := effects.NewKey(a, b)
		if a == "" || b == "" {
			if err == nil || !errors.Is(err, effects.ErrInvalidKey) {
				t.Fatalf("NewKey(%q, %q) = %q, %v; want ErrInvalidKey for an empty part", a, b, k1, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("NewKey(%q, %q): %v", a, b, err)
		}
		if again := effects.MustKey(a, b); again != k1 {
			t.Fatalf("NewKey(%q, %q) not deterministic: %q, then %q", a, b, k1, again)
		}
		if err := k1.Validate(); err != nil {
			t.Fatalf("NewKey(%q, %q) = %q, invalid: %v", a, b, k1, err)
		}
		if len(k1) > effects.MaxKeyLen {
			t.Fatalf("NewKey(%q, %q) is %d bytes, over %d", a, b, len(k1), effects.MaxKeyLen)
		}
		checkShape(t, k1, a, b)

		// Injective: against the other pair, and against near misses that
		// the joining must keep apart.
		others := [][]string{{c, d}, {a + ":" + b}, {a, b, c}}
		if len(b) > 1 {
			others = append(others, []string{a + b[:1], b[1:]})
		}
		if len(a) > 1 {
			others = append(others, []string{a[:len(a)-1], a[len(a)-1:] + b})
		}
		for _, o := range others {
			k2, err := effects.NewKey(o...)
			if err != nil {
				continue // an empty part
			}
			if k1 == k2 && !slicesEqual(o, []string{a, b}) {
				t.Fatalf("NewKey(%q, %q) == NewKey(%q) == %q", a, b, o, k1)
			}
		}
	})
}

// checkShape checks that k, NewKey(a, b), is either the escaped join of a
// and b (and decodes back to them) or the hashed form: a readable prefix,
// "%~", and 64 hex digits.
func checkShape(t *testing.T, k effects.Key, a, b string) {
	t.Helper()
	s := string(k)
	if i := strings.Index(s, "%~"); i >= 0 {
		prefix, digest := s[:i], s[i+2:]
		if _, err := hex.DecodeString(digest); err != nil || len(digest) != 64 || strings.ToLower(digest) != digest {
			t.Fatalf("hashed key %q: digest %q is not 64 lower-case hex digits", s, digest)
		}
		if len(prefix) > 160 || strings.Contains(prefix, "%~") {
			t.Fatalf("hashed key %q: bad readable prefix %q", s, prefix)
		}
		return
	}
	parts, err := decodeKey(s)
	if err != nil {
		t.Fatalf("key %q (from %q, %q) does not decode: %v", s, a, b, err)
	}
	if !slicesEqual(parts, []string{a, b}) {
		t.Fatalf("key %q (from %q, %q) decodes to %q", s, a, b, parts)
	}
}

// decodeKey inverts NewKey's joining of an unhashed key: split at ':',
// then turn every %XX back into its byte.
func decodeKey(s string) ([]string, error) {
	var parts []string
	for _, p := range strings.Split(s, ":") {
		var b strings.Builder
		for i := 0; i < len(p); i++ {
			if p[i] != '%' {
				b.WriteByte(p[i])
				continue
			}
			if i+2 >= len(p) {
				return nil, errors.New("truncated escape")
			}
			x, err := hex.DecodeString(p[i+1 : i+3])
			if err != nil || strings.ToUpper(p[i+1:i+3]) != p[i+1:i+3] {
				return nil, errors.New("bad escape " + p[i:i+3])
			}
			b.WriteByte(x[0])
			i += 2
		}
		parts = append(parts, b.String())
	}
	return parts, nil
}

func slicesEqual(a, b []string) bool { return reflect.DeepEqual(a, b) }

// FuzzValidate: Validate never panics, and it accepts exactly the keys
// that are non-empty, at most MaxKeyLen bytes, valid UTF-8, free of control
// characters (C0, DEL, C1) and of white space at either end; its refusals
// are *effects.Error of kind ErrInvalidKey.
func FuzzValidate(f *testing.F) {
	for _, k := range []string{"", "k", "billing:evt_42:ledger", " k", "k ", "k\u00a0", "a\x00b", "a\x7fb", "a\u0085b",
		"\xff", strings.Repeat("k", 255), strings.Repeat("k", 256), strings.Repeat("é", 128), "\u3000k"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k := effects.Key(s)
		err := k.Validate()
		valid := s != "" && len(s) <= effects.MaxKeyLen && utf8.ValidString(s) &&
			strings.TrimFunc(s, unicode.IsSpace) == s && !strings.ContainsFunc(s, isControl)
		if valid != (err == nil) {
			t.Fatalf("Validate(%q) = %v, but the invariants say valid=%t", s, err, valid)
		}
		if err != nil {
			var e *effects.Error
			if !errors.Is(err, effects.ErrInvalidKey) || !errors.As(err, &e) || e.Key != k {
				t.Fatalf("Validate(%q) = %#v, want an *effects.Error of kind ErrInvalidKey naming the key", s, err)
			}
		}
	})
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7F || (r >= 0x80 && r < 0xA0) }

// FuzzFingerprint: Fingerprint is deterministic, 32 bytes, and injective
// on lists of fields: the length prefixes keep ("ab", "c") and ("a", "bc")
// apart, and lists of different lengths apart.
func FuzzFingerprint(f *testing.F) {
	f.Add([]byte("ab"), []byte("c"), []byte("a"), []byte("bc"))
	f.Add([]byte(""), []byte("x"), []byte("x"), []byte(""))
	f.Add([]byte("same"), []byte("same"), []byte("same"), []byte("same"))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1}, []byte("a"), []byte{}, []byte{0, 0, 0, 0, 0, 0, 0, 1, 'a'})
	f.Fuzz(func(t *testing.T, a, b, c, d []byte) {
		fp := effects.Fingerprint(a, b)
		if len(fp) != 32 || !bytes.Equal(fp, effects.Fingerprint(a, b)) {
			t.Fatalf("Fingerprint(%q, %q) = %x: not a deterministic SHA-256", a, b, fp)
		}
		same := bytes.Equal(a, c) && bytes.Equal(b, d)
		if got := bytes.Equal(fp, effects.Fingerprint(c, d)); got != same {
			t.Fatalf("Fingerprint(%q, %q) == Fingerprint(%q, %q) is %t, want %t", a, b, c, d, got, same)
		}
		joined := append(append([]byte{}, a...), b...)
		distinct := [][][]byte{{joined}, {a, b, c}, {a}, {}}
		for cut := range len(joined) + 1 {
			if cut != len(a) && (cut < 3 || cut > len(joined)-3 || cut == len(a)-1 || cut == len(a)+1) {
				distinct = append(distinct, [][]byte{joined[:cut], joined[cut:]})
			}
		}
		for _, fields := range distinct {
			if bytes.Equal(fp, effects.Fingerprint(fields...)) {
				t.Fatalf("Fingerprint(%q, %q) == Fingerprint(%q)", a, b, fields)
			}
		}
	})
}

// jsonPayload is a typical effect input.
type jsonPayload struct {
	EventID string
	Cents   int64
	Tags    []string
	Meta    map[string]string
}

// FuzzFingerprintJSON: FingerprintJSON is deterministic (map order does
// not matter) and distinguishes payloads that differ in any field.
//
// A payload with a string that is not valid UTF-8 must be refused with
// ErrPoison: encoding/json replaces the invalid bytes with U+FFFD, so
// a fingerprint could not tell "\xff" from "\xfe" and a reused key would go
// unnoticed.
func FuzzFingerprintJSON(f *testing.F) {
	f.Add("evt_1", int64(100), "a", "b", "k", "v", "evt_1", int64(100), "a", "b", "k", "v")
	f.Add("evt_1", int64(100), "a,b", "", "k", "v", "evt_1", int64(100), "a", "b", "k", "v")
	f.Add("evt_1", int64(0), "", "", "", "", "evt_1", int64(0), "", "", "", "x")
	f.Add("<&>", int64(-1), "\u2028", "x", "k", "v", "\\u003c&>", int64(-1), "\u2028", "x", "k", "v")
	f.Fuzz(func(t *testing.T, id1 string, c1 int64, t1, t2, k1, v1 string, id2 string, c2 int64, u1, u2, l1, w1 string) {
		p := jsonPayload{EventID: id1, Cents: c1, Tags: []string{t1, t2}, Meta: map[string]string{k1: v1, "fixed": t1}}
		for _, s := range []string{id1, t1, t2, k1, v1} {
			if !utf8.ValidString(s) {
				if _, err := effects.FingerprintJSON(p); !errors.Is(err, effects.ErrPoison) {
					t.Fatalf("FingerprintJSON(%+v) = %v, want ErrPoison", p, err)
				}
				return
			}
		}
		for _, s := range []string{id2, u1, u2, l1, w1} {
			if !utf8.ValidString(s) {
				return
			}
		}
		q := jsonPayload{EventID: id2, Cents: c2, Tags: []string{u1, u2}, Meta: map[string]string{l1: w1, "fixed": u1}}
		fp := mustFingerprintJSON(t, p)
		if !bytes.Equal(fp, mustFingerprintJSON(t, p)) { // maps iterate in a new order each time
			t.Fatalf("FingerprintJSON(%+v) is not deterministic", p)
		}
		if got, want := bytes.Equal(fp, mustFingerprintJSON(t, q)), reflect.DeepEqual(p, q); got != want {
			t.Fatalf("FingerprintJSON(%+v) == FingerprintJSON(%+v) is %t, want %t", p, q, got, want)
		}
		// Changing any one field changes the fingerprint.
		changed := []jsonPayload{p, p, p, p}
		changed[0].EventID += "x"
		changed[1].Cents ^= 1
		changed[2].Tags = []string{t1 + t2}
		changed[3].Meta = map[string]string{k1: v1 + "x", "fixed": t1}
		if k1 == "fixed" {
			changed[3].Meta = map[string]string{"fixed": t1 + "x"}
		}
		for _, c := range changed {
			if bytes.Equal(fp, mustFingerprintJSON(t, c)) && !reflect.DeepEqual(c, p) {
				t.Fatalf("FingerprintJSON(%+v) == FingerprintJSON(%+v)", p, c)
			}
		}
	})
}

func mustFingerprintJSON(t *testing.T, v any) []byte {
	t.Helper()
	fp, err := effects.FingerprintJSON(v)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}
