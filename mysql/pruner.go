package mysql

import (
	"context"
	"log/slog"
	"time"

	"effectively.dev/effects"
	"effectively.dev/internal/optcheck"
	"effectively.dev/internal/sqlkeys"
)

// Pruner deletes the keys of one scope older than a horizon, in the
// background and at a bounded rate, so that effectively_keys stays flat at
// steady state: about horizon × insert rate rows. Run one per scope, in
// one process.
//
// It deletes with statements of its batch size (DELETE ... LIMIT, each its
// own transaction, as [Prune] does), and paces them so that the deletes
// never exceed its rate: a statement that deleted n keys is followed by
// the next one no sooner than n/rate after it began. Once a statement
// deletes fewer than the batch size, the scope is caught up, and the
// Pruner waits its interval before it looks again.
//
// As with Prune, the horizon is the horizon of the effectively-once
// guarantee: a message redelivered after its key was pruned applies again.
// Keep keys longer than the broker's retention plus the longest replay you
// may run. The cutoff is computed by the server (NOW(6) minus the
// horizon), whose clock wrote created_at, so the Pruner's own clock does
// not matter.
type Pruner struct {
	loop sqlkeys.Pruner
}

// A PrunerOption configures [NewPruner]. A nil PrunerOption is ignored.
type PrunerOption interface{ applyPruner(*sqlkeys.PrunerConfig) }

type prunerOpt func(*sqlkeys.PrunerConfig)

func (f prunerOpt) applyPruner(c *sqlkeys.PrunerConfig) { f(c) }

// WithRate sets the Pruner's ceiling in keys deleted per second (default
// 10000: well above the insert rate of most services, and low enough that
// the deletes and the purge they cause leave concurrent Applies most of
// the machine). It must be positive. Set it to at least twice the scope's
// insert rate, so that the Pruner catches up after a pause.
func WithRate(keysPerSecond float64) PrunerOption {
	return prunerOpt(func(c *sqlkeys.PrunerConfig) { c.Rate = keysPerSecond })
}

// WithBatchSize sets how many keys one DELETE statement removes (default
// 1000). It must be positive. Smaller batches hold locks in smaller
// bursts; larger ones cost fewer statements.
func WithBatchSize(n int) PrunerOption {
	return prunerOpt(func(c *sqlkeys.PrunerConfig) { c.Batch = n })
}

// WithInterval sets how long the Pruner waits after it caught up before
// it looks for expired keys again (default one minute), and the longest
// pause after a failure. It must be positive. Keys live up to about
// horizon + interval.
func WithInterval(d time.Duration) PrunerOption {
	return prunerOpt(func(c *sqlkeys.PrunerConfig) { c.Interval = d })
}

// WithObserver reports every DELETE statement to o, with Component
// "mysql.Pruner": an [effects.EventPruned] with the keys it deleted in
// Count and its duration, or an [effects.EventFailed] with its error
// (which names the scope). With an observer the Pruner logs nothing.
func WithObserver(o effects.Observer) PrunerOption {
	return prunerOpt(func(c *sqlkeys.PrunerConfig) { c.Observer = o })
}

// WithLogger logs the Pruner's failures (warnings) and its stop (info) to
// l when it has no observer. Without it, or with a nil l, it logs to
// [slog.Default] as it is when the line is written.
func WithLogger(l *slog.Logger) PrunerOption {
	return prunerOpt(func(c *sqlkeys.PrunerConfig) { c.Logger = l })
}

// NewPruner returns a Pruner of scope's keys older than horizon, which
// must be positive. It returns an [*effects.ConfigError] if db is nil,
// scope is invalid (see [New]), horizon is not positive, or an option's
// value is not positive. It does no I/O: start it with [Pruner.Run].
func NewPruner(db DB, scope string, horizon time.Duration, opts ...PrunerOption) (*Pruner, error) {
	const op = "mysql.NewPruner"
	if nilDB(db) {
		return nil, optcheck.Bad(op, "db", "nil")
	}
	if err := validateScope(op, scope); err != nil {
		return nil, err
	}
	cfg := sqlkeys.NewPrunerConfig()
	for _, o := range opts {
		if o != nil {
			o.applyPruner(&cfg)
		}
	}
	if err := sqlkeys.CheckPruner(op, horizon, &cfg); err != nil {
		return nil, err
	}
	return &Pruner{loop: sqlkeys.Pruner{
		Component: "mysql.Pruner", Scope: scope, Config: cfg, RefusedForGood: refusedForGood,
		Delete: func(ctx context.Context, limit int) (int64, error) {
			res, err := db.ExecContext(ctx, pruneOlderThanSQL, []byte(scope), horizon.Microseconds(), limit)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		},
	}}, nil
}

// Run prunes until ctx is done, and then returns nil: a DELETE that ctx
// interrupted is rolled back by the server, and nothing runs after Run
// returned. A failed statement (a lost connection, a restarting server, a
// lock wait timeout) is reported and retried after a pause that doubles
// up to the interval. A statement the server refuses for a reason
// retrying cannot fix (an unknown table: run [Migrate]; a missing
// privilege) stops Run with an error that unwraps to
// [effects.ErrInvalidConfig] and the server's error.
func (p *Pruner) Run(ctx context.Context) error { return p.loop.Run(ctx) }
