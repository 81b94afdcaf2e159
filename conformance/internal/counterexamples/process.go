package counterexamples

import (
	"context"
	"crypto/rand"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
)

// processSession is ProcessScopedDedup's session id: made once per
// process, as a producer id or a client session is.
var processSession = rand.Text()

// ProcessScopedDedup dedups in the same transaction as the write, but
// under the key scoped to its process's session (as Kafka's idempotent
// producer dedups per producer session): every instance in one process
// agrees, a successor process does not. It passes every scenario that
// runs its successors in the test process.
type ProcessScopedDedup struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce across processes. It holds only within
// one.
func (e ProcessScopedDedup) Contract() effects.Contract {
	return claim("counterexample: dedup row keyed by a per-process session id and the key")
}

// Apply dedups on the session and the key, in the write's transaction.
func (e ProcessScopedDedup) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	return dedupTx(ctx, e.DB, key, processSession+"/"+string(key), in, true, classify)
}
