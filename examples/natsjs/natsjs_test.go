package natsjs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"effectively.dev/conformance"
	"effectively.dev/effects"

	"example.com/natsjs"
)

// env is one test's stream on its own server, with a Publisher whose
// connection goes through f (to count round trips or inject faults).
type env struct {
	t *testing.T
	h *harness
	f *conformance.Faults
	p effects.Effect[natsjs.Message]
}

func newEnv(t *testing.T, cfg jetstream.StreamConfig) *env {
	t.Helper()
	h := newHarness(t, startServer(t), cfg)
	f := new(conformance.Faults)
	p, closeFn, err := h.Make(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeFn)
	return &env{t: t, h: h, f: f, p: p}
}

func (e *env) count(key effects.Key) int {
	e.t.Helper()
	n, err := e.h.Count(context.Background(), key)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func TestRedeliveryReplaysTheFirstMessage(t *testing.T) {
	e := newEnv(t, jetstream.StreamConfig{})
	ctx := context.Background()
	key := effects.MustKey("billing", "evt_1", "event")
	first, err := e.p.Apply(ctx, key, e.h.Input(key, 0))
	if err != nil || first.Status != effects.Applied || !strings.HasSuffix(first.Ref, "/1") {
		t.Fatalf("first Apply = %+v, %v; want applied as sequence 1", first, err)
	}
	again, err := e.p.Apply(ctx, key, e.h.Input(key, 0))
	if err != nil || again.Status != effects.Replayed || again.Ref != first.Ref {
		t.Fatalf("redelivery = %+v, %v; want replayed with %s", again, err, first.Ref)
	}
	if n := e.count(key); n != 1 {
		t.Errorf("%d messages stored, want 1", n)
	}
}

func TestKeyReuseIsDetected(t *testing.T) {
	e := newEnv(t, jetstream.StreamConfig{})
	ctx := context.Background()
	key := effects.MustKey("billing", "evt_2", "event")
	if _, err := e.p.Apply(ctx, key, e.h.Input(key, 0)); err != nil {
		t.Fatal(err)
	}
	_, err := e.p.Apply(ctx, key, e.h.Input(key, 1))
	if !errors.Is(err, effects.ErrKeyReused) || effects.ClassOf(err) == effects.Retryable {
		t.Fatalf("other payload under the key: %v, want a permanent ErrKeyReused", err)
	}
	if n := e.count(key); n != 1 {
		t.Errorf("%d messages stored, want 1", n)
	}
}

// The contract's horizon is the stream's duplicate window, and it is real:
// a redelivery inside it replays, one after it publishes again. (This is
// how a horizon scenario can age a key: a stream with a short window.)
func TestHorizonIsTheDuplicateWindow(t *testing.T) {
	const window = 300 * time.Millisecond
	e := newEnv(t, jetstream.StreamConfig{Duplicates: window})
	if got := e.p.Contract().Horizon; got != window {
		t.Fatalf("Contract().Horizon = %v, want the stream's window %v", got, window)
	}
	if err := e.p.Contract().Validate(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := effects.MustKey("billing", "evt_3", "event")
	if _, err := e.p.Apply(ctx, key, e.h.Input(key, 0)); err != nil {
		t.Fatal(err)
	}
	if res, err := e.p.Apply(ctx, key, e.h.Input(key, 0)); err != nil || res.Status != effects.Replayed {
		t.Fatalf("redelivery inside the window = %+v, %v; want replayed", res, err)
	}
	time.Sleep(3 * window) // the server prunes expired ids on a timer
	res, err := e.p.Apply(ctx, key, e.h.Input(key, 0))
	if err != nil || res.Status != effects.Applied {
		t.Fatalf("redelivery after the window = %+v, %v; want applied again", res, err)
	}
	if n := e.count(key); n != 2 {
		t.Errorf("%d messages after the window, want 2: the horizon is where the guarantee ends", n)
	}
}

func TestDefaultWindowIsTwoMinutes(t *testing.T) {
	e := newEnv(t, jetstream.StreamConfig{})
	if got := e.p.Contract().Horizon; got != 2*time.Minute {
		t.Errorf("Horizon = %v, want the server's default window, 2m", got)
	}
}

// Bad input is refused before any round trip, and nothing is stored.
func TestBadInputIsRefusedBeforeAnyIO(t *testing.T) {
	e := newEnv(t, jetstream.StreamConfig{})
	ctx := context.Background()
	trips := e.f.RoundTrips()
	key := effects.MustKey("billing", "evt_4", "event")
	withHeader := func(name string) natsjs.Message {
		m := e.h.Input(key, 0)
		m.Header = nats.Header{name: {"x"}}
		return m
	}
	for _, c := range []struct {
		name string
		key  effects.Key
		msg  natsjs.Message
		want error
	}{
		{"empty key", "", e.h.Input("", 0), effects.ErrInvalidKey},
		{"control character", "evt\n5", e.h.Input("evt\n5", 0), effects.ErrInvalidKey},
		{"Nats-Msg-Id header", key, withHeader("Nats-Msg-Id"), natsjs.ErrReservedHeader},
		{"fingerprint header", key, withHeader("effectively-fingerprint"), natsjs.ErrReservedHeader},
	} {
		if _, err := e.p.Apply(ctx, c.key, c.msg); !errors.Is(err, c.want) || effects.ClassOf(err) == effects.Retryable {
			t.Errorf("%s: %v, want %v, not retryable", c.name, err, c.want)
		}
	}
	if n := e.f.RoundTrips() - trips; n != 0 {
		t.Errorf("%d round trips for refused input, want 0", n)
	}
	if n, err := e.h.Total(ctx); err != nil || n != 0 {
		t.Errorf("%d messages stored (%v), want 0", n, err)
	}
}

// A subject no stream listens on gets "no responders": nothing was stored,
// so the error is ErrTransient.
func TestSubjectWithoutStreamIsTransient(t *testing.T) {
	e := newEnv(t, jetstream.StreamConfig{})
	_, err := e.p.Apply(context.Background(), "k", natsjs.Message{Subject: "nobody.listens", Data: []byte("x")})
	if !errors.Is(err, effects.ErrTransient) {
		t.Fatalf("publish to an unbound subject: %v, want ErrTransient", err)
	}
}

// A lost acknowledgement is ErrAmbiguous after the ack timeout, not after
// the caller's whole deadline: the hang a first version of this adapter had
// (the client reconnects, but the reply to a request sent on the dropped
// connection never comes).
func TestLostAckIsAmbiguousWithinTheAckTimeout(t *testing.T) {
	e := newEnv(t, jetstream.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := effects.MustKey("billing", "evt_6", "event")
	e.f.Arm(e.f.RoundTrips()+1, conformance.DropReply, nil)
	start := time.Now()
	_, err := e.p.Apply(ctx, key, e.h.Input(key, 0))
	if !e.f.Fired() || !errors.Is(err, effects.ErrAmbiguous) {
		t.Fatalf("Apply with its ack lost: %v (fault fired %t), want ErrAmbiguous", err, e.f.Fired())
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Apply took %v to give up, want about the 1s ack timeout", d)
	}
	res, err := e.p.Apply(ctx, key, e.h.Input(key, 0)) // the same instance, reconnected
	if err != nil || res.Status != effects.Replayed {
		t.Fatalf("retry after the lost ack = %+v, %v; want the stored message replayed", res, err)
	}
}

func TestNewRefusesBadArguments(t *testing.T) {
	srv := startServer(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		js     jetstream.JetStream
		stream string
		opts   []natsjs.Option
		option string
	}{
		{"nil js", nil, "s", nil, "js, stream"},
		{"empty stream", js, "", nil, "js, stream"},
		{"zero ack timeout", js, "s", []natsjs.Option{natsjs.WithAckTimeout(0)}, "WithAckTimeout"},
	} {
		_, err := natsjs.New(ctx, c.js, c.stream, c.opts...)
		var ce *effects.ConfigError
		if !errors.As(err, &ce) || ce.Option != c.option {
			t.Errorf("%s: %v, want a ConfigError about %s", c.name, err, c.option)
		}
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "short", Subjects: []string{"short.>"}, Duplicates: time.Second}); err != nil {
		t.Fatal(err)
	}
	_, err = natsjs.New(ctx, js, "short", natsjs.WithAckTimeout(time.Second))
	var ce *effects.ConfigError
	if !errors.As(err, &ce) || ce.Option != "WithAckTimeout" || !strings.Contains(err.Error(), "duplicate window") {
		t.Errorf("an ack timeout as long as the window: %v, want a ConfigError naming the window", err)
	}
	if _, err := natsjs.New(ctx, js, "missing"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("unknown stream: %v, want ErrStreamNotFound", err)
	}
}
