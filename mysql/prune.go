package mysql

import (
	"context"
	"strconv"
	"time"

	"effectively.dev/effects"
	"effectively.dev/internal/sqlkeys"
)

// Prune deletes the keys of scope created before olderThan, batchSize rows
// per statement (DELETE ... LIMIT; each its own transaction when db is a
// *sql.DB or a *sql.Conn in autocommit mode), until a statement deletes
// fewer than batchSize (0 means 1000; a negative size, or a
// nil db, is an [*effects.ConfigError]). Small batches keep locks and redo
// bursts short next to live traffic. It returns how many keys it deleted,
// also when it stops early on an error or a done ctx.
//
// Pruning sets the horizon of the effectively-once guarantee: a message
// redelivered after its key was pruned applies again. Choose olderThan so
// that the horizon outlives the broker's retention plus the longest replay
// you may run, e.g. time.Now().Add(-(retention + maxReplay + margin)).
func Prune(ctx context.Context, db DB, scope string, olderThan time.Time, batchSize int) (int64, error) {
	const op = "mysql.Prune"
	if nilDB(db) {
		return 0, effects.ConfigErrorf(op, "db", "nil")
	}
	if err := validateScope(op, scope); err != nil {
		return 0, err
	}
	return pruneBatches(ctx, db, op, pruneSQL, scope, olderThan, batchSize)
}

// Prune deletes the journal's records created before olderThan, done or
// not, except those an attempt holds a live lease on, batchSize rows per
// statement (see the package-level [Prune] for batching). It returns how
// many records it deleted.
//
// As with keys, pruning sets the horizon: a message redelivered after its
// record was pruned does its effect again (sends the email again), so keep
// records longer than broker retention plus the longest replay.
func (j *Journal) Prune(ctx context.Context, olderThan time.Time, batchSize int) (int64, error) {
	return pruneBatches(ctx, j.db, "mysql.Journal.Prune", pruneJournalSQL, j.scope, olderThan, batchSize)
}

// pruneBatches runs the DELETE query (parameters scope, olderThan as Unix
// seconds, limit) until a statement deletes fewer than batchSize rows.
func pruneBatches(ctx context.Context, db DB, op, query, scope string, olderThan time.Time, batchSize int) (int64, error) {
	cutoff := strconv.FormatFloat(float64(olderThan.UnixMicro())/1e6, 'f', 6, 64)
	return sqlkeys.PruneBatches(ctx, op, batchSize, func(ctx context.Context, limit int) (int64, error) {
		res, err := db.ExecContext(ctx, query, []byte(scope), cutoff, limit)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
}
