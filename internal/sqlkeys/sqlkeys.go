// Package sqlkeys holds what the SQL adapters (postgres, mysql) share
// about their key tables: the input fingerprint, the checks of their
// options, a batched prune, a paced Pruner loop and the wording of their
// errors. Each adapter supplies
// its statements; the logic around them lives here once.
package sqlkeys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
)

// Fingerprinter is what an Effect's input implements to choose its own
// fingerprint instead of its JSON's.
type Fingerprinter interface {
	Fingerprint() ([]byte, error)
}

// Fingerprint returns how op's Effect fingerprints an In: with its
// Fingerprint method when In has one, else [effects.FingerprintJSON]. It
// returns an *effects.ConfigError when only *In has the method, for an In
// that is not a pointer: the method would never be called.
func Fingerprint[In any](op string) (func(In) ([]byte, error), error) {
	var zero In
	if _, ok := any(&zero).(Fingerprinter); ok {
		if _, ok := any(zero).(Fingerprinter); !ok {
			return nil, effects.ConfigErrorf(op, "Fingerprint", "%T has a pointer-receiver Fingerprint method; declare it on %T", &zero, zero)
		}
	}
	return func(in In) ([]byte, error) {
		v := any(in)
		if f, ok := v.(Fingerprinter); ok {
			return f.Fingerprint()
		}
		return effects.FingerprintJSON(v)
	}, nil
}

// Scope returns a *effects.ConfigError of op for a scope that is empty,
// longer than maxLen bytes (0: any length), not valid UTF-8 or holds a NUL
// byte.
func Scope(op, scope string, maxLen int) error {
	var why string
	switch {
	case scope == "":
		why = "empty"
	case maxLen > 0 && len(scope) > maxLen:
		why = fmt.Sprintf("%d bytes, longer than %d", len(scope), maxLen)
	case !utf8.ValidString(scope):
		why = "not valid UTF-8"
	case strings.IndexByte(scope, 0) >= 0:
		why = "contains a NUL byte"
	default:
		return nil
	}
	return effects.ConfigErrorf(op, "scope", "%q: %s", scope, why)
}

// MaxRetries checks the WithMaxRetries option of op.
func MaxRetries(op string, n int) error {
	if n < 0 {
		return effects.ConfigErrorf(op, "WithMaxRetries", "%d: negative; 0 disables retries", n)
	}
	return nil
}

// DefaultPruneBatch is the batch size of a prune given 0, and a Pruner's.
const DefaultPruneBatch = 1000

// PruneBatches runs del, which deletes up to limit rows in one statement
// and reports how many it deleted, until a statement deletes fewer than
// batchSize rows (0 means DefaultPruneBatch; negative is a ConfigError of
// op). It returns how many rows were deleted, also on an error.
func PruneBatches(ctx context.Context, op string, batchSize int, del func(ctx context.Context, limit int) (int64, error)) (int64, error) {
	switch {
	case batchSize < 0:
		return 0, effects.ConfigErrorf(op, "batchSize", "%d: negative; 0 means %d", batchSize, DefaultPruneBatch)
	case batchSize == 0:
		batchSize = DefaultPruneBatch
	}
	var deleted int64
	for {
		n, err := del(ctx, batchSize)
		if err != nil {
			return deleted, fmt.Errorf("%s: %w", op, err)
		}
		deleted += n
		if n < int64(batchSize) {
			return deleted, nil
		}
	}
}

// Defaults of a Pruner.
const (
	DefaultPruneRate     = 10000
	DefaultPruneInterval = time.Minute
)

// prunerBackoff paces a Pruner's attempts after failures, up to its
// interval.
var prunerBackoff = retry.Backoff{Min: time.Second, Max: DefaultPruneInterval}

// PrunerConfig is a Pruner's pacing and where it reports: the exported
// fields of an adapter's Pruner.
type PrunerConfig struct {
	Rate     float64 // keys deleted per second at most; 0: DefaultPruneRate
	Batch    int     // keys per statement; 0: DefaultPruneBatch
	Interval time.Duration
	Observer effects.Observer
	Logger   *slog.Logger // nil: slog.Default() when it logs
}

// Resolve checks an adapter Pruner's fields for op (a Pruner's Run) and
// replaces the zero values with the defaults. It returns a
// *effects.ConfigError naming the field (DB, Horizon, Rate, BatchSize,
// Interval) for a nil db or a negative value (NaN for Rate).
func (c *PrunerConfig) Resolve(op string, nilDB bool, horizon time.Duration) error {
	switch {
	case nilDB:
		return effects.ConfigErrorf(op, "DB", "nil")
	case horizon <= 0:
		return effects.ConfigErrorf(op, "Horizon", "%v: not positive", horizon)
	case !(c.Rate >= 0): // also NaN
		return effects.ConfigErrorf(op, "Rate", "%v keys/s: negative; 0 means %d", c.Rate, DefaultPruneRate)
	case c.Batch < 0:
		return effects.ConfigErrorf(op, "BatchSize", "%d: negative; 0 means %d", c.Batch, DefaultPruneBatch)
	case c.Interval < 0:
		return effects.ConfigErrorf(op, "Interval", "%v: negative; 0 means %v", c.Interval, DefaultPruneInterval)
	}
	if c.Rate == 0 {
		c.Rate = DefaultPruneRate
	}
	if c.Batch == 0 {
		c.Batch = DefaultPruneBatch
	}
	if c.Interval == 0 {
		c.Interval = DefaultPruneInterval
	}
	return nil
}

// Pruner is the loop of an adapter's Pruner: Delete runs one statement
// of up to limit keys older than the horizon; RefusedForGood says whether
// its error is one a retry cannot fix.
type Pruner struct {
	Component      string // "postgres.Pruner": the events' Component
	Scope          string
	Config         PrunerConfig
	Delete         func(ctx context.Context, limit int) (int64, error)
	RefusedForGood func(error) bool
}

// Run prunes until ctx is done and returns nil then, or returns an error
// that unwraps to effects.ErrInvalidConfig when a statement is refused
// for good. A statement that deleted n keys is followed by the next no
// sooner than n/Rate after it began; one that deleted fewer than Batch
// ends a pass, and the next begins after Interval; a failure is reported
// and retried after a pause that doubles up to Interval.
func (p *Pruner) Run(ctx context.Context) error {
	failures := 0
	for {
		began := time.Now()
		n, err := p.Delete(ctx, p.Config.Batch)
		took := time.Since(began)
		if err == nil {
			p.observe(ctx, effects.Event{Kind: effects.EventPruned, Count: n, Duration: took})
		}
		if ctx.Err() != nil {
			p.log(ctx, slog.LevelInfo, "effectively: pruner stopped")
			return nil
		}
		var pause time.Duration
		switch {
		case err != nil:
			err = fmt.Errorf("%s scope %q: %w", p.Component, p.Scope, err)
			if p.RefusedForGood(err) {
				p.report(ctx, took, err, 0, 0)
				return fmt.Errorf("%w: %w", effects.ErrInvalidConfig, err)
			}
			failures++
			pause = min(prunerBackoff.Delay(failures), p.Config.Interval)
			p.report(ctx, took, err, failures, pause)
		case n < int64(p.Config.Batch):
			failures = 0
			pause = p.Config.Interval // caught up
		default:
			failures = 0
			pause = time.Duration(float64(n)/p.Config.Rate*float64(time.Second)) - took
		}
		if retry.Sleep(ctx, pause) != nil {
			p.log(ctx, slog.LevelInfo, "effectively: pruner stopped")
			return nil
		}
	}
}

// report reports a failed statement: to the observer, or, without one,
// as a warning to the logger.
func (p *Pruner) report(ctx context.Context, took time.Duration, err error, failures int, pause time.Duration) {
	if p.Config.Observer != nil {
		p.observe(ctx, effects.Event{Kind: effects.EventFailed, Duration: took, Err: err})
		return
	}
	p.log(ctx, slog.LevelWarn, "effectively: prune failed", slog.Int("failures", failures),
		slog.Duration("pause", pause), slog.Any("error", err))
}

func (p *Pruner) observe(ctx context.Context, ev effects.Event) {
	if p.Config.Observer == nil {
		return
	}
	ev.Component = p.Component
	p.Config.Observer.Observe(ctx, ev)
}

// log writes a line to the logger when there is no observer.
func (p *Pruner) log(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	if p.Config.Observer != nil {
		return
	}
	l := p.Config.Logger
	if l == nil {
		l = slog.Default()
	}
	attrs = append([]slog.Attr{slog.String("component", p.Component), slog.String("scope", p.Scope)}, attrs...)
	l.LogAttrs(context.WithoutCancel(ctx), level, msg, attrs...)
}

// Canceled wraps err, which happened while ctx was done and before
// anything was committed, so that errors.Is(err, ctx.Err()) holds.
func Canceled(ctx context.Context, op string, key effects.Key, err error) error {
	if errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%s: nothing was committed: %w", Where(op, key), err)
	}
	return fmt.Errorf("%s: nothing was committed: %w: %w", Where(op, key), ctx.Err(), err)
}

// Where names an operation and, if there is one, its key, for messages.
func Where(op string, key effects.Key) string {
	if key == "" {
		return op
	}
	return fmt.Sprintf("%s key %q", op, key)
}
