package postgres

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"effectively.dev/effects"
	"effectively.dev/internal/sqlkeys"
)

// pruneOlderThanSQL is [pruneSQL] with the cutoff computed by the server,
// whose clock set created_at: $2 is the horizon in seconds.
const pruneOlderThanSQL = `DELETE FROM effectively_keys WHERE ctid IN (
	SELECT ctid FROM effectively_keys
	WHERE scope = $1 AND created_at < now() - $2::float8 * interval '1 second' LIMIT $3)`

// Pruner deletes the keys of one scope older than a horizon, in the
// background and at a bounded rate (set its fields and call [Pruner.Run]), so that effectively_keys stays flat
// at steady state: about horizon × insert rate rows, plus what autovacuum
// has not yet reclaimed. Run one per scope, in one process (two Pruners of
// a scope share its work but not their rate ceilings).
//
// It deletes with statements of its batch size (each its own transaction, as [Prune] does), and paces them so that the deletes never exceed its
// rate: a statement that deleted n keys is followed by the next one no
// sooner than n/rate after it began. An unpaced delete loop competes with
// Applies for the CPU, the WAL and the disk for as long as it runs; a
// paced one at a few times the insert rate keeps up without doing so (see
// docs/scale.md for the measurements). Once a statement deletes fewer
// than the batch size, the scope is caught up, and the Pruner waits its
// interval before it looks again.
//
// As with Prune, the horizon is the horizon of the effectively-once
// guarantee: a message redelivered after its key was pruned applies again.
// Keep keys longer than the broker's retention plus the longest replay you
// may run. The cutoff is computed by the server (now() minus the horizon),
// whose clock wrote created_at, so the Pruner's own clock does not matter.
type Pruner struct {
	// DB is where the keys are.
	DB DB
	// Scope is whose keys it deletes.
	Scope string
	// Horizon is the age past which a key is deleted; it must be
	// positive.
	Horizon time.Duration
	// Rate is the ceiling in keys deleted per second (0 means 10000:
	// well above the insert rate of most services, and low enough that
	// the deletes and the vacuum they cause leave concurrent Applies most of the
	// machine). Set it to at least twice the scope's insert rate, so that
	// the Pruner catches up after a pause.
	Rate float64
	// BatchSize is how many keys one DELETE statement removes (0 means
	// 1000). Smaller batches hold locks and write WAL in smaller bursts;
	// larger ones cost fewer statements.
	BatchSize int
	// Interval is how long the Pruner waits after it caught up before it
	// looks for expired keys again, and the longest pause after a failure
	// (0 means one minute). Keys live up to about Horizon + Interval.
	Interval time.Duration
	// Observer, if set, gets every DELETE statement, with Component
	// "postgres.Pruner": an [effects.EventPruned] with the keys it deleted in
	// Count and its duration, or an [effects.EventFailed] with its error
	// (which names the scope). With an Observer the Pruner logs nothing.
	Observer effects.Observer
	// Logger, without an Observer, gets the failures (warnings) and the
	// stop (info); nil means [slog.Default] as it is when a line is
	// written.
	Logger *slog.Logger
}

// Run prunes until ctx is done, and then returns nil: a DELETE that ctx
// interrupted is rolled back by the server, and nothing runs after Run
// returned. A failed statement (a lost connection, a restarting server, a
// lock or statement timeout) is reported and retried after a pause that
// doubles up to the interval. A statement the server refuses for a reason
// retrying cannot fix (an undefined table: run [Migrate]; a missing
// privilege) stops Run with an error that unwraps to
// [effects.ErrInvalidConfig] and the server's error.
// Before any I/O it returns an [*effects.ConfigError] naming the field if
// DB is nil, Scope is empty, not UTF-8 or contains NUL, Horizon is not
// positive, or Rate, BatchSize or Interval is negative.
func (p *Pruner) Run(ctx context.Context) error {
	const op = "postgres.Pruner.Run"
	cfg := sqlkeys.PrunerConfig{Rate: p.Rate, Batch: p.BatchSize, Interval: p.Interval, Observer: p.Observer, Logger: p.Logger}
	if err := cfg.Resolve(op, nilDB(p.DB), p.Horizon); err != nil {
		return err
	}
	if err := validateScope(op, p.Scope); err != nil {
		return err
	}
	loop := sqlkeys.Pruner{Component: "postgres.Pruner", Scope: p.Scope, Config: cfg, RefusedForGood: refusedForGood,
		Delete: func(ctx context.Context, limit int) (int64, error) {
			tag, err := p.DB.Exec(ctx, pruneOlderThanSQL, p.Scope, p.Horizon.Seconds(), limit)
			return tag.RowsAffected(), err
		},
	}
	return loop.Run(ctx)
}

// refusedForGood reports whether the server refused the statement for a
// reason a retry cannot fix: SQLSTATE class 42 (an undefined table or
// column, a missing privilege).
func refusedForGood(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && isError(pgErr) && len(pgErr.Code) == 5 && pgErr.Code[:2] == "42"
}
