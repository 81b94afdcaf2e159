package observe_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"effectively.dev/effects"
	"effectively.dev/observe"
)

// nopEffect replays at once: the cheapest possible Apply, so that what the
// benchmark measures is the observing around it.
type nopEffect struct{}

func (nopEffect) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "none"}
}

func (nopEffect) Apply(context.Context, effects.Key, string) (effects.Result, error) {
	return effects.Result{Status: effects.Replayed}, nil
}

// BenchmarkObserve compares one Apply of a do-nothing effect, plain and
// wrapped in effects.Observe with observers of increasing cost:
//
//	plain            the effect itself
//	observe-nil      effects.Observe(name, eff, nil): returns eff itself
//	func-observer    effects.Observe with an empty ObserverFunc: the cost of the core wrapper (two clock reads)
//	new-no-options   observe.New(): the global MeterProvider with none installed, slog.Default (Info: applied not enabled)
//	noop-discard     observe.New(noop MeterProvider, a logger on slog.DiscardHandler)
//	sdk-metrics      an SDK MeterProvider with a ManualReader, no logger
//	sdk-metrics+log  the same plus a TextHandler at Debug writing to io.Discard
func BenchmarkObserve(b *testing.B) {
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	textLogger := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var eff effects.Effect[string] = nopEffect{}
	cases := []struct {
		name string
		eff  effects.Effect[string]
	}{
		{"plain", eff},
		{"observe-nil", effects.Observe("e", eff, nil)},
		{"func-observer", effects.Observe("e", eff, effects.ObserverFunc(func(context.Context, effects.Event) {}))},
		{"new-no-options", effects.Observe("e", eff, mustNew(b))},
		{"noop-discard", effects.Observe("e", eff, mustNew(b,
			observe.WithMeterProvider(noop.NewMeterProvider()),
			observe.WithLogger(slog.New(slog.DiscardHandler))))},
		{"sdk-metrics", effects.Observe("e", eff, mustNew(b, observe.WithMeterProvider(provider)))},
		{"sdk-metrics+log", effects.Observe("e", eff, mustNew(b,
			observe.WithMeterProvider(provider),
			observe.WithLogger(textLogger)))},
	}
	ctx := context.Background()
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.eff.Apply(ctx, "billing:evt_1:ledger", "x"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkObserverObserve measures Observer.Observe alone, without the
// clock reads of the effects.Observe wrapper: what this package adds.
func BenchmarkObserverObserve(b *testing.B) {
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	cases := []struct {
		name string
		obs  effects.Observer
	}{
		{"nil-observer", (*observe.Observer)(nil)},
		{"new-no-options", mustNew(b)},
		{"noop-discard", mustNew(b, observe.WithMeterProvider(noop.NewMeterProvider()), observe.WithLogger(slog.New(slog.DiscardHandler)))},
		{"sdk-metrics", mustNew(b, observe.WithMeterProvider(provider))},
	}
	ctx := context.Background()
	ev := effects.Event{Kind: effects.EventReplayed, Effect: "e", Key: "billing:evt_1:ledger", Duration: 1234}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.obs.Observe(ctx, ev)
			}
		})
	}
}

// mustNew builds an Observer for a benchmark or fails it.
func mustNew(b *testing.B, opts ...observe.Option) *observe.Observer {
	b.Helper()
	obs, err := observe.New(opts...)
	if err != nil {
		b.Fatal(err)
	}
	return obs
}
