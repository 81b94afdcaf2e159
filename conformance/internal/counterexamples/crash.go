package counterexamples

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
)

// UnloggedSchema makes the counterexamples' dedup table UNLOGGED, as
// [UnloggedDedup] needs.
const UnloggedSchema = `ALTER TABLE cx_seen SET UNLOGGED`

// UnloggedDedup is a correct same-transaction dedup whose dedup table is
// UNLOGGED ("it only holds keys: skip the WAL for speed"). PostgreSQL
// empties an unlogged table in crash recovery, so after a crash every key
// is new again while the ledger rows, logged, remain: every redelivery
// applies a second time. A clean restart keeps unlogged tables, so
// backend-restart passes it; crash-restart catches it. Run
// [UnloggedSchema] after [Schema].
type UnloggedDedup struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce. A crash makes it a lie.
func (e UnloggedDedup) Contract() effects.Contract {
	return claim("counterexample: same-transaction dedup in an UNLOGGED table")
}

// Apply claims and writes in one transaction.
func (e UnloggedDedup) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	return dedupInsert(ctx, e.DB, key, in, true)
}
