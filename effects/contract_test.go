package effects_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"effectively.dev/effects"
)

func TestContractValidate(t *testing.T) {
	window := effects.Window{Trigger: effects.AfterUnknownOutcome, Between: "after 250, before the record commits"}
	valid := []effects.Contract{
		{Guarantee: effects.EffectivelyOnce, Enforcer: "pg"},
		{Guarantee: effects.EffectivelyOnce, Enforcer: "stripe", Horizon: 24 * time.Hour, DetectsKeyReuse: true},
		{Guarantee: effects.AtLeastOnce, Enforcer: "smtp", DuplicateWindow: window},
		{Guarantee: effects.AtLeastOnce, Enforcer: "vendor", Horizon: time.Hour, HorizonAssumed: true, DuplicateWindow: window},
	}
	for _, c := range valid {
		if err := c.Validate(); err != nil {
			t.Errorf("%v: %v", c, err)
		}
	}
	invalid := []effects.Contract{
		{},
		{Guarantee: effects.EffectivelyOnce},
		{Guarantee: effects.EffectivelyOnce, Enforcer: "x", DuplicateWindow: window},
		{Guarantee: effects.AtLeastOnce, Enforcer: "x"},
		{Guarantee: effects.AtLeastOnce, Enforcer: "x", DuplicateWindow: effects.Window{Trigger: effects.AnyRedelivery}},
		{Guarantee: effects.Guarantee(7), Enforcer: "x"},
		{Guarantee: effects.EffectivelyOnce, Enforcer: "x", Horizon: -time.Second},
		{Guarantee: effects.EffectivelyOnce, Enforcer: "x", HorizonAssumed: true},
	}
	for _, c := range invalid {
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "invalid contract: ") {
			t.Errorf("%+v: Validate() = %v, want an invalid contract", c, err)
		}
	}
}

func TestContractWeaker(t *testing.T) {
	pg := effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "pg", DetectsKeyReuse: true}
	stripe := effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "stripe", Horizon: 24 * time.Hour, DetectsKeyReuse: true}
	mail := effects.Contract{Guarantee: effects.AtLeastOnce, Enforcer: "smtp", DuplicateWindow: effects.Window{Trigger: effects.AfterUnknownOutcome, Between: "x"}}
	blind := effects.Contract{Guarantee: effects.AtLeastOnce, Enforcer: "none", DuplicateWindow: effects.Window{Trigger: effects.AnyRedelivery, Between: "x"}}
	order := []effects.Contract{blind, mail, stripe, pg} // weakest first
	for i := range order {
		for j := range order {
			if got, want := order[i].Weaker(order[j]), i < j; got != want {
				t.Errorf("%s.Weaker(%s) = %v, want %v", order[i].Enforcer, order[j].Enforcer, got, want)
			}
		}
	}
	if !strings.Contains(mail.String(), "after an unknown outcome") || !strings.Contains(stripe.String(), "24h0m0s") {
		t.Errorf("String: %q / %q", mail, stripe)
	}
	guessed := stripe
	guessed.HorizonAssumed = true
	if s := guessed.String(); !strings.Contains(s, "24h0m0s (assumed") {
		t.Errorf("an assumed horizon is not marked as one: %q", s)
	}
}

func TestFingerprint(t *testing.T) {
	a := effects.Fingerprint([]byte("ab"), []byte("c"))
	b := effects.Fingerprint([]byte("a"), []byte("bc"))
	if string(a) == string(b) {
		t.Fatal("length prefixes missing: (ab,c) == (a,bc)")
	}
	type in struct {
		Cents int
		Meta  map[string]string
	}
	x, err := effects.FingerprintJSON(in{100, map[string]string{"b": "2", "a": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	y, _ := effects.FingerprintJSON(in{100, map[string]string{"a": "1", "b": "2"}})
	z, _ := effects.FingerprintJSON(in{101, map[string]string{"a": "1", "b": "2"}})
	if string(x) != string(y) || string(x) == string(z) {
		t.Fatal("FingerprintJSON is not a deterministic function of the value")
	}
	if _, err := effects.FingerprintJSON(func() {}); err == nil {
		t.Fatal("FingerprintJSON of a func succeeded")
	}
	// Invalid UTF-8 is refused rather than folded into U+FFFD; a real
	// U+FFFD, and a backslash followed by "ufffd", are fine and distinct.
	for _, bad := range []any{"evt-\xff", map[string]int{"k\xfe": 1}, []string{"ok", "\xc3"}} {
		if _, err := effects.FingerprintJSON(bad); !errors.Is(err, effects.ErrPoison) || !strings.Contains(err.Error(), "invalid UTF-8") {
			t.Errorf("FingerprintJSON(%q) = %v, want ErrPoison for invalid UTF-8", bad, err)
		}
	}
	a, errA := effects.FingerprintJSON("evt-\ufffd")
	b, errB := effects.FingerprintJSON(`evt-\ufffd`)
	if errA != nil || errB != nil || string(a) == string(b) {
		t.Errorf("valid strings: %v, %v, equal %v", errA, errB, string(a) == string(b))
	}
}
