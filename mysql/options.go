package mysql

import (
	"database/sql"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
	"effectively.dev/internal/sqlkeys"
)

// defaultMaxRetries is how often Apply retries a transaction that lost a
// race; see [WithMaxRetries].
const defaultMaxRetries = 5

// retryBackoff spaces those retries: a random pause between half and all
// of a ceiling that doubles from 2 ms up to 100 ms.
var retryBackoff = retry.Backoff{Min: 2 * time.Millisecond, Max: 100 * time.Millisecond}

// rollbackTimeout bounds a rollback, which runs even when the caller's
// context is done so that a healthy connection goes back to the pool.
const rollbackTimeout = 5 * time.Second

// An Option configures [New] and [NewJournal]: it is an [EffectOption]
// too. A nil Option is ignored.
type Option interface {
	EffectOption
	applyJournal(*durability)
}

// An EffectOption configures [New]. A nil EffectOption is ignored.
type EffectOption interface{ applyEffect(*effectConfig) }

// durability is what Check accepts; an [Option] sets it.
type durability struct {
	allowUnsafeFlush  bool
	allowUnsafeBinlog bool
}

// effectConfig is what New heeds.
type effectConfig struct {
	durability
	maxRetries int
	isolation  sql.IsolationLevel
}

type allOpt func(*durability)

func (f allOpt) applyJournal(c *durability)  { f(c) }
func (f allOpt) applyEffect(c *effectConfig) { f(&c.durability) }

type effectOpt func(*effectConfig)

func (f effectOpt) applyEffect(c *effectConfig) { f(c) }

// newEffectConfig applies opts and validates them for op.
func newEffectConfig(op string, opts []EffectOption) (effectConfig, error) {
	c := effectConfig{maxRetries: defaultMaxRetries}
	for _, o := range opts {
		if o != nil {
			o.applyEffect(&c)
		}
	}
	if err := sqlkeys.MaxRetries(op, c.maxRetries); err != nil {
		return c, err
	}
	if !validIsolation(c.isolation) {
		return c, effects.ConfigErrorf(op, "WithIsolation", "isolation level %s is not one MySQL has", c.isolation)
	}
	return c, nil
}

// newDurability applies opts.
func newDurability(opts []Option) durability {
	var c durability
	for _, o := range opts {
		if o != nil {
			o.applyJournal(&c)
		}
	}
	return c
}

func validIsolation(l sql.IsolationLevel) bool {
	switch l {
	case sql.LevelDefault, sql.LevelReadUncommitted, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable:
		return true
	}
	return false
}

// WithMaxRetries sets how many times Apply retries the whole transaction,
// after a short jittered backoff, when it lost a race: InnoDB chose it as
// a deadlock victim (1213), its lock wait timed out (1205), or the key's
// INSERT found the key taken and the lookup that followed found it gone.
// After the last retry Apply returns an [effects.ErrTransient] error: this
// call applied nothing. Default 5; 0 disables retries; a negative n is a
// ConfigError. The write function runs once per attempt, so it must do
// nothing outside the transaction.
func WithMaxRetries(n int) EffectOption {
	return effectOpt(func(c *effectConfig) { c.maxRetries = n })
}

// WithIsolation sets the isolation level of Apply's transactions, e.g.
// sql.LevelSerializable when the write reads before it writes; each
// transaction then costs one statement more (SET TRANSACTION ISOLATION
// LEVEL). The default is the server's (REPEATABLE READ unless configured),
// which is enough for the key itself: the primary key decides between
// concurrent duplicates at any level, and Apply looks a taken key up
// outside the transaction. A level MySQL does not have (snapshot,
// linearizable) is a ConfigError.
func WithIsolation(level sql.IsolationLevel) EffectOption {
	return effectOpt(func(c *effectConfig) { c.isolation = level })
}

// AllowUnsafeFlush makes Check accept innodb_flush_log_at_trx_commit set
// to 0 or 2 instead of failing with [ErrUnsafeDurability]. With 2 InnoDB
// writes its log at COMMIT but syncs it to disk about once a second, so an
// operating-system crash or a power loss loses the last second of
// acknowledged commits (a crash of the server alone loses nothing); with 0
// a crash of the server loses them too. A message acked after such a
// commit is gone, and so is its effect. Use it only when nothing is
// acknowledged on the strength of the commit (a backfill that can be
// re-run). [Effect.Check] and [Journal.Check] heed it.
func AllowUnsafeFlush() Option {
	return allOpt(func(c *durability) { c.allowUnsafeFlush = true })
}

// AllowUnsafeBinlogSync makes Check accept sync_binlog other than 1 while
// the binary log is on, instead of failing with [ErrUnsafeDurability].
// Then an operating-system crash can lose from the binary log transactions
// that InnoDB committed: replicas never get them, and a failover to one
// loses acknowledged effects (the old primary, recovered, may even roll
// them back). Use it only when no replica is ever promoted and OS crashes
// are accepted. [Effect.Check] and [Journal.Check] heed it.
func AllowUnsafeBinlogSync() Option {
	return allOpt(func(c *durability) { c.allowUnsafeBinlog = true })
}
