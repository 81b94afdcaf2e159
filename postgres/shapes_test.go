package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// applyShape is one named shape of Apply, as TestApplyShapes checks it:
// the round trips a new key and a duplicate cost on a warm connection,
// and whether a duplicate calls the write function.
type applyShape struct {
	name string
	make func(t *testing.T, pool *pgxpool.Pool, calls *atomic.Int64) *postgres.Effect[payment]
	// newTrips and dupTrips are the round trips of a new key and of a
	// duplicate; dupCalls is whether a duplicate calls the write function
	// (a StatementsFunc is called before the first round trip, whatever
	// the shape: its statements are not sent when the lookup finds the
	// key).
	newTrips, dupTrips int64
	dupCalls           bool
}

// applyShapes are every shape of Apply: New and NewPipelined, each as it
// is built by default and WithLookupFirst.
func applyShapes() []applyShape {
	newFx := func(opts ...postgres.Option) func(t *testing.T, pool *pgxpool.Pool, calls *atomic.Int64) *postgres.Effect[payment] {
		return func(t *testing.T, pool *pgxpool.Pool, calls *atomic.Int64) *postgres.Effect[payment] {
			return ledgerEffect(t, pool, calls, opts...)
		}
	}
	pipelined := func(opts ...postgres.Option) func(t *testing.T, pool *pgxpool.Pool, calls *atomic.Int64) *postgres.Effect[payment] {
		return func(t *testing.T, pool *pgxpool.Pool, calls *atomic.Int64) *postgres.Effect[payment] {
			t.Helper()
			fx, err := postgres.NewPipelined(pool, "billing", func(_ context.Context, _ effects.Key, p payment) (string, []postgres.Statement, error) {
				calls.Add(1)
				return "ledger:" + p.EventID, []postgres.Statement{{SQL: `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, Args: []any{p.EventID, p.Amount}}}, nil
			}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			return fx
		}
	}
	lookupFirst := postgres.WithLookupFirst()
	return []applyShape{
		// The write, with BEGIN; the key's row with COMMIT. A duplicate:
		// the write; the key's row and COMMIT, which fail; ROLLBACK; the
		// lookup.
		{"New", newFx(), 2, 4, true},
		// BEGIN with the lookup; the write; the key's row with COMMIT. A
		// duplicate: BEGIN with the lookup; ROLLBACK.
		{"New WithLookupFirst", newFx(lookupFirst), 3, 2, false},
		// BEGIN, the writes, the key's row and COMMIT. A duplicate: that;
		// ROLLBACK; the lookup.
		{"NewPipelined", pipelined(), 1, 3, true},
		// BEGIN with the lookup; the writes, the key's row and COMMIT. A
		// duplicate: BEGIN with the lookup; ROLLBACK.
		{"NewPipelined WithLookupFirst", pipelined(lookupFirst), 2, 2, true},
	}
}

// TestApplyShapes: every shape of Apply costs what its documentation
// says, for a new key and for a duplicate, and keeps costing it whatever
// the calls before it were: a run of duplicates does not change how the
// next new key or duplicate is handled (no behaviour depends on history).
// Every duplicate replays the first Apply's ref, and the ledger keeps one
// row.
func TestApplyShapes(t *testing.T) {
	url := newDB(t)
	for i, shape := range applyShapes() {
		t.Run(shape.name, func(t *testing.T) {
			pool, sends := countingPool(t, url, 1) // one connection: its statements stay prepared
			ctx := testCtx(t)
			var calls atomic.Int64
			fx := shape.make(t, pool, &calls)
			apply := func(event string) (res effects.Result, trips, writes int64) {
				t.Helper()
				sent, called := sends.Load(), calls.Load()
				res, err := fx.Apply(ctx, effects.MustKey(event, "ledger"), payment{EventID: event, Amount: 5})
				if err != nil {
					t.Fatalf("Apply %s: %v", event, err)
				}
				return res, sends.Load() - sent, calls.Load() - called
			}
			prefix := fmt.Sprintf("evt_shape%d_", i)
			// Warm the connection: every statement of both paths prepared.
			apply(prefix + "warm")
			apply(prefix + "warm")
			apply(prefix + "warm_2")
			for round := range 2 {
				event := fmt.Sprintf("%sround%d", prefix, round)
				first, trips, _ := apply(event)
				if first.Status != effects.Applied || trips != shape.newTrips {
					t.Fatalf("round %d: new key = %+v in %d round trips, want applied in %d", round, first, trips, shape.newTrips)
				}
				for d := range 20 {
					res, trips, writes := apply(event)
					if res != (effects.Result{Status: effects.Replayed, Ref: first.Ref}) || trips != shape.dupTrips || (writes > 0) != shape.dupCalls {
						t.Fatalf("round %d: duplicate %d = %+v in %d round trips with %d write calls; want replayed %q in %d, calls %t",
							round, d, res, trips, writes, first.Ref, shape.dupTrips, shape.dupCalls)
					}
				}
				if n := rows(t, pool, event); n != 1 {
					t.Fatalf("round %d: ledger rows = %d, want 1", round, n)
				}
			}
		})
	}
}

// TestApplyShapeOfAWriteThatRunsNothing: a write function that runs no
// statement still commits its key, in every shape of New.
func TestApplyShapeOfAWriteThatRunsNothing(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	for _, opts := range [][]postgres.Option{nil, {postgres.WithLookupFirst()}} {
		fx, err := postgres.New(pool, "billing", func(context.Context, pgx.Tx, payment) (string, error) { return "nothing", nil }, opts...)
		if err != nil {
			t.Fatal(err)
		}
		key := effects.MustKey(fmt.Sprintf("evt_nothing_%d", len(opts)), "ledger")
		for _, want := range []effects.Status{effects.Applied, effects.Replayed} {
			if res, err := fx.Apply(testCtx(t), key, payment{}); err != nil || res != (effects.Result{Status: want, Ref: "nothing"}) {
				t.Fatalf("Apply (%d options) = %+v, %v; want %v", len(opts), res, err, want)
			}
		}
	}
}
