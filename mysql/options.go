package mysql

import (
	"database/sql"
	"slices"
	"strings"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
)

// DefaultMaxRetries is how often Apply retries a transaction that lost a
// race (a deadlock, a lock wait timeout, or a key taken concurrently and
// gone again when looked up) before it gives up; see [WithMaxRetries].
const DefaultMaxRetries = 5

// retryBackoff spaces those retries: a random pause between half and all
// of a ceiling that doubles from 2 ms up to 100 ms.
var retryBackoff = retry.Backoff{Min: 2 * time.Millisecond, Max: 100 * time.Millisecond}

// rollbackTimeout bounds a rollback, which runs even when the caller's
// context is done so that a healthy connection goes back to the pool.
const rollbackTimeout = 5 * time.Second

// An Option configures [New], [Effect.Check] and [NewJournal]; each says
// which options it heeds and returns an [*effects.ConfigError] for any
// other, so that a setting is never ignored silently. A nil Option is
// ignored.
type Option func(*config)

// Names of the options, for ConfigError and for what each function heeds.
const (
	optFingerprint     = "WithFingerprint"
	optMaxRetries      = "WithMaxRetries"
	optIsolation       = "WithIsolation"
	optUnsafeFlush     = "AllowUnsafeFlush"
	optUnsafeBinlogSyn = "AllowUnsafeBinlogSync"
)

// config is what the options recorded; newConfig validates it once.
type config struct {
	given             []string // names of the options given, in order
	fingerprint       any      // func(In) ([]byte, error), checked by New
	maxRetries        int
	isolation         sql.IsolationLevel
	allowUnsafeFlush  bool
	allowUnsafeBinlog bool
}

func (c *config) set(name string) { c.given = append(c.given, name) }

// newConfig records opts and validates them for op, which heeds only the
// options named in heeds.
func newConfig(op string, opts []Option, heeds ...string) (config, error) {
	c := config{maxRetries: DefaultMaxRetries}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	for _, name := range c.given {
		if !slices.Contains(heeds, name) {
			return c, &effects.ConfigError{Op: op, Option: name, Reason: "does not apply here; " + op + " heeds only " + strings.Join(heeds, ", ")}
		}
	}
	switch {
	case c.maxRetries < 0:
		return c, &effects.ConfigError{Op: op, Option: optMaxRetries, Reason: "negative; 0 disables retries"}
	case !validIsolation(c.isolation):
		return c, &effects.ConfigError{Op: op, Option: optIsolation, Reason: "isolation level " + c.isolation.String() + " is not one MySQL has"}
	case slices.Contains(c.given, optFingerprint) && c.fingerprint == nil:
		return c, &effects.ConfigError{Op: op, Option: optFingerprint, Reason: "nil function"}
	}
	return c, nil
}

func validIsolation(l sql.IsolationLevel) bool {
	switch l {
	case sql.LevelDefault, sql.LevelReadUncommitted, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable:
		return true
	}
	return false
}

// WithFingerprint sets how Apply fingerprints its input to detect a key
// reused with a different payload ([effects.ErrKeyReused]). The default is
// [effects.FingerprintJSON]. Fingerprint only what identifies the request,
// and make it deterministic: a field that changes between deliveries of the
// same message (a receive timestamp, a delivery count) turns every
// redelivery into ErrKeyReused. In must be the Effect's input type and f
// must not be nil, or New fails. [New] heeds it.
func WithFingerprint[In any](f func(In) ([]byte, error)) Option {
	return func(c *config) {
		c.set(optFingerprint)
		if f != nil {
			c.fingerprint = f
		}
	}
}

// WithMaxRetries sets how many times Apply retries the whole transaction,
// after a short jittered backoff, when it lost a race: InnoDB chose it as
// a deadlock victim (1213), its lock wait timed out (1205), or the key's
// INSERT found the key taken and the lookup that followed found it gone.
// After the last retry Apply returns an [effects.ErrTransient] error: this
// call applied nothing. Default [DefaultMaxRetries]; 0 disables retries; a
// negative n is a ConfigError. The write function runs once per attempt,
// so it must do nothing outside the transaction. [New] heeds it.
func WithMaxRetries(n int) Option {
	return func(c *config) { c.set(optMaxRetries); c.maxRetries = n }
}

// WithIsolation sets the isolation level of Apply's transactions, e.g.
// sql.LevelSerializable when the write reads before it writes; each
// transaction then costs one statement more (SET TRANSACTION ISOLATION
// LEVEL). The default is the server's (REPEATABLE READ unless configured),
// which is enough for the key itself: the primary key decides between
// concurrent duplicates at any level, and Apply looks a taken key up
// outside the transaction. [New] heeds it; a level MySQL does not have
// (snapshot, linearizable) is a ConfigError.
func WithIsolation(level sql.IsolationLevel) Option {
	return func(c *config) { c.set(optIsolation); c.isolation = level }
}

// AllowUnsafeFlush makes Check accept innodb_flush_log_at_trx_commit set
// to 0 or 2 instead of failing with [ErrUnsafeDurability]. With 2 InnoDB
// writes its log at COMMIT but syncs it to disk about once a second, so an
// operating-system crash or a power loss loses the last second of
// acknowledged commits (a crash of the server alone loses nothing); with 0
// a crash of the server loses them too. A message acked after such a
// commit is gone, and so is its effect. Use it only when nothing is
// acknowledged on the strength of the commit (a backfill that can be
// re-run). [Effect.Check] and [Journal.Check] heed it, through [New] and
// [NewJournal].
func AllowUnsafeFlush() Option {
	return func(c *config) { c.set(optUnsafeFlush); c.allowUnsafeFlush = true }
}

// AllowUnsafeBinlogSync makes Check accept sync_binlog other than 1 while
// the binary log is on, instead of failing with [ErrUnsafeDurability].
// Then an operating-system crash can lose from the binary log transactions
// that InnoDB committed: replicas never get them, and a failover to one
// loses acknowledged effects (the old primary, recovered, may even roll
// them back). Use it only when no replica is ever promoted and OS crashes
// are accepted. [Effect.Check] and [Journal.Check] heed it, through [New]
// and [NewJournal].
func AllowUnsafeBinlogSync() Option {
	return func(c *config) { c.set(optUnsafeBinlogSyn); c.allowUnsafeBinlog = true }
}
