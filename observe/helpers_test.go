package observe_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"effectively.dev/effects"
	"effectively.dev/observe"
)

// scriptedEffect is a tiny in-memory Effect whose outcome depends on the
// key: "reused" and "busy" fail as a backend would; any key seen before
// replays; the payload "fail" fails with an unclassified error.
type scriptedEffect struct {
	mu   sync.Mutex
	done map[effects.Key]bool
}

func newScriptedEffect() *scriptedEffect {
	return &scriptedEffect{done: map[effects.Key]bool{}}
}

func (e *scriptedEffect) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "test: map under a mutex"}
}

func (e *scriptedEffect) Apply(_ context.Context, key effects.Key, in string) (effects.Result, error) {
	switch {
	case key == "reused":
		return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Op: "test.Apply", Key: key}
	case key == "busy":
		return effects.Result{}, &effects.Error{Kind: effects.ErrInFlight, Op: "test.Apply", Key: key}
	case in == "fail":
		return effects.Result{}, fmt.Errorf("backend on fire")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done[key] {
		return effects.Result{Status: effects.Replayed, Ref: "ref-" + string(key)}, nil
	}
	e.done[key] = true
	return effects.Result{Status: effects.Applied, Ref: "ref-" + string(key)}, nil
}

// meterFixture is an SDK MeterProvider with a ManualReader.
type meterFixture struct {
	reader   *sdkmetric.ManualReader
	provider *sdkmetric.MeterProvider
}

func newMeterFixture(t *testing.T) *meterFixture {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		if err := provider.Shutdown(context.Background()); err != nil {
			t.Errorf("shutting down the meter provider: %v", err)
		}
	})
	return &meterFixture{reader: reader, provider: provider}
}

// collected is one collection: per metric, per encoded attribute set
// ("effect=ledger,outcome=applied"), the counter's value or the
// histogram's count and sum.
type collected struct {
	counts    map[string]int64
	histCount map[string]uint64
	histSum   map[string]float64
	units     map[string]string
	scopes    map[string]bool
}

func (f *meterFixture) collect(t *testing.T) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect: %v", err)
	}
	c := collected{
		counts:    map[string]int64{},
		histCount: map[string]uint64{},
		histSum:   map[string]float64{},
		units:     map[string]string{},
		scopes:    map[string]bool{},
	}
	for _, sm := range rm.ScopeMetrics {
		c.scopes[sm.Scope.Name] = true
		for _, m := range sm.Metrics {
			c.units[m.Name] = m.Unit
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name != observe.EventsMetric || !d.IsMonotonic || d.Temporality != metricdata.CumulativeTemporality {
					t.Fatalf("unexpected sum %q (monotonic %v, %v)", m.Name, d.IsMonotonic, d.Temporality)
				}
				for _, dp := range d.DataPoints {
					c.counts[encode(dp.Attributes)] += dp.Value
				}
			case metricdata.Histogram[float64]:
				if m.Name != observe.DurationMetric {
					t.Fatalf("unexpected histogram %q", m.Name)
				}
				for _, dp := range d.DataPoints {
					c.histCount[encode(dp.Attributes)] += dp.Count
					c.histSum[encode(dp.Attributes)] += dp.Sum
				}
			default:
				t.Fatalf("unexpected metric %q of type %T", m.Name, m.Data)
			}
		}
	}
	return c
}

func encode(s attribute.Set) string { return s.Encoded(attribute.DefaultEncoder()) }

// recorder is a slog.Handler that keeps every record it is handed, at or
// above its level.
type recorder struct {
	level slog.Level
	mu    sync.Mutex
	recs  []slog.Record
}

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= r.level }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { panic("not used") }
func (r *recorder) WithGroup(string) slog.Handler      { panic("not used") }

func (r *recorder) records() []logged {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]logged, 0, len(r.recs))
	for _, rec := range r.recs {
		l := logged{level: rec.Level, msg: rec.Message, attrs: map[string]string{}}
		rec.Attrs(func(a slog.Attr) bool {
			l.order = append(l.order, a.Key)
			l.attrs[a.Key] = a.Value.String()
			if a.Key == observe.AttrDuration {
				l.duration = a.Value.Duration()
			}
			if a.Key == observe.AttrError {
				l.err, _ = a.Value.Any().(error)
			}
			return true
		})
		out = append(out, l)
	}
	return out
}

// logged is one captured record, its attributes as strings.
type logged struct {
	level    slog.Level
	msg      string
	attrs    map[string]string
	order    []string
	duration time.Duration
	err      error
}
