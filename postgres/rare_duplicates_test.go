package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// Duplicates in the default shape: nothing looks the key up before the
// write, so the key's INSERT (or a write statement that runs into the
// earlier Apply's rows) finds them, and Apply looks the key up after the
// rollback (several of these cases came from an independent review).

// TestApplyDuplicateWhoseWriteFails: a duplicate whose write fails on a
// constraint (through Exec, SendBatch or QueryRow) replays the first
// Apply's ref, and the next new key applies; pgx forgets the failed
// statements as after any failed batch, which costs the connection a
// bounded number of round trips more (the deallocation, the preparation
// again), never a wrong outcome.
func TestApplyDuplicateWhoseWriteFails(t *testing.T) {
	for _, tc := range []struct {
		shape string
		extra int64 // round trips the next new key may take beyond a new key's
	}{{"exec", 2}, {"batch", 2}, {"query", 2}} {
		t.Run(tc.shape, func(t *testing.T) {
			pool, sends := countingPool(t, newDB(t), 1) // sends: one per round trip
			mustExec(t, pool, `CREATE TABLE receipts (event_id text PRIMARY KEY)`)
			fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
				const insert = `INSERT INTO receipts (event_id) VALUES ($1)`
				switch tc.shape {
				case "exec":
					_, err := tx.Exec(ctx, insert, p.EventID)
					return "r:" + p.EventID, err
				case "query":
					var id string
					err := tx.QueryRow(ctx, insert+` RETURNING event_id`, p.EventID).Scan(&id)
					return "r:" + id, err
				}
				var b pgx.Batch
				b.Queue(insert, p.EventID)
				br := tx.SendBatch(ctx, &b)
				_, err := br.Exec()
				if cerr := br.Close(); err == nil {
					err = cerr
				}
				return "r:" + p.EventID, err
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx := testCtx(t)
			apply := func(event string) (effects.Result, int64) {
				t.Helper()
				before := sends.Load()
				res, err := fx.Apply(ctx, effects.MustKey(event, "receipt"), payment{EventID: event, Amount: 1})
				if err != nil {
					t.Fatalf("Apply %s: %v", event, err)
				}
				return res, sends.Load() - before
			}
			apply("evt_warm")
			apply("evt_warm") // prepares the lookup
			apply("evt_warm_2")
			first, trips := apply("evt_a")
			again, dupTrips := apply("evt_a")
			if again != (effects.Result{Status: effects.Replayed, Ref: first.Ref}) || dupTrips > 4+tc.extra {
				t.Fatalf("duplicate = %+v in %d round trips; want replayed %q in at most %d", again, dupTrips, first.Ref, 4+tc.extra)
			}
			if res, next := apply("evt_b"); res.Status != effects.Applied || next > trips+tc.extra {
				t.Fatalf("the next new key = %+v in %d round trips, a new key %d; want applied in at most %d more", res, next, trips, tc.extra)
			}
		})
	}
}

// TestApplyRareDuplicateOfAWriteThatIgnoresAnError: a write that ignores
// a failed statement leaves the transaction failed, and the key's INSERT
// fails with 25P02 instead of finding the key: the duplicate still
// replays, in either shape.
func TestApplyRareDuplicateOfAWriteThatIgnoresAnError(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	mustExec(t, pool, `CREATE TABLE receipts (event_id text PRIMARY KEY)`)
	write := func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		_, _ = tx.Exec(ctx, `INSERT INTO receipts (event_id) VALUES ($1)`, p.EventID) // its error ignored
		return "r:" + p.EventID, nil
	}
	ctx := testCtx(t)
	key := effects.MustKey("evt_ignored", "receipt")
	for i, shape := range [][]postgres.EffectOption{nil, {postgres.WithLookupFirst()}} {
		fx, err := postgres.New(pool, "billing", write, shape...)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if res, err := fx.Apply(ctx, key, payment{EventID: "evt_ignored"}); err != nil || res.Status != effects.Applied {
				t.Fatalf("first Apply = %+v, %v", res, err)
			}
		}
		if res, err := fx.Apply(ctx, key, payment{EventID: "evt_ignored"}); err != nil || res.Status != effects.Replayed {
			t.Errorf("duplicate (shape %d) = %+v, %v; want replayed", i, res, err)
		}
	}
}

// TestApplyKeyTakenElsewhereGivesUp: a pipelined write that fails on
// another key of effectively_keys (23505, but not on its own key) is
// retried WithMaxRetries times, not looked up for ever.
func TestApplyKeyTakenElsewhereGivesUp(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	const taken = `INSERT INTO effectively_keys (scope, key, fingerprint) VALUES ('other', 'taken', '\x00')`
	mustExec(t, pool, taken)
	fx, err := postgres.NewPipelined(pool, "billing", func(context.Context, effects.Key, payment) (string, []postgres.Statement, error) {
		return "x", []postgres.Statement{{SQL: taken}}, nil
	}, postgres.WithMaxRetries(2))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(testCtx(t), 5*time.Second)
	defer cancel()
	_, err = fx.Apply(ctx, effects.MustKey("evt_loop", "ledger"), payment{EventID: "evt_loop"})
	if !errors.Is(err, effects.ErrTransient) || ctx.Err() != nil {
		t.Fatalf("Apply = %v (ctx %v); want ErrTransient after 2 retries", err, ctx.Err())
	}
}

// TestApplyReplayAfterAFailedWriteChecksCommitSettings: a write that
// fails, on a session with synchronous_commit off, for a key committed
// before: the lookup after the failure finds the key, and Apply refuses
// with ErrAsyncCommit rather than ack a replay under unsafe settings.
func TestApplyReplayAfterAFailedWriteChecksCommitSettings(t *testing.T) {
	url := newDB(t)
	safe := newPool(t, url, nil)
	unsafe := asyncPool(t, url)
	ctx := testCtx(t)
	key := effects.MustKey("evt_unsafe", "ledger")
	if _, err := ledgerEffect(t, safe, nil).Apply(ctx, key, payment{EventID: "evt_unsafe", Amount: 1}); err != nil {
		t.Fatal(err)
	}
	failing, err := postgres.New(unsafe, "billing", func(context.Context, pgx.Tx, payment) (string, error) {
		return "", errors.New("validation failed before any statement")
	})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := failing.Apply(ctx, key, payment{EventID: "evt_unsafe", Amount: 1}); !errors.Is(err, postgres.ErrAsyncCommit) {
		t.Fatalf("Apply = %+v, %v; want ErrAsyncCommit", res, err)
	}
}
