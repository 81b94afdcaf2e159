package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// TestApplyCommitGuardEverywhere (from an independent review): the
// commit guard in the key's INSERT refuses a write's
// SET LOCAL synchronous_commit = off, and a session's SET synchronous_commit
// = off, on a warmed connection (the prepared INSERT run often enough for a
// generic plan, or forced to one), in every QueryExecMode, in every shape
// (New and NewPipelined, each with and without WithLookupFirst), READ
// COMMITTED and SERIALIZABLE, with an empty ref too; the connection keeps
// working after the refusal.
func TestApplyCommitGuardEverywhere(t *testing.T) {
	url := newDB(t)
	modes := map[string]pgx.QueryExecMode{
		"cache_statement": pgx.QueryExecModeCacheStatement,
		"cache_describe":  pgx.QueryExecModeCacheDescribe,
		"describe_exec":   pgx.QueryExecModeDescribeExec,
		"exec":            pgx.QueryExecModeExec,
		"simple":          pgx.QueryExecModeSimpleProtocol,
	}
	shapes := map[string][]postgres.EffectOption{"default": nil, "lookupfirst": {postgres.WithLookupFirst()}}
	n := 0
	for mname, mode := range modes {
		for _, plan := range []string{"auto", "force_generic_plan"} {
			for sname, shape := range shapes {
				for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.Serializable} {
					for _, kind := range []string{"New", "NewEmptyRef", "NewNoStatement", "Pipelined", "PipelinedEmptyRef"} {
						n++
						name := fmt.Sprintf("%s/%s/%s/%s/%s", mname, plan, sname, iso, kind)
						t.Run(name, func(t *testing.T) {
							pool := newPool(t, url, func(c *pgxpool.Config) {
								c.MaxConns = 1
								c.ConnConfig.DefaultQueryExecMode = mode
								c.ConnConfig.RuntimeParams["plan_cache_mode"] = plan
							})
							fx := guardEffect(t, pool, kind, append([]postgres.EffectOption{postgres.WithIsolation(iso)}, shape...)...)
							ctx := testCtx(t)
							prefix := fmt.Sprintf("guard%d_", n)
							for i := 0; i < 8; i++ { // past the 5 custom plans
								ev := fmt.Sprintf("%ssafe%d", prefix, i)
								if res, err := fx.Apply(ctx, effects.MustKey(ev, "ledger"), payment{EventID: ev, Amount: 1}); err != nil || res.Status != effects.Applied {
									t.Fatalf("safe Apply %d = %+v, %v", i, res, err)
								}
							}
							if mode == pgx.QueryExecModeCacheStatement {
								var g, c int64
								_ = pool.QueryRow(ctx, `SELECT coalesce(sum(generic_plans),0), coalesce(sum(custom_plans),0) FROM pg_prepared_statements WHERE statement LIKE 'INSERT INTO effectively_keys%'`).Scan(&g, &c)
								t.Logf("key INSERT plans: generic %d, custom %d", g, c)
							}
							refuse := func(what string, amount int64) {
								ev := prefix + what
								res, err := fx.Apply(ctx, effects.MustKey(ev, "ledger"), payment{EventID: ev, Amount: amount})
								if !errors.Is(err, postgres.ErrAsyncCommit) || effects.ClassOf(err) == effects.Retryable {
									t.Errorf("%s: Apply = %+v, %v; want ErrAsyncCommit", what, res, err)
								}
								if k := keyRowsNaming(t, pool, ev); k != 0 || rows(t, pool, ev) != 0 {
									t.Errorf("%s: something written", what)
								}
							}
							if kind != "NewNoStatement" {
								refuse("setlocal", -1) // the write turns it off
							}
							mustExec(t, pool, `SET synchronous_commit = off`) // the session (MaxConns 1)
							refuse("session", 1)
							mustExec(t, pool, `SET synchronous_commit = on`)
							ev := prefix + "after"
							if res, err := fx.Apply(ctx, effects.MustKey(ev, "ledger"), payment{EventID: ev, Amount: 1}); err != nil || res.Status != effects.Applied {
								t.Fatalf("Apply after the refusals = %+v, %v", res, err)
							}
							var ref *string
							_ = pool.QueryRow(ctx, `SELECT ref FROM effectively_keys WHERE key LIKE $1`, "%"+ev+"%").Scan(&ref)
							if ref == nil || (kind == "NewEmptyRef" || kind == "PipelinedEmptyRef" || kind == "NewNoStatement") != (*ref == "") {
								t.Errorf("stored ref = %v", ref)
							}
						})
					}
				}
			}
		}
	}
}

// guardEffect is the Effect of kind that TestApplyCommitGuardEverywhere
// runs: a write that turns synchronous_commit off for its transaction
// when the amount is negative.
func guardEffect(t *testing.T, pool *pgxpool.Pool, kind string, opts ...postgres.EffectOption) *postgres.Effect[payment] {
	t.Helper()
	const setOff = `SET LOCAL synchronous_commit = off`
	var (
		fx  *postgres.Effect[payment]
		err error
	)
	switch kind {
	case "New", "NewEmptyRef":
		fx, err = postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
			ref, err := writeLedger(ctx, tx, p)
			if err == nil && p.Amount < 0 {
				_, err = tx.Exec(ctx, `SELECT set_config('synchronous_commit', 'off', $1)`, true)
			}
			if kind == "NewEmptyRef" {
				ref = ""
			}
			return ref, err
		}, opts...)
	case "NewNoStatement":
		fx, err = postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
			return "", nil
		}, opts...)
	case "Pipelined", "PipelinedEmptyRef":
		fx, err = postgres.NewPipelined(pool, "billing", func(_ context.Context, _ effects.Key, p payment) (string, []postgres.Statement, error) {
			sts := []postgres.Statement{{SQL: `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, Args: []any{p.EventID, p.Amount}}}
			if p.Amount < 0 {
				sts = append(sts, postgres.Statement{SQL: setOff})
			}
			ref := "ledger:" + p.EventID
			if kind == "PipelinedEmptyRef" {
				ref = ""
			}
			return ref, sts, nil
		}, opts...)
	}
	if err != nil {
		t.Fatal(err)
	}
	return fx
}
