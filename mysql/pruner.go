package mysql

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
)

// Defaults of a [Pruner].
const (
	// DefaultPruneRate is a Pruner's ceiling in keys deleted per second:
	// well above the insert rate of most services, and low enough that
	// the deletes and the purge they cause leave concurrent Applies most
	// of the machine.
	DefaultPruneRate = 10000
	// DefaultPruneInterval is how long a Pruner waits, once no key is
	// older than its horizon, before it looks again.
	DefaultPruneInterval = time.Minute
)

// prunerBackoff paces a Pruner's attempts after failures, up to its
// interval.
var prunerBackoff = retry.Backoff{Min: time.Second, Max: DefaultPruneInterval}

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
	db      DB
	scope   string
	horizon time.Duration
	cfg     prunerConfig
}

// PrunerOption configures a [Pruner]. Options only record their values;
// [NewPruner] validates them. A nil PrunerOption is ignored.
type PrunerOption func(*prunerConfig)

type prunerConfig struct {
	rate     float64
	batch    int
	interval time.Duration
	observer effects.Observer
	logger   *slog.Logger
}

// WithRate sets the Pruner's ceiling in keys deleted per second (default
// [DefaultPruneRate]). It must be positive. Set it to at least twice the
// scope's insert rate, so that the Pruner catches up after a pause.
func WithRate(keysPerSecond float64) PrunerOption {
	return func(c *prunerConfig) { c.rate = keysPerSecond }
}

// WithBatchSize sets how many keys one DELETE statement removes (default
// [DefaultPruneBatch]). It must be positive. Smaller batches hold locks in
// smaller bursts; larger ones cost fewer statements.
func WithBatchSize(n int) PrunerOption {
	return func(c *prunerConfig) { c.batch = n }
}

// WithInterval sets how long the Pruner waits after it caught up before
// it looks for expired keys again (default [DefaultPruneInterval]), and
// the longest pause after a failure. It must be positive. Keys live up to
// about horizon + interval.
func WithInterval(d time.Duration) PrunerOption {
	return func(c *prunerConfig) { c.interval = d }
}

// WithObserver reports every DELETE statement to o: an
// [effects.EventPruned] with the keys it deleted in Count and its
// duration, or an [effects.EventFailed] with its error. Effect is
// "mysql.Pruner" and Step the scope. Without it nothing is reported.
func WithObserver(o effects.Observer) PrunerOption {
	return func(c *prunerConfig) { c.observer = o }
}

// WithLogger logs the Pruner's failures (warnings) and its stop (info) to
// l. Without it, or with a nil l, it logs to [slog.Default].
func WithLogger(l *slog.Logger) PrunerOption {
	return func(c *prunerConfig) { c.logger = l }
}

// NewPruner returns a Pruner of scope's keys older than horizon, which
// must be positive. It returns an [*effects.ConfigError] if db is nil,
// scope is invalid (see [New]), horizon is not positive, or an option's
// value is not positive. It does no I/O: start it with [Pruner.Run].
func NewPruner(db DB, scope string, horizon time.Duration, opts ...PrunerOption) (*Pruner, error) {
	const op = "mysql.NewPruner"
	if nilDB(db) {
		return nil, &effects.ConfigError{Op: op, Option: "db", Reason: "nil"}
	}
	if err := validateScope(op, scope); err != nil {
		return nil, err
	}
	if horizon <= 0 {
		return nil, &effects.ConfigError{Op: op, Option: "horizon", Reason: fmt.Sprintf("%v: not positive", horizon)}
	}
	cfg := prunerConfig{rate: DefaultPruneRate, batch: DefaultPruneBatch, interval: DefaultPruneInterval}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	switch {
	case !(cfg.rate > 0): // also NaN
		return nil, &effects.ConfigError{Op: op, Option: "WithRate", Reason: fmt.Sprintf("%v keys/s: not positive", cfg.rate)}
	case cfg.batch <= 0:
		return nil, &effects.ConfigError{Op: op, Option: "WithBatchSize", Reason: fmt.Sprintf("%d: not positive", cfg.batch)}
	case cfg.interval <= 0:
		return nil, &effects.ConfigError{Op: op, Option: "WithInterval", Reason: fmt.Sprintf("%v: not positive", cfg.interval)}
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	return &Pruner{db: db, scope: scope, horizon: horizon, cfg: cfg}, nil
}

const opPruner = "mysql.Pruner"

// Run prunes until ctx is done, and then returns nil: a DELETE that ctx
// interrupted is rolled back by the server, and nothing runs after Run
// returned. A failed statement (a lost connection, a restarting server, a
// lock wait timeout) is reported and retried after a pause that doubles
// up to the interval. A statement the server refuses for a reason
// retrying cannot fix (an unknown table: run [Migrate]; a missing
// privilege) stops Run with an error that unwraps to
// [effects.ErrInvalidConfig] and the server's error.
func (p *Pruner) Run(ctx context.Context) error {
	failures := 0
	for {
		began := time.Now()
		var n int64
		res, err := p.db.ExecContext(ctx, pruneOlderThanSQL, []byte(p.scope), p.horizon.Microseconds(), p.cfg.batch)
		if err == nil {
			n, err = res.RowsAffected()
		}
		took := time.Since(began)
		if err == nil {
			p.observe(ctx, effects.Event{Kind: effects.EventPruned, Count: n, Duration: took})
		}
		if ctx.Err() != nil {
			return p.stopped(ctx)
		}
		var pause time.Duration
		switch {
		case err != nil:
			err = fmt.Errorf("%s scope %q: %w", opPruner, p.scope, err)
			p.observe(ctx, effects.Event{Kind: effects.EventFailed, Duration: took, Err: err})
			if refusedForGood(err) {
				return fmt.Errorf("%w: %w", effects.ErrInvalidConfig, err)
			}
			failures++
			pause = min(prunerBackoff.Delay(failures), p.cfg.interval)
			p.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "effectively: prune failed, retrying",
				slog.String("scope", p.scope), slog.Int("failures", failures),
				slog.Duration("pause", pause), slog.Any("error", err))
		case n < int64(p.cfg.batch):
			failures = 0
			pause = p.cfg.interval // caught up
		default:
			failures = 0
			pause = time.Duration(float64(n)/p.cfg.rate*float64(time.Second)) - took
		}
		if retry.Sleep(ctx, pause) != nil {
			return p.stopped(ctx)
		}
	}
}

// stopped logs the end of Run, whose ctx is done.
func (p *Pruner) stopped(ctx context.Context) error {
	p.cfg.logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelInfo, "effectively: pruner stopped", slog.String("scope", p.scope))
	return nil
}

func (p *Pruner) observe(ctx context.Context, ev effects.Event) {
	if p.cfg.observer == nil {
		return
	}
	ev.Effect, ev.Step = opPruner, p.scope
	p.cfg.observer.Observe(ctx, ev)
}
