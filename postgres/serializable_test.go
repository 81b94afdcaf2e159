package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// TestApplySerializableDistinctKeysDoNotConflict: two Applies of different keys at
// SERIALIZABLE whose transactions overlap; WithMaxRetries(0) so that a
// serialization failure surfaces.
func TestApplySerializableDistinctKeysDoNotConflict(t *testing.T) {
	for _, prefill := range []int{0, 5000} {
		t.Run(fmt.Sprintf("New/prefill=%d", prefill), func(t *testing.T) {
			pool, ctx := prefilledPool(t, prefill), testCtx(t)
			var mu sync.Mutex
			var arrived int
			cond := sync.NewCond(&mu)
			round := 0
			fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
				ref, err := writeLedger(ctx, tx, p)
				if err != nil {
					return "", err
				}
				mu.Lock()
				arrived++
				r := round
				cond.Broadcast()
				deadline := time.Now().Add(2 * time.Second)
				for arrived < 2*(r+1) && time.Now().Before(deadline) {
					mu.Unlock()
					time.Sleep(time.Millisecond)
					mu.Lock()
				}
				mu.Unlock()
				return ref, nil
			}, postgres.WithIsolation(pgx.Serializable), postgres.WithMaxRetries(0))
			if err != nil {
				t.Fatal(err)
			}
			overlappingApplies(t, ctx, fx, func(r int) {
				mu.Lock()
				round = r
				mu.Unlock()
			})
		})
		t.Run(fmt.Sprintf("NewPipelined/prefill=%d", prefill), func(t *testing.T) {
			pool, ctx := prefilledPool(t, prefill), testCtx(t)
			fx, err := postgres.NewPipelined(pool, "billing", func(_ context.Context, k effects.Key, p payment) (string, []postgres.Statement, error) {
				return "r" + p.EventID, []postgres.Statement{
					{SQL: `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, Args: []any{p.EventID, p.Amount}},
					{SQL: `SELECT pg_sleep($1::float8)`, Args: []any{0.3}},
				}, nil
			}, postgres.WithIsolation(pgx.Serializable), postgres.WithMaxRetries(0))
			if err != nil {
				t.Fatal(err)
			}
			overlappingApplies(t, ctx, fx, func(int) {})
		})
	}
}

// overlappingApplies runs 10 rounds of two Applies of new keys at once
// (calling round first) and fails the test if any of them fails.
func overlappingApplies(t *testing.T, ctx context.Context, fx *postgres.Effect[payment], round func(int)) {
	t.Helper()
	fails := 0
	for r := range 10 {
		round(r)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range 2 {
			wg.Go(func() {
				_, errs[i] = fx.Apply(ctx, effects.MustKey(fmt.Sprintf("evt_ssi_%d_%d", r, i), "ledger"), payment{EventID: fmt.Sprintf("e%d_%d", r, i), Amount: 1})
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				fails++
				t.Logf("round %d: %v", r, err)
			}
		}
	}
	if fails > 0 {
		t.Errorf("%d of 20 Applies of distinct new keys failed at SERIALIZABLE", fails)
	}
}

// prefilledPool returns a pool on a new database whose effectively_keys
// holds prefill other keys.
func prefilledPool(t *testing.T, prefill int) *pgxpool.Pool {
	t.Helper()
	pool := newPool(t, newDB(t), nil)
	if prefill > 0 {
		mustExec(t, pool, `INSERT INTO effectively_keys (scope, key, fingerprint) SELECT 'billing', 'k'||g, '\x00' FROM generate_series(1,$1::int) g`, prefill)
		mustExec(t, pool, `ANALYZE effectively_keys`)
	}
	return pool
}
