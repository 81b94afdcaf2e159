package effects_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"effectively.dev/effects"
)

func TestNewKeyIsUnambiguous(t *testing.T) {
	pairs := [][2][]string{
		{{"a:b", "c"}, {"a", "b:c"}},
		{{"a%3Ab"}, {"a:b"}},
		{{"a", "b"}, {"a:b"}},
		{{"x\x00"}, {"x%00"}},
		{{"\xff"}, {"%FF"}},
		{{" k"}, {"k"}},
		{{"k", "v\u00a0"}, {"k", "v"}},
	}
	for _, p := range pairs {
		k1, err1 := effects.NewKey(p[0]...)
		k2, err2 := effects.NewKey(p[1]...)
		if err1 != nil || err2 != nil {
			t.Fatalf("NewKey(%q), NewKey(%q): %v, %v", p[0], p[1], err1, err2)
		}
		if k1 == k2 {
			t.Errorf("NewKey(%q) == NewKey(%q) == %q", p[0], p[1], k1)
		}
	}
}

func TestNewKeyIsDeterministicAndValid(t *testing.T) {
	cases := [][]string{
		{"billing", "evt_42", "ledger"},
		{"tenant/ü", "évènement", "step"},
		{"ctl", "a\nb\tc\x00", "\x7f\u0085"},
		{"bad", "\xff\xfe\xfd"},
		{" lead", "trail\u00a0 "},
		{"long", strings.Repeat("x", 300)},
		{"long-escapes", strings.Repeat("%", 200)},
		{"long-runes", strings.Repeat("€", 200)},
	}
	for _, parts := range cases {
		k1, err := effects.NewKey(parts...)
		if err != nil {
			t.Fatalf("NewKey(%q): %v", parts, err)
		}
		k2 := effects.MustKey(parts...)
		if k1 != k2 {
			t.Errorf("NewKey(%q) not deterministic: %q vs %q", parts, k1, k2)
		}
		if err := k1.Validate(); err != nil {
			t.Errorf("NewKey(%q) = %q, which does not validate: %v", parts, k1, err)
		}
		if len(k1) > effects.MaxKeyLen {
			t.Errorf("NewKey(%q) is %d bytes", parts, len(k1))
		}
	}
}

func TestNewKeyHashesLongInputStably(t *testing.T) {
	long := strings.Repeat("y", 1000)
	k := effects.MustKey("scope", long)
	// Pinned: a change here changes every stored key and breaks dedup for
	// messages in flight across an upgrade.
	want := "scope:" + strings.Repeat("y", 154) + "%~b5cf643ed5e41a3f14d907e860115e8bfecdd6c06c7209ac20bca4d7a7210f3d"
	if string(k) != want {
		t.Fatalf("hashed key changed:\n got %q\nwant %q", k, want)
	}
	if k == effects.MustKey("scope", long+"y") {
		t.Fatal("different long inputs hashed to the same key")
	}
	// A hashed key never collides with a short key spelling the same text:
	// '%' in a part is always escaped.
	if other, err := effects.NewKey(string(k)); err == nil && other == k {
		t.Fatal("hashed key equals an unhashed key")
	}
}

func TestNewKeyRejectsEmpty(t *testing.T) {
	for _, parts := range [][]string{nil, {""}, {"a", ""}} {
		_, err := effects.NewKey(parts...)
		if !errors.Is(err, effects.ErrInvalidKey) {
			t.Errorf("NewKey(%q) = %v, want ErrInvalidKey", parts, err)
		}
	}
}

func TestValidate(t *testing.T) {
	bad := map[string]effects.Key{
		"empty":       "",
		"too long":    effects.Key(strings.Repeat("k", effects.MaxKeyLen+1)),
		"10 KB":       effects.Key(strings.Repeat("k", 10<<10)),
		"NUL":         "a\x00b",
		"newline":     "a\nb",
		"DEL":         "a\x7fb",
		"C1":          "a\u0085b",
		"invalid UTF": "a\xffb",
		"lead space":  " ab",
		"trail NBSP":  "ab\u00a0",
	}
	for name, k := range bad {
		err := k.Validate()
		if !errors.Is(err, effects.ErrInvalidKey) {
			t.Errorf("%s: Validate() = %v, want ErrInvalidKey", name, err)
		}
		var e *effects.Error
		if !errors.As(err, &e) || e.Kind != effects.ErrInvalidKey {
			t.Errorf("%s: not an *effects.Error of kind ErrInvalidKey: %#v", name, err)
		}
		if effects.ClassOf(err) == effects.Retryable {
			t.Errorf("%s: invalid key reported retryable", name)
		}
		if !utf8.ValidString(err.Error()) {
			t.Errorf("%s: error message is not valid UTF-8: %q", name, err.Error())
		}
	}
	good := []effects.Key{"a", "evt_1", effects.Key(strings.Repeat("k", effects.MaxKeyLen)), "ünïcödé key with spaces"}
	for _, k := range good {
		if err := k.Validate(); err != nil {
			t.Errorf("Validate(%q) = %v", k, err)
		}
	}
}

// TestCheckID: ids that encoding/json decoded from distinct invalid UTF-8
// (or lone surrogates) arrive equal; CheckID refuses them as poison, and
// the empty id too, and passes ordinary ids.
func TestCheckID(t *testing.T) {
	decode := func(raw string) string {
		var ev struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(`{"id":"`+raw+`"}`), &ev); err != nil {
			t.Fatalf("decoding %q: %v", raw, err)
		}
		return ev.ID
	}
	a, b := decode("evt-\xff"), decode("evt-\xfe")
	if a != b {
		t.Fatalf("encoding/json kept %q and %q apart; the premise of CheckID changed", a, b)
	}
	for _, id := range []string{a, decode(`evt-\ud800`), "", "evt-\xff", "\ufffd"} {
		if err := effects.CheckID(id); !errors.Is(err, effects.ErrPoison) {
			t.Errorf("CheckID(%q) = %v, want ErrPoison", id, err)
		}
	}
	for _, id := range []string{"evt_42", "ünïcödé-€", "a:b%c", decode(`evt-\u00e9`)} {
		if err := effects.CheckID(id); err != nil {
			t.Errorf("CheckID(%q) = %v, want nil", id, err)
		}
	}
}
