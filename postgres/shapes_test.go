package postgres_test

import (
	"context"
	"fmt"
	"strings"
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
	// trips are the round trips of an Apply, by what it is and what the
	// one before it on the connection was: a duplicate that fails a batch
	// (the key's INSERT finds it) makes pgx forget that batch's prepared
	// statements, which the next Apply deallocates and prepares again.
	trips map[transition]int64
	// dupCalls is whether a duplicate calls the write function (a
	// The statements function is called before the first round trip, whatever
	// the shape: its statements are not sent when the lookup finds the
	// key).
	dupCalls bool
}

// transition is an Apply (a new key, or a duplicate) after another.
type transition struct{ prevDup, dup bool }

var (
	newAfterNew = transition{false, false}
	dupAfterNew = transition{false, true}
	dupAfterDup = transition{true, true}
	newAfterDup = transition{true, false}
)

// applyShapes are every shape of Apply: New and NewPipelined, each as it
// is built by default and WithLookupFirst.
func applyShapes() []applyShape {
	newFx := func(opts ...postgres.EffectOption) func(t *testing.T, pool *pgxpool.Pool, calls *atomic.Int64) *postgres.Effect[payment] {
		return func(t *testing.T, pool *pgxpool.Pool, calls *atomic.Int64) *postgres.Effect[payment] {
			return ledgerEffect(t, pool, calls, opts...)
		}
	}
	pipelined := func(opts ...postgres.EffectOption) func(t *testing.T, pool *pgxpool.Pool, calls *atomic.Int64) *postgres.Effect[payment] {
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
		{"New", newFx(), map[transition]int64{newAfterNew: 3, dupAfterNew: 6, dupAfterDup: 7, newAfterDup: 4}, true},
		// BEGIN with the lookup; the write; the key's row with COMMIT. A
		// duplicate: BEGIN with the lookup; ROLLBACK.
		{"New WithLookupFirst", newFx(lookupFirst), map[transition]int64{newAfterNew: 3, dupAfterNew: 2, dupAfterDup: 2, newAfterDup: 3}, false},
		// BEGIN, the writes, the key's row and COMMIT. A duplicate: that;
		// ROLLBACK; the lookup.
		{"NewPipelined", pipelined(), map[transition]int64{newAfterNew: 1, dupAfterNew: 4, dupAfterDup: 5, newAfterDup: 2}, true},
		// BEGIN with the lookup; the writes, the key's row and COMMIT. A
		// duplicate: BEGIN with the lookup; ROLLBACK.
		{"NewPipelined WithLookupFirst", pipelined(lookupFirst), map[transition]int64{newAfterNew: 2, dupAfterNew: 2, dupAfterDup: 2, newAfterDup: 2}, true},
	}
}

// TestApplyShapes: every shape of Apply costs what its documentation
// says, for a new key and for a duplicate, and keeps costing it whatever
// the calls before it were: a storm of duplicates does not change how the
// next new key or duplicate is handled (no behaviour depends on history
// beyond pgx's statement cache on the connection). Every duplicate
// replays the first Apply's ref, and the ledger keeps one row.
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
			// Every transition, then a storm of duplicates, then every
			// transition again: the storm changes nothing.
			script := "NNDDNDN" + strings.Repeat("D", 20) + "NNDDNDN"
			prevDup, fresh := false, 0
			var last effects.Result
			for i, step := range script {
				dup := step == 'D'
				event := fmt.Sprintf("%snew%d", prefix, fresh)
				if !dup {
					fresh++
					event = fmt.Sprintf("%snew%d", prefix, fresh)
				}
				res, trips, writes := apply(event)
				want := effects.Result{Status: effects.Applied, Ref: res.Ref}
				if dup {
					want = effects.Result{Status: effects.Replayed, Ref: last.Ref}
				}
				if wantTrips := shape.trips[transition{prevDup, dup}]; res != want || trips != wantTrips || (dup && (writes > 0) != shape.dupCalls) {
					t.Fatalf("step %d (%c after %t): %+v in %d round trips with %d write calls; want %+v in %d, duplicate calls %t",
						i, step, prevDup, res, trips, writes, want, wantTrips, shape.dupCalls)
				}
				if n := rows(t, pool, event); n != 1 {
					t.Fatalf("step %d: ledger rows of %s = %d, want 1", i, event, n)
				}
				last, prevDup = res, dup
			}
		})
	}
}

// TestApplyShapeOfAWriteThatRunsNothing: a write function that runs no
// statement still commits its key, in every shape of New.
func TestApplyShapeOfAWriteThatRunsNothing(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	for _, opts := range [][]postgres.EffectOption{nil, {postgres.WithLookupFirst()}} {
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
