package observe_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"effectively.dev/effects"
	"effectively.dev/observe"
)

// applyAll runs the sequence every metrics test uses on an observed
// effect: 2 applied, 3 replayed, 1 key_reused, 2 in_flight, 1 failed.
func applyAll(t *testing.T, eff effects.Effect[string]) {
	t.Helper()
	ctx := context.Background()
	for _, c := range []struct {
		key, in string
		want    error
	}{
		{"k1", "a", nil}, {"k1", "a", nil}, {"k2", "b", nil}, {"k1", "a", nil}, {"k2", "b", nil},
		{"reused", "c", effects.ErrKeyReused},
		{"busy", "d", effects.ErrInFlight}, {"busy", "d", effects.ErrInFlight},
		{"k3", "fail", errAny},
	} {
		_, err := eff.Apply(ctx, effects.Key(c.key), c.in)
		switch {
		case c.want == nil && err != nil:
			t.Fatalf("Apply(%s): %v", c.key, err)
		case c.want == errAny && err == nil, c.want != nil && c.want != errAny && !errors.Is(err, c.want):
			t.Fatalf("Apply(%s) = %v, want %v", c.key, err, c.want)
		}
	}
}

var errAny = errors.New("any error")

// consumerEvents are what a Consumer reports: delivery "d-7" fails three
// times, is retried after the first two and dead-lettered after the
// third; "d-8" is handled but its Ack fails (no handler duration).
func consumerEvents() []effects.Event {
	boom := errors.New("handler: backend on fire")
	return []effects.Event{
		{Kind: effects.EventRetried, DeliveryID: "d-7", Attempt: 1, Duration: 3 * time.Millisecond, Err: boom},
		{Kind: effects.EventRetried, DeliveryID: "d-7", Attempt: 2, Duration: 5 * time.Millisecond, Err: boom},
		{Kind: effects.EventDeadLettered, DeliveryID: "d-7", Attempt: 3, Duration: 4 * time.Millisecond, Err: boom},
		{Kind: effects.EventFailed, DeliveryID: "d-8", Attempt: 1, Err: errors.New("ack failed")},
	}
}

func TestMetrics(t *testing.T) {
	t.Run("counts every outcome of a wrapped effect, a plan and a consumer", func(t *testing.T) {
		mf := newMeterFixture(t)
		obs, err := observe.New(observe.WithMeterProvider(mf.provider))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()

		applyAll(t, effects.Observe("ledger", effects.Effect[string](newScriptedEffect()), obs))

		// A plan of two steps, run for the same message three times: both
		// steps apply once, then replay twice.
		plain := newScriptedEffect()
		plan, err := effects.NewPlan("billing",
			effects.NewStep("charge", effects.Effect[string](plain), func(string, effects.Results) (string, error) { return "x", nil }),
			effects.NewStep("receipt", effects.Effect[string](plain), func(string, effects.Results) (string, error) { return "y", nil }))
		if err != nil {
			t.Fatal(err)
		}
		plan = plan.WithObserver(obs)
		for range 3 {
			if _, err := plan.Run(ctx, "evt-1", "event"); err != nil {
				t.Fatal(err)
			}
		}

		for _, ev := range consumerEvents() {
			obs.Observe(ctx, ev)
		}

		got := mf.collect(t)
		want := map[string]int64{
			"effect=ledger,outcome=applied":    2,
			"effect=ledger,outcome=replayed":   3,
			"effect=ledger,outcome=key_reused": 1,
			"effect=ledger,outcome=in_flight":  2,
			"effect=ledger,outcome=failed":     1,
			"outcome=applied,step=charge":      1,
			"outcome=replayed,step=charge":     2,
			"outcome=applied,step=receipt":     1,
			"outcome=replayed,step=receipt":    2,
			"outcome=failed":                   1,
			"outcome=retried":                  2,
			"outcome=dead_lettered":            1,
		}
		if !maps.Equal(got.counts, want) {
			t.Errorf("%s by attributes:\n got %v\nwant %v", observe.EventsMetric, got.counts, want)
		}
		// Every event with a duration is timed once; the failed Ack has
		// none, so it is counted but not timed.
		wantTimed := map[string]uint64{}
		for k, v := range want {
			wantTimed[k] = uint64(v)
		}
		delete(wantTimed, "outcome=failed")
		if !maps.Equal(got.histCount, wantTimed) {
			t.Errorf("%s counts by attributes:\n got %v\nwant %v", observe.DurationMetric, got.histCount, wantTimed)
		}
		if s := got.histSum["outcome=retried"]; math.Abs(s-0.008) > 1e-9 {
			t.Errorf("%s sum for retried = %v s, want 0.008 s", observe.DurationMetric, s)
		}
		if got.units[observe.EventsMetric] != "{event}" || got.units[observe.DurationMetric] != "s" {
			t.Errorf("units = %v, want {event} and s", got.units)
		}
		if !got.scopes[observe.ScopeName] || len(got.scopes) != 1 {
			t.Errorf("scopes = %v, want only %q", got.scopes, observe.ScopeName)
		}
	})

	t.Run("WithAttributes adds to every point", func(t *testing.T) {
		mf := newMeterFixture(t)
		obs, err := observe.New(
			observe.WithMeterProvider(mf.provider),
			observe.WithAttributes(attribute.String("pipeline", "chargehook")),
			observe.WithAttributes(attribute.Int("shard", 3)),
		)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		obs.Observe(ctx, effects.Event{Kind: effects.EventApplied, Effect: "s3.put", Duration: time.Millisecond})
		obs.Observe(ctx, effects.Event{Kind: effects.EventReplayed, Step: "receipt", Duration: time.Millisecond})
		obs.Observe(ctx, effects.Event{Kind: effects.EventDeadLettered})
		got := mf.collect(t)
		want := map[string]int64{
			"effect=s3.put,outcome=applied,pipeline=chargehook,shard=3": 1,
			"outcome=replayed,pipeline=chargehook,shard=3,step=receipt": 1,
			"outcome=dead_lettered,pipeline=chargehook,shard=3":         1,
		}
		if !maps.Equal(got.counts, want) {
			t.Errorf("got %v\nwant %v", got.counts, want)
		}
		if !maps.Equal(got.histCount, map[string]uint64{
			"effect=s3.put,outcome=applied,pipeline=chargehook,shard=3": 1,
			"outcome=replayed,pipeline=chargehook,shard=3,step=receipt": 1,
		}) {
			t.Errorf("histogram counts %v", got.histCount)
		}
	})

	t.Run("WithAttributes refuses the Observer's own keys", func(t *testing.T) {
		for _, key := range []string{"effect", "step", "outcome"} {
			_, err := observe.New(observe.WithAttributes(attribute.String("pipeline", "p"), attribute.String(key, "bogus")))
			var ce *effects.ConfigError
			if !errors.As(err, &ce) || ce.Option != "WithAttributes" || !errors.Is(err, effects.ErrInvalidConfig) {
				t.Errorf("New(WithAttributes(%s=...)) = %v, want a ConfigError about WithAttributes", key, err)
			}
		}
	})

	t.Run("the histogram records seconds", func(t *testing.T) {
		mf := newMeterFixture(t)
		obs, err := observe.New(observe.WithMeterProvider(mf.provider))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range []time.Duration{1500 * time.Millisecond, 250 * time.Millisecond, 0} {
			obs.Observe(context.Background(), effects.Event{Kind: effects.EventApplied, Effect: "e", Duration: d})
		}
		got := mf.collect(t)
		if n, s := got.histCount["effect=e,outcome=applied"], got.histSum["effect=e,outcome=applied"]; n != 2 || math.Abs(s-1.75) > 1e-9 {
			t.Errorf("histogram count %d sum %v, want 2 and 1.75", n, s)
		}
		if c := got.counts["effect=e,outcome=applied"]; c != 3 {
			t.Errorf("count %d, want 3", c)
		}
	})

	t.Run("more distinct names than the cache holds are all counted", func(t *testing.T) {
		mf := newMeterFixture(t)
		obs, err := observe.New(observe.WithMeterProvider(mf.provider))
		if err != nil {
			t.Fatal(err)
		}
		const names = 1500 // more than the cache's bound
		for round := range 2 {
			for i := range names {
				obs.Observe(context.Background(), effects.Event{Kind: effects.EventApplied, Effect: fmt.Sprint("e", i), Duration: time.Duration(round + 1)})
			}
		}
		got := mf.collect(t)
		if len(got.counts) != names {
			t.Fatalf("%d series, want %d", len(got.counts), names)
		}
		for k, v := range got.counts {
			if v != 2 {
				t.Fatalf("%s = %d, want 2", k, v)
			}
		}
	})

	t.Run("New without a provider forwards to the global one installed later", func(t *testing.T) {
		prev := otel.GetMeterProvider()
		t.Cleanup(func() { otel.SetMeterProvider(prev) })
		obs, err := observe.New() // before any provider is installed
		if err != nil {
			t.Fatal(err)
		}
		obs.Observe(context.Background(), effects.Event{Kind: effects.EventApplied, Effect: "early"}) // dropped
		mf := newMeterFixture(t)
		otel.SetMeterProvider(mf.provider)
		obs.Observe(context.Background(), effects.Event{Kind: effects.EventReplayed, Effect: "late"})
		want := map[string]int64{"effect=late,outcome=replayed": 1}
		if got := mf.collect(t).counts; !maps.Equal(got, want) {
			t.Errorf("got %v, want %v", got, want)
		}
	})

	t.Run("New fails when the meter refuses an instrument", func(t *testing.T) {
		_, err := observe.New(observe.WithMeterProvider(refusingProvider{}))
		if err == nil || !errors.Is(err, errRefused) {
			t.Fatalf("New = %v, want an error wrapping %v", err, errRefused)
		}
	})
}

// refusingProvider's meter fails to create instruments.
type refusingProvider struct{ noop.MeterProvider }

var errRefused = errors.New("instrument refused")

func (refusingProvider) Meter(string, ...metric.MeterOption) metric.Meter { return refusingMeter{} }

type refusingMeter struct{ noop.Meter }

func (refusingMeter) Int64Counter(string, ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return noop.Int64Counter{}, errRefused
}

func TestLogs(t *testing.T) {
	t.Run("one record per event with its attributes, at the kind's level", func(t *testing.T) {
		rec := &recorder{level: slog.LevelDebug}
		obs, err := observe.New(observe.WithLogger(slog.New(rec)), observe.WithMeterProvider(noop.NewMeterProvider()))
		if err != nil {
			t.Fatal(err)
		}
		applyAll(t, effects.Observe("ledger", effects.Effect[string](newScriptedEffect()), obs))
		for _, ev := range consumerEvents() {
			obs.Observe(context.Background(), ev)
		}

		type want struct {
			level slog.Level
			attrs map[string]string
		}
		ledger := func(outcome, key string) map[string]string {
			return map[string]string{"outcome": outcome, "effect": "ledger", "key": key}
		}
		consumer := func(outcome, id, attempt string) map[string]string {
			return map[string]string{"outcome": outcome, "delivery_id": id, "attempt": attempt}
		}
		wants := []want{
			{slog.LevelDebug, ledger("applied", "k1")},
			{slog.LevelDebug, ledger("replayed", "k1")},
			{slog.LevelDebug, ledger("applied", "k2")},
			{slog.LevelDebug, ledger("replayed", "k1")},
			{slog.LevelDebug, ledger("replayed", "k2")},
			{slog.LevelError, ledger("key_reused", "reused")},
			{slog.LevelInfo, ledger("in_flight", "busy")},
			{slog.LevelInfo, ledger("in_flight", "busy")},
			{slog.LevelWarn, ledger("failed", "k3")},
			{slog.LevelInfo, consumer("retried", "d-7", "1")},
			{slog.LevelInfo, consumer("retried", "d-7", "2")},
			{slog.LevelError, consumer("dead_lettered", "d-7", "3")},
			{slog.LevelWarn, consumer("failed", "d-8", "1")},
		}
		got := rec.records()
		if len(got) != len(wants) {
			t.Fatalf("%d records, want %d", len(got), len(wants))
		}
		for i, w := range wants {
			g := got[i]
			outcome := w.attrs["outcome"]
			if g.level != w.level || g.msg != "effectively: "+outcome {
				t.Errorf("record %d: level %v msg %q, want %v %q", i, g.level, g.msg, w.level, "effectively: "+outcome)
			}
			// duration and error are checked below; the rest exactly.
			rest := maps.Clone(g.attrs)
			delete(rest, observe.AttrDuration)
			delete(rest, observe.AttrError)
			if !maps.Equal(rest, w.attrs) {
				t.Errorf("record %d: attrs %v, want %v (plus duration, error)", i, rest, w.attrs)
			}
			isFailure := outcome != "applied" && outcome != "replayed"
			if _, has := g.attrs[observe.AttrError]; has != isFailure {
				t.Errorf("record %d (%s): has error %v, want %v", i, outcome, has, isFailure)
			}
			ackFailure := g.attrs[observe.AttrDeliveryID] == "d-8"
			if _, has := g.attrs[observe.AttrDuration]; has != !ackFailure || (has && g.duration <= 0) {
				t.Errorf("record %d (%s): duration %v (present %v)", i, outcome, g.duration, has)
			}
		}
		// The error attribute keeps the error value, so a handler can
		// reach its kind.
		if e := got[5].err; !errors.Is(e, effects.ErrKeyReused) {
			t.Errorf("key_reused record's error = %v, want one wrapping ErrKeyReused", e)
		}
	})

	t.Run("attributes come in a fixed order", func(t *testing.T) {
		rec := &recorder{level: slog.LevelDebug}
		obs, err := observe.New(observe.WithLogger(slog.New(rec)), observe.WithMeterProvider(noop.NewMeterProvider()))
		if err != nil {
			t.Fatal(err)
		}
		obs.Observe(context.Background(), effects.Event{
			Kind: effects.EventFailed, Effect: "e", Step: "s", Key: "k", DeliveryID: "d", Attempt: 4,
			Duration: time.Second, Err: errors.New("x"),
		})
		want := []string{"outcome", "effect", "step", "key", "delivery_id", "attempt", "duration", "error"}
		if got := rec.records()[0].order; !slices.Equal(got, want) {
			t.Errorf("attribute order %v, want %v", got, want)
		}
	})

	t.Run("a pruned event logs its count", func(t *testing.T) {
		rec := &recorder{level: slog.LevelDebug}
		obs, err := observe.New(observe.WithLogger(slog.New(rec)), observe.WithMeterProvider(noop.NewMeterProvider()))
		if err != nil {
			t.Fatal(err)
		}
		obs.Observe(context.Background(), effects.Event{Kind: effects.EventPruned, Effect: "postgres.Pruner", Step: "billing", Count: 1000, Duration: time.Millisecond})
		got := rec.records()
		if len(got) != 1 || got[0].level != slog.LevelDebug || got[0].msg != "effectively: pruned" || got[0].attrs[observe.AttrCount] != "1000" {
			t.Errorf("records %+v, want one Debug \"effectively: pruned\" with count=1000", got)
		}
	})

	t.Run("default levels", func(t *testing.T) {
		for kind, want := range map[effects.EventKind]slog.Level{
			effects.EventApplied:      slog.LevelDebug,
			effects.EventReplayed:     slog.LevelDebug,
			effects.EventInFlight:     slog.LevelInfo,
			effects.EventRetried:      slog.LevelInfo,
			effects.EventFailed:       slog.LevelWarn,
			effects.EventKeyReused:    slog.LevelError,
			effects.EventDeadLettered: slog.LevelError,
			effects.EventPruned:       slog.LevelDebug,
			0:                         slog.LevelWarn, // unknown kinds are not hidden
			99:                        slog.LevelWarn,
		} {
			t.Run(kind.String(), func(t *testing.T) {
				rec := &recorder{level: slog.LevelDebug}
				obs, err := observe.New(observe.WithLogger(slog.New(rec)), observe.WithMeterProvider(noop.NewMeterProvider()))
				if err != nil {
					t.Fatal(err)
				}
				obs.Observe(context.Background(), effects.Event{Kind: kind})
				got := rec.records()
				if len(got) != 1 || got[0].level != want {
					t.Fatalf("records %+v, want one at %v", got, want)
				}
			})
		}
	})

	t.Run("WithLevel changes one kind's level", func(t *testing.T) {
		rec := &recorder{level: slog.LevelInfo}
		obs, err := observe.New(
			observe.WithLogger(slog.New(rec)),
			observe.WithMeterProvider(noop.NewMeterProvider()),
			observe.WithLevel(effects.EventReplayed, slog.LevelInfo),
			observe.WithLevel(effects.EventInFlight, slog.LevelDebug),
		)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []effects.EventKind{effects.EventApplied, effects.EventReplayed, effects.EventInFlight, effects.EventRetried} {
			obs.Observe(context.Background(), effects.Event{Kind: k})
		}
		var got []string
		for _, r := range rec.records() {
			got = append(got, r.attrs["outcome"]+"@"+r.level.String())
		}
		if want := []string{"replayed@INFO", "retried@INFO"}; !slices.Equal(got, want) {
			t.Errorf("got %v, want %v", got, want)
		}
	})

	t.Run("WithLevel refuses an unknown kind", func(t *testing.T) {
		for _, k := range []effects.EventKind{0, effects.EventPruned + 1} {
			_, err := observe.New(observe.WithLevel(k, slog.LevelInfo))
			var ce *effects.ConfigError
			if !errors.As(err, &ce) || ce.Op != "observe.New" || ce.Option != "WithLevel" {
				t.Errorf("New(WithLevel(%d)) = %v, want a ConfigError about WithLevel", k, err)
			}
		}
	})

	t.Run("records below the logger's level are not built", func(t *testing.T) {
		h := &countingHandler{level: slog.LevelWarn}
		obs, err := observe.New(observe.WithLogger(slog.New(h)), observe.WithMeterProvider(noop.NewMeterProvider()))
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []effects.EventKind{effects.EventApplied, effects.EventReplayed, effects.EventInFlight, effects.EventKeyReused} {
			obs.Observe(context.Background(), effects.Event{Kind: k, Effect: "e"})
		}
		if h.handled != 1 {
			t.Errorf("handled %d records, want 1 (key_reused)", h.handled)
		}
		allocs := testing.AllocsPerRun(100, func() {
			obs.Observe(context.Background(), effects.Event{Kind: effects.EventApplied, Effect: "e", Key: "k"})
		})
		if allocs != 0 {
			t.Errorf("a filtered-out event allocates %v times, want 0", allocs)
		}
	})

	t.Run("the logger sees the caller's context", func(t *testing.T) {
		type ctxKey struct{}
		h := &countingHandler{level: slog.LevelDebug}
		obs, err := observe.New(observe.WithLogger(slog.New(h)), observe.WithMeterProvider(noop.NewMeterProvider()))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.WithValue(context.Background(), ctxKey{}, "trace-1")
		obs.Observe(ctx, effects.Event{Kind: effects.EventApplied})
		if h.lastCtx == nil || h.lastCtx.Value(ctxKey{}) != "trace-1" {
			t.Error("the handler did not get the caller's context")
		}
	})
}

// countingHandler counts handled records and remembers the last context.
type countingHandler struct {
	level   slog.Level
	handled int
	lastCtx context.Context
}

func (h *countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h *countingHandler) Handle(ctx context.Context, _ slog.Record) error {
	h.handled++
	h.lastCtx = ctx
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func TestNilSafety(t *testing.T) {
	ev := effects.Event{Kind: effects.EventFailed, Effect: "e", Err: errors.New("x"), Duration: time.Millisecond}

	t.Run("a nil *Observer observes nothing", func(t *testing.T) {
		var obs *observe.Observer
		obs.Observe(context.Background(), ev)
		// Handed to effects.Observe as a non-nil interface holding nil, it
		// still works.
		eff := effects.Observe("e", effects.Effect[string](newScriptedEffect()), obs)
		if res, err := eff.Apply(context.Background(), "k", "a"); err != nil || res.Status != effects.Applied {
			t.Fatalf("Apply = %v, %v", res, err)
		}
	})

	t.Run("nil options, nil logger, nil provider", func(t *testing.T) {
		obs, err := observe.New(nil, observe.WithLogger(nil), observe.WithMeterProvider(nil))
		if err != nil {
			t.Fatal(err)
		}
		obs.Observe(context.Background(), ev)
	})

	t.Run("a nil context and a zero event", func(t *testing.T) {
		mf := newMeterFixture(t)
		rec := &recorder{level: slog.LevelDebug}
		obs, err := observe.New(observe.WithLogger(slog.New(rec)), observe.WithMeterProvider(mf.provider))
		if err != nil {
			t.Fatal(err)
		}
		//lint:ignore SA1012 a nil context is what this test is about
		obs.Observe(nil, effects.Event{})
		if got := mf.collect(t).counts; !maps.Equal(got, map[string]int64{"outcome=unknown": 1}) {
			t.Errorf("counts %v", got)
		}
		if got := rec.records(); len(got) != 1 || got[0].msg != "effectively: unknown" {
			t.Errorf("records %+v", got)
		}
	})
}

func TestConcurrentUse(t *testing.T) {
	mf := newMeterFixture(t)
	rec := &recorder{level: slog.LevelInfo}
	obs, err := observe.New(observe.WithLogger(slog.New(rec)), observe.WithMeterProvider(mf.provider))
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, perGoroutine, effectNames = 8, 300, 5
	eff := newScriptedEffect()
	wrapped := make([]effects.Effect[string], effectNames)
	for i := range wrapped {
		wrapped[i] = effects.Observe(fmt.Sprint("e", i), effects.Effect[string](eff), obs)
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range perGoroutine {
				w := wrapped[(g+i)%effectNames] // names first seen concurrently
				key := effects.Key(fmt.Sprint("k", g, "-", i))
				if i%10 == 0 {
					key = "busy"
				}
				_, _ = w.Apply(context.Background(), key, "x")
			}
		})
	}
	wg.Wait()

	var applied, inFlight int64
	for k, v := range mf.collect(t).counts {
		switch {
		case outcomeOf(k) == "outcome=applied":
			applied += v
		case outcomeOf(k) == "outcome=in_flight":
			inFlight += v
		default:
			t.Errorf("unexpected series %s=%d", k, v)
		}
	}
	total := int64(goroutines * perGoroutine)
	if inFlight != total/10 || applied != total-total/10 {
		t.Errorf("applied %d, in_flight %d; want %d and %d", applied, inFlight, total-total/10, total/10)
	}
	if n := len(rec.records()); n != int(total/10) { // in_flight at Info; applied at Debug is filtered
		t.Errorf("%d records, want %d", n, total/10)
	}
}

func outcomeOf(encoded string) string {
	for _, kv := range strings.Split(encoded, ",") {
		if strings.HasPrefix(kv, "outcome=") {
			return kv
		}
	}
	return ""
}

// TestComponentEvents: an event a component reports about its own work
// (a source's retried fetch) carries its component as a metric attribute
// and on its log record, and WithAttributes may not set it.
func TestComponentEvents(t *testing.T) {
	mf := newMeterFixture(t)
	rec := &recorder{level: slog.LevelDebug}
	obs, err := observe.New(observe.WithMeterProvider(mf.provider), observe.WithLogger(slog.New(rec)))
	if err != nil {
		t.Fatal(err)
	}
	obs.Observe(context.Background(), effects.Event{Kind: effects.EventFailed, Component: "kafka.Source", Err: errors.New("fetch: broker down")})
	if got, want := mf.collect(t).counts, map[string]int64{"component=kafka.Source,outcome=failed": 1}; !maps.Equal(got, want) {
		t.Errorf("counts %v, want %v", got, want)
	}
	if logs := rec.records(); len(logs) != 1 || logs[0].attrs[observe.AttrComponent] != "kafka.Source" || logs[0].level != slog.LevelWarn {
		t.Errorf("logged %+v, want one Warn record with component kafka.Source", logs)
	}
	if _, err := observe.New(observe.WithAttributes(attribute.String(observe.AttrComponent, "x"))); !errors.Is(err, effects.ErrInvalidConfig) {
		t.Errorf("WithAttributes(component) = %v, want a configuration error", err)
	}
}
