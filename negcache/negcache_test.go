package negcache_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/negcache"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// TestMain stops the shared PostgreSQL clusters after the tests and checks
// with goleak that nothing outlived them.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		n      uint
		fp     float64
		option string
	}{{0, 0.01, "n"}, {10, 0, "fp"}, {10, 1, "fp"}, {10, -0.5, "fp"}} {
		f, err := negcache.New(tc.n, tc.fp)
		var ce *effects.ConfigError
		if !errors.As(err, &ce) || ce.Option != tc.option || !errors.Is(err, effects.ErrInvalidConfig) || f != nil {
			t.Errorf("New(%d, %v) = %v, %v; want a ConfigError about %s", tc.n, tc.fp, f, err, tc.option)
		}
	}
}

func TestPrecheckValidates(t *testing.T) {
	f, err := negcache.New(10, 0.01)
	if err != nil {
		t.Fatal(err)
	}
	seen := func(context.Context, effects.Key, payment) (effects.Result, bool, error) {
		return effects.Result{}, false, nil
	}
	eff := effects.Effect[payment](&countingEffect{})
	for name, tc := range map[string]struct {
		eff    effects.Effect[payment]
		f      *negcache.Filter
		seen   func(context.Context, effects.Key, payment) (effects.Result, bool, error)
		option string
	}{
		"nil effect": {nil, f, seen, "eff"},
		"nil filter": {eff, nil, seen, "f"},
		"nil lookup": {eff, f, nil, "seen"},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := negcache.Precheck(tc.eff, tc.f, tc.seen)
			var ce *effects.ConfigError
			if !errors.As(err, &ce) || ce.Option != tc.option || p != nil {
				t.Fatalf("Precheck = %v, %v; want a ConfigError about %s", p, err, tc.option)
			}
		})
	}
}

// TestFilterHasNoFalseNegatives: every added key is "maybe seen"; new keys
// are "maybe seen" at about the configured rate.
func TestFilterHasNoFalseNegatives(t *testing.T) {
	const n, fp = 20000, 0.01
	f, err := negcache.New(n, fp)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		f.Add(effects.Key("seen-" + strconv.Itoa(i)))
	}
	for i := range n {
		if !f.MaybeSeen(effects.Key("seen-" + strconv.Itoa(i))) {
			t.Fatalf("key %d was added but the filter says not seen", i)
		}
	}
	falsePos := 0
	for i := range n {
		if f.MaybeSeen(effects.Key("new-" + strconv.Itoa(i))) {
			falsePos++
		}
	}
	if rate := float64(falsePos) / n; rate > 3*fp {
		t.Errorf("false-positive rate %.4f, want about %v", rate, fp)
	}
	if est := f.FalsePositiveRate(); est < fp/2 || est > 2*fp || f.Added() != n {
		t.Errorf("FalsePositiveRate %.4f after %d adds, want about %v", est, f.Added(), fp)
	}
}

// payment is the effect's input; ledger rows are its effect.
type payment struct {
	EventID string
	Amount  int64
}

type env struct {
	pool *pgxpool.Pool
	fx   *postgres.Effect[payment]
}

// newEnv creates a database with the schema and a ledger table without a
// unique index: only the dedup row keeps duplicates out.
func newEnv(t testing.TB, opts pgtest.Options) *env {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.DBWith(t, opts))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (id bigserial, event_id text NOT NULL, amount bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	fx, err := postgres.New(pool, "billing", writeLedger)
	if err != nil {
		t.Fatal(err)
	}
	return &env{pool: pool, fx: fx}
}

func writeLedger(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO ledger (event_id, amount) VALUES ($1, $2) RETURNING id`, p.EventID, p.Amount).Scan(&id)
	return "ledger:" + strconv.FormatInt(id, 10), err
}

// seen is the pre-check: postgres.Seen with the effect's fingerprint.
func (e *env) seen(ctx context.Context, key effects.Key, p payment) (effects.Result, bool, error) {
	fp, err := effects.FingerprintJSON(p)
	if err != nil {
		return effects.Result{}, false, err
	}
	return postgres.Seen(ctx, e.pool, "billing", key, fp)
}

func (e *env) rows(t testing.TB, eventID string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger WHERE event_id = $1`, eventID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// countingEffect counts calls of the wrapped effect's Apply.
type countingEffect struct {
	effects.Effect[payment]
	calls atomic.Int64
}

func (c *countingEffect) Apply(ctx context.Context, key effects.Key, p payment) (effects.Result, error) {
	c.calls.Add(1)
	return c.Effect.Apply(ctx, key, p)
}

func TestPrecheck(t *testing.T) {
	e := newEnv(t, pgtest.Options{})
	ctx := context.Background()
	newFilter := func() *negcache.Filter {
		f, err := negcache.New(1000, 0.01)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}

	t.Run("new key skips the pre-check, is applied, then added", func(t *testing.T) {
		f, inner := newFilter(), &countingEffect{Effect: e.fx}
		var lookups atomic.Int64
		fx := mustPrecheck(t, inner, f, func(ctx context.Context, k effects.Key, p payment) (effects.Result, bool, error) {
			lookups.Add(1)
			return e.seen(ctx, k, p)
		})
		key, p := effects.MustKey("evt-new", "ledger"), payment{"evt-new", 100}
		res, err := fx.Apply(ctx, key, p)
		if err != nil || res.Status != effects.Applied || lookups.Load() != 0 || inner.calls.Load() != 1 {
			t.Fatalf("Apply = %+v, %v with %d lookups, %d applies; want applied, 0, 1", res, err, lookups.Load(), inner.calls.Load())
		}
		if !f.MaybeSeen(key) {
			t.Error("committed key not added to the filter")
		}
		// The redelivery: the pre-check finds it and replays the stored ref
		// without a transaction.
		again, err := fx.Apply(ctx, key, p)
		if err != nil || again.Status != effects.Replayed || again.Ref != res.Ref || lookups.Load() != 1 || inner.calls.Load() != 1 {
			t.Fatalf("redelivery = %+v, %v with %d lookups, %d applies; want replayed %q, 1, 1", again, err, lookups.Load(), inner.calls.Load(), res.Ref)
		}
		if st := fx.Stats(); st != (negcache.PrecheckStats{Skipped: 1, Checked: 1, Hits: 1}) {
			t.Errorf("Stats = %+v", st)
		}
		if fx.Contract() != e.fx.Contract() {
			t.Error("the wrapper changed the contract")
		}
	})

	t.Run("key committed elsewhere: not in the filter, Apply replays", func(t *testing.T) {
		key, p := effects.MustKey("evt-elsewhere", "ledger"), payment{"evt-elsewhere", 100}
		first, err := e.fx.Apply(ctx, key, p) // another process
		if err != nil {
			t.Fatal(err)
		}
		fx := mustPrecheck(t, e.fx, newFilter(), e.seen)
		res, err := fx.Apply(ctx, key, p)
		if err != nil || res.Status != effects.Replayed || res.Ref != first.Ref || e.rows(t, "evt-elsewhere") != 1 {
			t.Fatalf("Apply = %+v, %v; want replayed %q and one row", res, err, first.Ref)
		}
	})

	t.Run("false positive: the pre-check misses, Apply applies", func(t *testing.T) {
		f := newFilter()
		key, p := effects.MustKey("evt-fp", "ledger"), payment{"evt-fp", 100}
		f.Add(key) // as if another key collided with it in the filter
		fx := mustPrecheck(t, e.fx, f, e.seen)
		res, err := fx.Apply(ctx, key, p)
		if err != nil || res.Status != effects.Applied || e.rows(t, "evt-fp") != 1 {
			t.Fatalf("Apply = %+v, %v; want applied once", res, err)
		}
		if st := fx.Stats(); st.Checked != 1 || st.Hits != 0 {
			t.Errorf("Stats = %+v, want one pre-check, no hit", st)
		}
	})

	t.Run("key reused with another payload", func(t *testing.T) {
		f := newFilter()
		fx := mustPrecheck(t, e.fx, f, e.seen)
		key := effects.MustKey("evt-reuse", "ledger")
		if _, err := fx.Apply(ctx, key, payment{"evt-reuse", 100}); err != nil {
			t.Fatal(err)
		}
		if _, err := fx.Apply(ctx, key, payment{"evt-reuse", 999}); !errors.Is(err, effects.ErrKeyReused) {
			t.Fatalf("Apply with another payload = %v, want ErrKeyReused", err)
		}
	})

	t.Run("a failing pre-check falls back to Apply", func(t *testing.T) {
		f, inner := newFilter(), &countingEffect{Effect: e.fx}
		key, p := effects.MustKey("evt-lookup-fails", "ledger"), payment{"evt-lookup-fails", 100}
		f.Add(key)
		fx := mustPrecheck(t, inner, f, func(context.Context, effects.Key, payment) (effects.Result, bool, error) {
			return effects.Result{}, false, errors.New("replica unreachable")
		})
		res, err := fx.Apply(ctx, key, p)
		if err != nil || res.Status != effects.Applied || inner.calls.Load() != 1 || fx.Stats().LookupErrors != 1 {
			t.Fatalf("Apply = %+v, %v, stats %+v; want applied by the effect", res, err, fx.Stats())
		}
	})

	t.Run("a failed Apply is not added", func(t *testing.T) {
		f := newFilter()
		fx := mustPrecheck(t, e.fx, f, e.seen)
		key := effects.MustKey("evt-cancelled", "ledger")
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := fx.Apply(cctx, key, payment{"evt-cancelled", 1}); err == nil {
			t.Fatal("Apply with a cancelled context succeeded")
		}
		if f.MaybeSeen(key) {
			t.Error("a key whose Apply failed was added to the filter")
		}
	})

	t.Run("invalid key: nothing done", func(t *testing.T) {
		fx := mustPrecheck(t, e.fx, newFilter(), e.seen)
		if _, err := fx.Apply(ctx, "", payment{}); !errors.Is(err, effects.ErrInvalidKey) {
			t.Fatalf("err = %v, want ErrInvalidKey", err)
		}
	})

	t.Run("concurrent duplicates apply once", func(t *testing.T) {
		f := newFilter()
		fx := mustPrecheck(t, e.fx, f, e.seen)
		key, p := effects.MustKey("evt-concurrent", "ledger"), payment{"evt-concurrent", 100}
		var wg sync.WaitGroup
		var applied atomic.Int64
		for range 16 {
			wg.Go(func() {
				res, err := fx.Apply(ctx, key, p)
				if err != nil {
					t.Error(err)
				}
				if res.Status == effects.Applied {
					applied.Add(1)
				}
			})
		}
		wg.Wait()
		if applied.Load() != 1 || e.rows(t, "evt-concurrent") != 1 {
			t.Errorf("applied %d times, %d rows; want 1, 1", applied.Load(), e.rows(t, "evt-concurrent"))
		}
	})

	t.Run("warm the filter from committed keys", func(t *testing.T) {
		for i := range 5 {
			id := fmt.Sprintf("evt-warm-%d", i)
			if _, err := e.fx.Apply(ctx, effects.MustKey(id, "ledger"), payment{id, 1}); err != nil {
				t.Fatal(err)
			}
		}
		f := newFilter()
		err := postgres.Keys(ctx, e.pool, "billing", time.Now().Add(-time.Hour), func(k effects.Key) error { f.Add(k); return nil })
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			if !f.MaybeSeen(effects.MustKey(fmt.Sprintf("evt-warm-%d", i), "ledger")) {
				t.Errorf("evt-warm-%d not in the warmed filter", i)
			}
		}
	})
}

// mustPrecheck wraps eff with negcache.Precheck.
func mustPrecheck(t testing.TB, eff effects.Effect[payment], f *negcache.Filter, seen func(context.Context, effects.Key, payment) (effects.Result, bool, error)) *negcache.Prechecked[payment] {
	t.Helper()
	p, err := negcache.Precheck(eff, f, seen)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
