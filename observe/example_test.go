package observe_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"effectively.dev/effects"
	"effectively.dev/observe"
)

// ledger is a toy effect: a map under a mutex is its backend and its dedup
// record.
type ledger struct {
	mu   sync.Mutex
	rows map[effects.Key]int
}

func (l *ledger) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "memory: map key under a mutex"}
}

func (l *ledger) Apply(_ context.Context, key effects.Key, cents int) (effects.Result, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.rows[key]; ok {
		return effects.Result{Status: effects.Replayed}, nil
	}
	l.rows[key] = cents
	return effects.Result{Status: effects.Applied}, nil
}

// Wire one Observer into an effect and a plan; a Consumer takes the same
// Observer. The logger here prints every level; in production Debug
// (applied, replayed) is usually filtered out.
func Example() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Key {
			case slog.TimeKey: // a fixed time, so the output is stable
				return slog.Time(slog.TimeKey, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
			case observe.AttrDuration: // varies from run to run
				return slog.Attr{}
			}
			return a
		},
	}))
	obs, err := observe.New(
		observe.WithLogger(logger),
		observe.WithMeterProvider(noop.NewMeterProvider()), // metrics: see the next example
	)
	if err != nil {
		panic(err)
	}

	// The plan reports each step with its name; effects.Observe would
	// report each Apply with the effect's name instead.
	plan, err := effects.NewPlan("billing", effects.EventStep("ledger", effects.Effect[int](&ledger{rows: map[effects.Key]int{}})))
	if err != nil {
		panic(err)
	}
	plan = plan.WithObserver(obs)
	ctx := context.Background()
	for range 2 { // the broker delivers evt_1 twice
		if _, err := plan.Run(ctx, "evt_1", 1999); err != nil {
			panic(err)
		}
	}

	// What a Consumer reports when it gives up on a poison message.
	obs.Observe(ctx, effects.Event{Kind: effects.EventDeadLettered, DeliveryID: "evt_2", Attempt: 5, Err: errors.New("malformed body")})

	// Output:
	// time=2026-01-02T03:04:05.000Z level=DEBUG msg="effectively: applied" outcome=applied step=ledger key=billing:evt_1:ledger delivery_id=evt_1
	// time=2026-01-02T03:04:05.000Z level=DEBUG msg="effectively: replayed" outcome=replayed step=ledger key=billing:evt_1:ledger delivery_id=evt_1
	// time=2026-01-02T03:04:05.000Z level=ERROR msg="effectively: dead_lettered" outcome=dead_lettered delivery_id=evt_2 attempt=5 error="malformed body"
}

// Count outcomes with an OpenTelemetry SDK; here a ManualReader stands in
// for a Prometheus or OTLP exporter.
func ExampleWithMeterProvider() {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(context.Background())

	obs, err := observe.New(
		observe.WithMeterProvider(provider),
		observe.WithAttributes(attribute.String("pipeline", "chargehook")),
	)
	if err != nil {
		panic(err)
	}
	eff := effects.Observe("ledger", effects.Effect[int](&ledger{rows: map[effects.Key]int{}}), obs)
	for range 3 { // one apply, two redeliveries absorbed
		if _, err := eff.Apply(context.Background(), "billing:evt_1:ledger", 1999); err != nil {
			panic(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range sum.DataPoints {
					outcome, _ := dp.Attributes.Value("outcome")
					fmt.Printf("%s{outcome=%s} %d\n", m.Name, outcome.AsString(), dp.Value)
				}
			}
		}
	}
	// Unordered output:
	// effectively.events{outcome=applied} 1
	// effectively.events{outcome=replayed} 2
}
