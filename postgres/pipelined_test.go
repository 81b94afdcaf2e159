package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// pipelinedLedger is the tests' pipelined effect: a ledger row and an
// audit row, the ref made before they run (the event's id, numbered by a
// counter so that every Apply makes a new one).
func pipelinedLedger(t testing.TB, pool *pgxpool.Pool, calls *atomic.Int64, opts ...postgres.EffectOption) *postgres.Effect[payment] {
	t.Helper()
	fx, err := postgres.NewPipelined(pool, "billing", func(_ context.Context, key effects.Key, p payment) (string, []postgres.Statement, error) {
		n := calls.Add(1)
		ref := fmt.Sprintf("entry:%s:%d", p.EventID, n)
		return ref, []postgres.Statement{
			{SQL: `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, Args: []any{p.EventID, p.Amount}},
			{SQL: `INSERT INTO audit (ref, amount) VALUES ($1, $2)`, Args: []any{ref, p.Amount}},
		}, nil
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return fx
}

func TestNewPipelined(t *testing.T) {
	url := newDB(t)
	pool, sends := countingPool(t, url, 20) // sends: one per round trip
	mustExec(t, pool, `CREATE TABLE audit (ref text PRIMARY KEY, amount bigint NOT NULL CHECK (amount >= 0))`)

	t.Run("a new key applies once in one round trip and replays its ref", func(t *testing.T) {
		ctx := testCtx(t)
		var calls atomic.Int64
		fx := pipelinedLedger(t, pool, &calls)
		key := effects.MustKey("evt_pipelined", "ledger")
		p := payment{EventID: "evt_pipelined", Amount: 100}
		// Warm the connection (its statements prepared), then count.
		if _, err := fx.Apply(ctx, effects.MustKey("evt_pipelined_warm", "ledger"), payment{EventID: "warm", Amount: 1}); err != nil {
			t.Fatal(err)
		}
		before := sends.Load()
		first, err := fx.Apply(ctx, key, p)
		if err != nil || first.Status != effects.Applied || first.Ref != "entry:evt_pipelined:2" {
			t.Fatalf("first Apply = %+v, %v; want applied with ref entry:evt_pipelined:2", first, err)
		}
		if n := sends.Load() - before; n != 1 {
			t.Errorf("a new key took %d round trips, want 1", n)
		}
		for range 3 {
			again, err := fx.Apply(ctx, key, p)
			if err != nil || again != (effects.Result{Status: effects.Replayed, Ref: first.Ref}) {
				t.Fatalf("redelivery = %+v, %v; want replayed %s", again, err, first.Ref)
			}
		}
		if n := rows(t, pool, p.EventID); n != 1 {
			t.Fatalf("ledger rows = %d, want 1", n)
		}
		if n := count(t, pool, `SELECT count(*) FROM audit WHERE ref LIKE 'entry:evt_pipelined:%'`); n != 1 {
			t.Fatalf("audit rows = %d, want 1", n)
		}
	})

	t.Run("a failing statement commits nothing", func(t *testing.T) {
		ctx := testCtx(t)
		var calls atomic.Int64
		fx := pipelinedLedger(t, pool, &calls)
		key := effects.MustKey("evt_pipelined_bad", "ledger")
		_, err := fx.Apply(ctx, key, payment{EventID: "evt_pipelined_bad", Amount: -1}) // the audit CHECK fails
		if err == nil || effects.ClassOf(err) == effects.Retryable {
			t.Fatalf("Apply = %v; want the CHECK violation, not retryable", err)
		}
		if n := rows(t, pool, "evt_pipelined_bad"); n != 0 {
			t.Fatalf("ledger rows = %d after a failed statement, want 0", n)
		}
		if n := count(t, pool, `SELECT count(*) FROM effectively_keys WHERE key = $1`, string(key)); n != 0 {
			t.Fatalf("key rows = %d after a failed statement, want 0", n)
		}
		// The key is free: the corrected payload applies.
		if res, err := fx.Apply(ctx, key, payment{EventID: "evt_pipelined_bad", Amount: 1}); err != nil || res.Status != effects.Applied {
			t.Fatalf("Apply after the failure = %+v, %v; want applied", res, err)
		}
	})

	t.Run("key reuse is refused and writes nothing", func(t *testing.T) {
		ctx := testCtx(t)
		var calls atomic.Int64
		fx := pipelinedLedger(t, pool, &calls)
		key := effects.MustKey("evt_pipelined_reuse", "ledger")
		if _, err := fx.Apply(ctx, key, payment{EventID: "evt_pipelined_reuse", Amount: 1}); err != nil {
			t.Fatal(err)
		}
		_, err := fx.Apply(ctx, key, payment{EventID: "evt_pipelined_reuse", Amount: 2})
		if !errors.Is(err, effects.ErrKeyReused) {
			t.Fatalf("Apply with another payload = %v, want ErrKeyReused", err)
		}
		if n := rows(t, pool, "evt_pipelined_reuse"); n != 1 {
			t.Fatalf("ledger rows = %d, want 1", n)
		}
	})

	t.Run("16 concurrent duplicates apply once", func(t *testing.T) {
		ctx := testCtx(t)
		var calls atomic.Int64
		fx := pipelinedLedger(t, pool, &calls)
		key := effects.MustKey("evt_pipelined_race", "ledger")
		var wg sync.WaitGroup
		var applied atomic.Int64
		refs := sync.Map{}
		for range 16 {
			wg.Go(func() {
				res, err := fx.Apply(ctx, key, payment{EventID: "evt_pipelined_race", Amount: 5})
				if err != nil {
					t.Error(err)
					return
				}
				if res.Status == effects.Applied {
					applied.Add(1)
				}
				refs.Store(res.Ref, true)
			})
		}
		wg.Wait()
		n := 0
		refs.Range(func(any, any) bool { n++; return true })
		if applied.Load() != 1 || n != 1 || rows(t, pool, "evt_pipelined_race") != 1 {
			t.Fatalf("applied %d, %d refs, %d rows; want 1, 1, 1", applied.Load(), n, rows(t, pool, "evt_pipelined_race"))
		}
	})

	t.Run("a statements error is returned before any round trip", func(t *testing.T) {
		boom := errors.New("boom")
		fx, err := postgres.NewPipelined(pool, "billing", func(context.Context, effects.Key, payment) (string, []postgres.Statement, error) {
			return "", nil, boom
		})
		if err != nil {
			t.Fatal(err)
		}
		before := sends.Load()
		if _, err := fx.Apply(testCtx(t), effects.MustKey("evt_pipelined_boom", "ledger"), payment{}); !errors.Is(err, boom) {
			t.Fatalf("Apply = %v, want boom", err)
		}
		empty, _ := postgres.NewPipelined(pool, "billing", func(context.Context, effects.Key, payment) (string, []postgres.Statement, error) {
			return "", []postgres.Statement{{}}, nil
		})
		if _, err := empty.Apply(testCtx(t), effects.MustKey("evt_pipelined_empty", "ledger"), payment{}); err == nil {
			t.Fatal("Apply of a statement without SQL: no error")
		}
		if n := sends.Load() - before; n != 0 {
			t.Fatalf("%d round trips, want none", n)
		}
	})

	t.Run("config errors", func(t *testing.T) {
		var ce *effects.ConfigError
		if _, err := postgres.NewPipelined[payment](pool, "billing", nil); !errors.As(err, &ce) || ce.Option != "statements" {
			t.Fatalf("nil statements: %v", err)
		}
		if _, err := postgres.NewPipelined[payment](nil, "billing", func(context.Context, effects.Key, payment) (string, []postgres.Statement, error) { return "", nil, nil }); !errors.As(err, &ce) || ce.Option != "pool" {
			t.Fatalf("nil pool: %v", err)
		}
	})
}

// TestNewPipelinedRefusesAsyncCommit: the settings are checked in the same
// round trip as the writes and COMMIT, and refuse them as New does:
// synchronous_commit off, or local while a synchronous standby is named
// (a cluster of its own, whose synchronous_standby_names names a standby
// that never connects: a commit that waited for it would hang, one that is
// refused does not).
func TestNewPipelinedRefusesAsyncCommit(t *testing.T) {
	for _, tc := range []struct {
		setting string
		standby bool
		refused bool
	}{
		{"off", false, true},
		{"local", false, false},
		{"local", true, true},
	} {
		t.Run(fmt.Sprintf("%s, standby %v", tc.setting, tc.standby), func(t *testing.T) {
			url := newDB(t)
			if tc.standby {
				if os.Getenv("DATABASE_URL") != "" {
					t.Skip("DATABASE_URL is set: this case needs a cluster of its own")
				}
				c, err := pgtest.New(pgtest.Options{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Stop() })
				if err := c.CreateDatabase(testCtx(t), "pipelined"); err != nil {
					t.Fatal(err)
				}
				url = c.URL("pipelined")
				admin := newPool(t, url, nil)
				if err := postgres.Migrate(testCtx(t), admin); err != nil {
					t.Fatal(err)
				}
				mustExec(t, admin, ledgerDDL)
				// From here on a commit with synchronous_commit=on would
				// wait forever: everything below commits with local.
				mustExec(t, admin, `ALTER SYSTEM SET synchronous_standby_names = 'nobody'`)
				mustExec(t, admin, `SELECT pg_reload_conf()`)
				admin.Close()
			}
			pool := newPool(t, url, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["synchronous_commit"] = tc.setting })
			for tc.standby && count(t, pool, `SELECT count(*) FROM pg_settings WHERE name = 'synchronous_standby_names' AND setting <> ''`) == 0 {
				time.Sleep(10 * time.Millisecond) // the reload is asynchronous
			}
			mustExec(t, pool, `CREATE TABLE audit (ref text PRIMARY KEY, amount bigint NOT NULL)`)
			ctx := testCtx(t)
			var calls atomic.Int64
			key := effects.MustKey("evt_pipelined_async", "ledger")
			p := payment{EventID: "evt_pipelined_async", Amount: 1}
			_, err := pipelinedLedger(t, pool, &calls).Apply(ctx, key, p)
			if tc.refused != errors.Is(err, postgres.ErrAsyncCommit) || (!tc.refused && err != nil) {
				t.Fatalf("Apply with synchronous_commit=%s = %v; refused %v", tc.setting, err, tc.refused)
			}
			if tc.refused {
				if effects.ClassOf(err) == effects.Retryable {
					t.Errorf("ErrAsyncCommit is retryable: %v", err)
				}
				if k, l := count(t, pool, `SELECT count(*) FROM effectively_keys`), rows(t, pool, p.EventID); k != 0 || l != 0 {
					t.Fatalf("keys = %d, ledger rows = %d after the refusal; want nothing written", k, l)
				}
				res, err := pipelinedLedger(t, pool, &calls, postgres.AllowAsyncCommit()).Apply(ctx, key, p)
				if err != nil || res.Status != effects.Applied {
					t.Fatalf("Apply with AllowAsyncCommit = %+v, %v; want applied", res, err)
				}
			}
			if k, l := count(t, pool, `SELECT count(*) FROM effectively_keys`), rows(t, pool, p.EventID); k != 1 || l != 1 {
				t.Fatalf("keys = %d, ledger rows = %d; want 1 each", k, l)
			}
		})
	}
}

// TestNewPipelinedStatementThatCannotBeEncoded: pgx refuses the batch
// before COMMIT is sent, so the error is the statement's (not retryable),
// never an ambiguous commit, with or without the lookup first, and
// nothing is written.
func TestNewPipelinedStatementThatCannotBeEncoded(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	for _, opts := range [][]postgres.EffectOption{nil, {postgres.WithLookupFirst()}} {
		fx, err := postgres.NewPipelined(pool, "billing", func(context.Context, effects.Key, payment) (string, []postgres.Statement, error) {
			return "r", []postgres.Statement{{SQL: `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, Args: []any{"evt", make(chan int)}}}, nil
		}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		key := effects.MustKey("evt_unencodable", fmt.Sprint(len(opts)))
		_, err = fx.Apply(testCtx(t), key, payment{})
		if err == nil || effects.ClassOf(err) == effects.Retryable || errors.Is(err, effects.ErrAmbiguous) {
			t.Fatalf("Apply with an argument pgx cannot encode (lookup first %v) = %v; want the statement's error, not retryable", len(opts) > 0, err)
		}
		if n := count(t, pool, `SELECT count(*) FROM effectively_keys WHERE key = $1`, string(key)); n != 0 {
			t.Fatalf("%d key rows, want 0", n)
		}
	}
}
