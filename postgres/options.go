package postgres

import (
	"time"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
	"effectively.dev/internal/sqlkeys"
)

// defaultMaxRetries is how often Apply and ApplyBatch retry a transaction
// that lost a race; see [WithMaxRetries].
const defaultMaxRetries = 5

// retryBackoff spaces those retries: a random pause between half and all
// of a ceiling that doubles from 2 ms up to 100 ms.
var retryBackoff = retry.Backoff{Min: 2 * time.Millisecond, Max: 100 * time.Millisecond}

// rollbackTimeout bounds a rollback, which runs even when the caller's
// context is done so that a healthy connection goes back to the pool.
const rollbackTimeout = 5 * time.Second

// An Option configures every function of this package that takes
// options: it is an [EffectOption] (for [New] and [NewPipelined]), a
// [BatchOption] (for [ApplyBatch]), and configures [Claim], [ClaimBatch],
// and [Seen]. A nil Option is ignored.
type Option interface {
	EffectOption
	BatchOption
	applyTx(*txConfig)
}

// An EffectOption configures [New] and [NewPipelined]. A nil EffectOption
// is ignored.
type EffectOption interface{ applyEffect(*effectConfig) }

// A BatchOption configures [ApplyBatch]. A nil BatchOption is ignored.
type BatchOption interface{ applyBatch(*batchConfig) }

// A TxOption configures the transactions of [New], [NewPipelined] and
// [ApplyBatch]: it is an [EffectOption] and a [BatchOption].
type TxOption interface {
	EffectOption
	BatchOption
}

// txConfig is what every function that writes or reads keys heeds.
type txConfig struct {
	allowAsyncCommit bool
}

// retryConfig is what a [TxOption] sets.
type retryConfig struct {
	maxRetries int
	isolation  pgx.TxIsoLevel
}

// check returns a *effects.ConfigError of op for an invalid value.
func (c *retryConfig) check(op string) error {
	if err := sqlkeys.MaxRetries(op, c.maxRetries); err != nil {
		return err
	}
	if !validIsolation(c.isolation) {
		return effects.ConfigErrorf(op, "WithIsolation", "unknown isolation level %q", c.isolation)
	}
	return nil
}

// effectConfig is what New and NewPipelined heed.
type effectConfig struct {
	txConfig
	retryConfig
	lookupFirst   bool
	noGroupCommit bool
}

// batchConfig is what ApplyBatch heeds.
type batchConfig struct {
	txConfig
	retryConfig
	precheck    KeyFilter
	precheckSet bool
}

type allOpt func(*txConfig)

func (f allOpt) applyTx(c *txConfig)         { f(c) }
func (f allOpt) applyEffect(c *effectConfig) { f(&c.txConfig) }
func (f allOpt) applyBatch(c *batchConfig)   { f(&c.txConfig) }

type retryOpt func(*retryConfig)

func (f retryOpt) applyEffect(c *effectConfig) { f(&c.retryConfig) }
func (f retryOpt) applyBatch(c *batchConfig)   { f(&c.retryConfig) }

type effectOpt func(*effectConfig)

func (f effectOpt) applyEffect(c *effectConfig) { f(c) }

type batchOpt func(*batchConfig)

func (f batchOpt) applyBatch(c *batchConfig) { f(c) }

// newEffectConfig applies opts for op.
func newEffectConfig(op string, opts []EffectOption) (effectConfig, error) {
	c := effectConfig{retryConfig: retryConfig{maxRetries: defaultMaxRetries}}
	for _, o := range opts {
		if o != nil {
			o.applyEffect(&c)
		}
	}
	return c, c.check(op)
}

// newBatchConfig applies opts for op.
func newBatchConfig(op string, opts []BatchOption) (batchConfig, error) {
	c := batchConfig{retryConfig: retryConfig{maxRetries: defaultMaxRetries}}
	for _, o := range opts {
		if o != nil {
			o.applyBatch(&c)
		}
	}
	if c.precheckSet && c.precheck == nil {
		return c, effects.ConfigErrorf(op, "WithPrecheck", "nil filter")
	}
	return c, c.check(op)
}

// newTxConfig applies opts.
func newTxConfig(opts []Option) txConfig {
	var c txConfig
	for _, o := range opts {
		if o != nil {
			o.applyTx(&c)
		}
	}
	return c
}

func validIsolation(l pgx.TxIsoLevel) bool {
	switch l {
	case "", pgx.Serializable, pgx.RepeatableRead, pgx.ReadCommitted, pgx.ReadUncommitted:
		return true
	}
	return false
}

// WithMaxRetries sets how many times Apply and ApplyBatch retry the whole
// transaction, after a short jittered backoff, when it lost a race:
// PostgreSQL aborted it with a serialization failure (40001), a deadlock
// (40P01) or a lock not available (55P03: lock_timeout, NOWAIT), or a concurrent transaction committed the same key first (seen
// at the key's INSERT, or by Apply after its write failed). After the
// last retry they return an [effects.ErrTransient] error: this call
// applied nothing, and a retry with the same key replays what the other
// one committed. Default
// 5; 0 disables retries; a negative n is a ConfigError.
// The write function runs once per attempt, so it must do nothing outside
// the transaction.
func WithMaxRetries(n int) TxOption {
	return retryOpt(func(c *retryConfig) { c.maxRetries = n })
}

// WithIsolation sets the isolation level of the transactions of Apply and
// ApplyBatch, e.g. pgx.Serializable when the write reads before it writes.
// The default is the server's default_transaction_isolation (normally READ
// COMMITTED), which is enough for the key itself: the primary key decides
// between concurrent duplicates at any level. At REPEATABLE READ and
// SERIALIZABLE a duplicate that commits while Apply waits for it is not in
// Apply's snapshot: Apply's own insert of the key then fails (23505 or
// 40001), the attempt rolls back and is retried, and the retry replays.
// A level pgx does not define is a ConfigError.
func WithIsolation(level pgx.TxIsoLevel) TxOption {
	return retryOpt(func(c *retryConfig) { c.isolation = level })
}

// AllowAsyncCommit lets claims and replays run with synchronous_commit =
// off instead of failing with [ErrAsyncCommit]. Use it only when nothing
// is acknowledged on the strength of the commit, for example a backfill
// that can be re-run: after a server crash the last commits and their keys
// are gone, so an acked message would have lost its effect. Every function
// that takes options heeds it.
func AllowAsyncCommit() Option {
	return allOpt(func(c *txConfig) { c.allowAsyncCommit = true })
}

// WithLookupFirst makes [Effect.Apply] look every key up before it runs
// the write, in BEGIN's round trip. By default a duplicate runs the
// statements of its write in a transaction that rolls back (their WAL
// written, sequence values used up, locks held until then) before it
// replays; looked up first, a new key pays one statement more (for
// [NewPipelined], one round trip more). Use it when duplicates are
// frequent (a worker that replays a topic with kafka.Replay, a redrive of
// dead letters), when the write is expensive, or when a duplicate's
// rolled-back write must not happen at all.
func WithLookupFirst() EffectOption {
	return effectOpt(func(c *effectConfig) { c.lookupFirst = true })
}

// KeyFilter is what [WithPrecheck] needs: a set of keys known to be
// committed that may answer "maybe" for keys it does not hold but never
// "no" for one it does. *negcache.Filter is one.
type KeyFilter interface {
	// MaybeSeen reports whether key may have been added; false means it
	// certainly was not.
	MaybeSeen(key effects.Key) bool
	// Add records a key whose effect committed.
	Add(key effects.Key)
}

// WithPrecheck makes [ApplyBatch] run a read-only pre-check first, gated by
// filter: the items whose key filter says it may have seen are looked up
// with one query; those found committed with the same
// fingerprint replay without a transaction, those found with another
// fingerprint get [effects.ErrKeyReused], and only the rest (the keys the
// filter has never seen, and its false positives) go through the claiming
// transaction. After that transaction committed, its keys are added to
// filter. On a replay storm, where most keys are committed, a batch costs
// one query plus one small transaction instead of a transaction that claims
// every key; on live traffic the filter skips the query. A pre-check query
// that fails is not an error: the transaction, which is the authority,
// then decides for every item. Under synchronous replication the replays
// wait for the standby, as Apply's do (see [Seen]). filter must not be nil.
func WithPrecheck(filter KeyFilter) BatchOption {
	return batchOpt(func(c *batchConfig) { c.precheck, c.precheckSet = filter, true })
}

// WithoutGroupCommit makes [New]'s Effect run every Apply in a
// transaction of its own, also when other Applies of the Effect run at the
// same moment: the shape of a lone Apply (see [Effect.Apply]), one COMMIT
// per Apply. By default concurrent Applies share transactions (group
// commit), and a member of a group waits for the writes of the members
// before it and commits with the last. Use it when the writes are slow or
// hold locks for long, so that each Apply commits as soon as its own write
// is done. [WithLookupFirst] has no grouped shape either. [NewPipelined]
// has no grouped shape: it returns an [*effects.ConfigError] for it.
func WithoutGroupCommit() EffectOption {
	return effectOpt(func(c *effectConfig) { c.noGroupCommit = true })
}
