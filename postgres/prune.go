package postgres

import (
	"context"
	"fmt"
	"time"
)

// DefaultPruneBatch is the batch size [Prune] uses when given 0 or less.
const DefaultPruneBatch = 1000

const pruneSQL = `DELETE FROM effectively_keys WHERE ctid IN (
	SELECT ctid FROM effectively_keys WHERE scope = $1 AND created_at < $2 LIMIT $3)`

// Prune deletes the keys of scope created before olderThan, batchSize rows
// per statement (each its own transaction when db is a pool or a
// connection), until a statement deletes fewer than batchSize. Small batches
// keep locks and WAL bursts short next to live traffic. It returns how many
// keys it deleted, also when it stops early on an error or a done ctx.
//
// Pruning sets the horizon of the effectively-once guarantee: a message
// redelivered after its key was pruned applies again. Choose olderThan so
// that the horizon outlives the broker's retention plus the longest replay
// you may run (re-feeding a topic from an old offset, a DLQ drained a week
// later), e.g. time.Now().Add(-(retention + maxReplay + margin)).
func Prune(ctx context.Context, db DB, scope string, olderThan time.Time, batchSize int) (int64, error) {
	const op = "postgres.Prune"
	if err := validateScope(op, scope); err != nil {
		return 0, err
	}
	if batchSize <= 0 {
		batchSize = DefaultPruneBatch
	}
	var deleted int64
	for {
		tag, err := db.Exec(ctx, pruneSQL, scope, olderThan, batchSize)
		if err != nil {
			return deleted, fmt.Errorf("%s: %w", op, err)
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			return deleted, nil
		}
	}
}
