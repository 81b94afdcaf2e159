package sqlkeys

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
)

type recorder struct {
	mu  sync.Mutex
	evs []effects.Event
}

func (r *recorder) Observe(_ context.Context, ev effects.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, ev)
}

// script returns a Delete that fails once, deletes a full batch, then
// fewer (caught up), and then cancels ctx.
func script(cancel context.CancelFunc, batch int) func(context.Context, int) (int64, error) {
	step := 0
	return func(ctx context.Context, limit int) (int64, error) {
		step++
		switch step {
		case 1:
			return 0, errors.New("connection reset")
		case 2:
			return int64(batch), nil
		case 3:
			return 1, nil
		}
		cancel()
		return 0, ctx.Err()
	}
}

func newPruner(cfg PrunerConfig, del func(context.Context, int) (int64, error)) *Pruner {
	return &Pruner{Component: "x.Pruner", Scope: "billing", Config: cfg, Delete: del,
		RefusedForGood: func(err error) bool { return strings.Contains(err.Error(), "undefined table") }}
}

func TestPrunerReportsToItsObserverOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs bytes.Buffer
	rec := &recorder{}
	cfg := PrunerConfig{Rate: 1e9, Batch: 2, Interval: time.Millisecond, Observer: rec, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	if err := newPruner(cfg, script(cancel, 2)).Run(ctx); err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
	kinds := []effects.EventKind{effects.EventFailed, effects.EventPruned, effects.EventPruned}
	if len(rec.evs) != len(kinds) {
		t.Fatalf("events %+v, want %v", rec.evs, kinds)
	}
	for i, ev := range rec.evs {
		if ev.Kind != kinds[i] || ev.Component != "x.Pruner" || ev.Effect != "" || ev.Step != "" {
			t.Errorf("event %d = %+v, want %v from Component x.Pruner", i, ev, kinds[i])
		}
	}
	if !strings.Contains(rec.evs[0].Err.Error(), `scope "billing"`) {
		t.Errorf("failure %v does not name the scope", rec.evs[0].Err)
	}
	if logs.Len() != 0 {
		t.Errorf("logged with an observer set:\n%s", &logs)
	}
}

func TestPrunerLogsWithoutAnObserver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs bytes.Buffer
	cfg := PrunerConfig{Rate: 1e9, Batch: 2, Interval: time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	if err := newPruner(cfg, script(cancel, 2)).Run(ctx); err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
	out := logs.String()
	for _, want := range []string{"level=WARN", "prune failed", "connection reset", "level=INFO", "pruner stopped", "component=x.Pruner", "scope=billing"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

func TestPrunerStopsOnARefusal(t *testing.T) {
	rec := &recorder{}
	p := newPruner(PrunerConfig{Rate: 1, Batch: 1, Interval: time.Hour, Observer: rec},
		func(context.Context, int) (int64, error) { return 0, errors.New("undefined table") })
	err := p.Run(context.Background())
	if !errors.Is(err, effects.ErrInvalidConfig) || len(rec.evs) != 1 || rec.evs[0].Kind != effects.EventFailed {
		t.Fatalf("Run = %v with events %+v, want ErrInvalidConfig after one EventFailed", err, rec.evs)
	}
}

func TestPruneBatches(t *testing.T) {
	var limits []int
	left := int64(2500)
	n, err := PruneBatches(context.Background(), "x.Prune", 0, func(_ context.Context, limit int) (int64, error) {
		limits = append(limits, limit)
		d := min(left, int64(limit))
		left -= d
		return d, nil
	})
	if err != nil || n != 2500 || len(limits) != 3 || limits[0] != DefaultPruneBatch {
		t.Fatalf("PruneBatches = %d, %v with limits %v; want 2500 in 3 statements of %d", n, err, limits, DefaultPruneBatch)
	}
	if _, err := PruneBatches(context.Background(), "x.Prune", -1, nil); effects.ClassOf(err) != effects.InvalidConfig {
		t.Fatalf("negative batch: %v, want a ConfigError", err)
	}
}

func TestFingerprint(t *testing.T) {
	f, err := Fingerprint[own]("x.New")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := f(own{"a"}); string(got) != "a" {
		t.Errorf("fingerprint = %q, want the input's own", got)
	}
	g, err := Fingerprint[struct{ A int }]("x.New")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := effects.FingerprintJSON(struct{ A int }{1})
	if got, _ := g(struct{ A int }{1}); !bytes.Equal(got, want) {
		t.Errorf("default fingerprint = %x, want FingerprintJSON's %x", got, want)
	}
	if _, err := Fingerprint[ptrOnly]("x.New"); effects.ClassOf(err) != effects.InvalidConfig {
		t.Errorf("pointer-only method: %v, want a ConfigError", err)
	}
	if _, err := Fingerprint[*ptrOnly]("x.New"); err != nil {
		t.Errorf("pointer input: %v, want nil", err)
	}
}

type own struct{ s string }

func (o own) Fingerprint() ([]byte, error) { return []byte(o.s), nil }

type ptrOnly struct{}

func (*ptrOnly) Fingerprint() ([]byte, error) { return nil, nil }

func TestCanceledWrapsTheContextsError(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cause := errors.New("conn closed")
	for _, err := range []error{cause, fmt.Errorf("read: %w", context.Canceled)} {
		got := Canceled(ctx, "postgres.Apply", "k1", err)
		if !errors.Is(got, context.Canceled) || !errors.Is(got, err) {
			t.Errorf("Canceled(%v) = %v; want it to wrap context.Canceled and the cause", err, got)
		}
		if want := `postgres.Apply key "k1": nothing was committed: `; !strings.HasPrefix(got.Error(), want) {
			t.Errorf("Canceled(%v) = %q; want the prefix %q", err, got, want)
		}
	}
	if got := Where("postgres.Prune", ""); got != "postgres.Prune" {
		t.Errorf(`Where(op, "") = %q; want the op alone`, got)
	}
}
