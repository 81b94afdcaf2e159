package httpkey_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/httpkey"
	"effectively.dev/httpkey/httpkeytest"
)

// horizonHolds checks a declared horizon H on the objects the server
// creates, without a replay signal: a key applied, aged to just inside H
// and applied again must create nothing more (the server still holds
// it), and aged past H and applied again must create one more object
// (the aging reached the server's key store: an Age that changes nothing
// the server reads proves nothing). It is the check the conformance
// suite's horizon scenario makes for a contract with a replay signal,
// made on the server's count where Apply reports every success Applied.
func horizonHolds(ctx context.Context, h *harness, key effects.Key) error {
	horizon := h.keys.Contract().Horizon
	margin := min(max(horizon/20, time.Second), time.Minute)
	in := h.Input(key, 0)
	count := func() int { n, _ := h.Count(ctx, key); return n }
	if _, err := h.keys.Apply(ctx, key, in); err != nil {
		return fmt.Errorf("first Apply: %w", err)
	}
	if err := h.Age(ctx, horizon-margin); err != nil {
		return err
	}
	if _, err := h.keys.Apply(ctx, key, in); err != nil {
		return fmt.Errorf("redelivery %v inside the declared horizon of %v: %w", margin, horizon, err)
	}
	if n := count(); n != 1 {
		return fmt.Errorf("redelivery %v inside the declared horizon of %v: the server holds %d objects for the key: it forgot the key early", margin, horizon, n)
	}
	if err := h.Age(ctx, 2*margin); err != nil {
		return err
	}
	if _, err := h.keys.Apply(ctx, key, in); err != nil {
		return fmt.Errorf("redelivery %v past the horizon: %w", margin, err)
	}
	if n := count(); n != 2 {
		return fmt.Errorf("redelivery %v past the declared horizon of %v: the server holds %d objects, want 2: the aging did not reach its key store, so the horizon is unverified", margin, horizon, n)
	}
	return nil
}

// Without a replay signal the suite's horizon scenario has nothing to
// check (Apply reports every success Applied), so a server that forgets
// keys early would pass it. This test checks the horizon on the kit's
// objects instead, for every preset without a signal: each holds its key
// for the declared horizon and forgets it after, through the kit's own
// clock; a server that forgets keys after 10 seconds behind a preset
// declaring 24 hours is caught; and an Ager that moves only the journal's
// clock, not the server's, is caught as not verifying anything.
func TestHorizonWithoutSignal(t *testing.T) {
	ctx := context.Background()
	for _, p := range presets {
		t.Run(p.name, func(t *testing.T) {
			h := newHarness(t, p, false)
			if h.keys.Contract().Guarantee == effects.EffectivelyOnce {
				return // a replay signal: the suite's horizon scenario checks it
			}
			if err := horizonHolds(ctx, h, "horizon-"+effects.Key(p.name)); err != nil {
				t.Errorf("%s against the kit playing its provider: %v", p.name, err)
			}
		})
	}
	t.Run("forgetful server", func(t *testing.T) {
		p := preset{server: []httpkeytest.Option{httpkeytest.IETF(), httpkeytest.WithHorizon(10 * time.Second)},
			effect: []httpkey.Option{httpkey.IETF(), httpkey.WithHorizon(24 * time.Hour)}}
		err := horizonHolds(ctx, newHarness(t, p, false), "forgotten")
		if err == nil {
			t.Fatal("a server keeping keys 10 s behind a declared 24 h passed")
		}
		t.Logf("caught: %v", err)
	})
	t.Run("Ager that misses the key store", func(t *testing.T) {
		p := preset{server: []httpkeytest.Option{httpkeytest.IETF()},
			effect: []httpkey.Option{httpkey.IETF(), httpkey.WithHorizon(httpkeytest.DefaultHorizon)}}
		h := newHarness(t, p, false)
		blind := &blindAger{h}
		err := horizonHolds(ctx, h.with(blind), "unaged")
		if err == nil {
			t.Fatal("an Age that never reached the server verified the horizon")
		}
		t.Logf("caught: %v", err)
	})
}

// blindAger ages only a clock the server does not read.
type blindAger struct{ h *harness }

func (b *blindAger) Age(_ context.Context, d time.Duration) error {
	b.h.clock.advance(d)
	return nil
}

// with returns a copy of h whose Age is a's.
func (h *harness) with(a conformance.Ager) *harness {
	c := *h
	c.ager = a
	return &c
}
