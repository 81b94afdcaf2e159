package postgres

import (
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
)

// DefaultMaxRetries is how often Apply and ApplyBatch retry a transaction
// that lost a race (a serialization failure, a deadlock, a key taken
// concurrently, or a write that failed while a concurrent Apply committed
// its key) before they give up; see [WithMaxRetries].
const DefaultMaxRetries = 5

// retryBackoff spaces those retries: a random pause between half and all
// of a ceiling that doubles from 2 ms up to 100 ms.
var retryBackoff = retry.Backoff{Min: 2 * time.Millisecond, Max: 100 * time.Millisecond}

// rollbackTimeout bounds a rollback, which runs even when the caller's
// context is done so that a healthy connection goes back to the pool.
const rollbackTimeout = 5 * time.Second

// An Option configures [New], [ApplyBatch], [Claim], [ClaimBatch], [Seen]
// and [SeenBatch]; each says which options it heeds and returns an
// [*effects.ConfigError] for any other, so that a setting is never ignored
// silently. A nil Option is ignored.
type Option func(*config)

// Names of the options, for ConfigError and for what each function heeds.
const (
	optFingerprint   = "WithFingerprint"
	optMaxRetries    = "WithMaxRetries"
	optIsolation     = "WithIsolation"
	optAsyncCommit   = "AllowAsyncCommit"
	optPrecheck      = "WithPrecheck"
	optLookupFirst   = "WithLookupFirst"
	optNoGroupCommit = "WithoutGroupCommit"
)

// config is what the options recorded; check validates it once.
type config struct {
	given            []string // names of the options given, in order
	fingerprint      any      // func(In) ([]byte, error), checked by New
	maxRetries       int
	isolation        pgx.TxIsoLevel
	allowAsyncCommit bool
	precheck         KeyFilter
	lookupFirst      bool
	noGroupCommit    bool
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
			return c, &effects.ConfigError{Op: op, Option: name, Reason: "does not apply here; " + op + " heeds only " + heedsList(heeds)}
		}
	}
	switch {
	case c.maxRetries < 0:
		return c, &effects.ConfigError{Op: op, Option: optMaxRetries, Reason: "negative; 0 disables retries"}
	case !validIsolation(c.isolation):
		return c, &effects.ConfigError{Op: op, Option: optIsolation, Reason: "unknown isolation level " + string(c.isolation)}
	case slices.Contains(c.given, optPrecheck) && c.precheck == nil:
		return c, &effects.ConfigError{Op: op, Option: optPrecheck, Reason: "nil filter"}
	case slices.Contains(c.given, optFingerprint) && c.fingerprint == nil:
		return c, &effects.ConfigError{Op: op, Option: optFingerprint, Reason: "nil function"}
	}
	return c, nil
}

func heedsList(names []string) string {
	if len(names) == 0 {
		return "no options"
	}
	return strings.Join(names, ", ")
}

func validIsolation(l pgx.TxIsoLevel) bool {
	switch l {
	case "", pgx.Serializable, pgx.RepeatableRead, pgx.ReadCommitted, pgx.ReadUncommitted:
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
// must not be nil, or New fails. [New] and [NewPipelined] heed it.
func WithFingerprint[In any](f func(In) ([]byte, error)) Option {
	return func(c *config) {
		c.set(optFingerprint)
		if f != nil {
			c.fingerprint = f
		}
	}
}

// WithMaxRetries sets how many times Apply and ApplyBatch retry the whole
// transaction, after a short jittered backoff, when it lost a race:
// PostgreSQL aborted it with a serialization failure (40001), a deadlock
// (40P01) or a lock not available (55P03: lock_timeout, NOWAIT), or a concurrent transaction committed the same key first (seen
// at the key's INSERT, or by Apply after its write failed). After the
// last retry they return an [effects.ErrTransient] error: this call
// applied nothing, and a retry with the same key replays what the other
// one committed. Default
// [DefaultMaxRetries]; 0 disables retries; a negative n is a ConfigError.
// The write function runs once per attempt, so it must do nothing outside
// the transaction. [New] and [ApplyBatch] heed it.
func WithMaxRetries(n int) Option {
	return func(c *config) { c.set(optMaxRetries); c.maxRetries = n }
}

// WithIsolation sets the isolation level of the transactions of Apply and
// ApplyBatch, e.g. pgx.Serializable when the write reads before it writes.
// The default is the server's default_transaction_isolation (normally READ
// COMMITTED), which is enough for the key itself: the primary key decides
// between concurrent duplicates at any level. At REPEATABLE READ and
// SERIALIZABLE a duplicate that commits while Apply waits for it is not in
// Apply's snapshot: Apply's own insert of the key then fails (23505 or
// 40001), the attempt rolls back and is retried, and the retry replays.
// [New] and [ApplyBatch] heed it; a level pgx does not define is a
// ConfigError.
func WithIsolation(level pgx.TxIsoLevel) Option {
	return func(c *config) { c.set(optIsolation); c.isolation = level }
}

// AllowAsyncCommit lets claims and replays run with synchronous_commit =
// off instead of failing with [ErrAsyncCommit]. Use it only when nothing
// is acknowledged on the strength of the commit, for example a backfill
// that can be re-run: after a server crash the last commits and their keys
// are gone, so an acked message would have lost its effect. Every function
// that takes options heeds it.
func AllowAsyncCommit() Option {
	return func(c *config) { c.set(optAsyncCommit); c.allowAsyncCommit = true }
}

// WithLookupFirst makes [Effect.Apply] look every key up before it runs
// the write, in BEGIN's round trip. By default a duplicate runs the
// statements of its write in a transaction that rolls back (their WAL
// written, sequence values used up, locks held until then) before it
// replays; looked up first, a new key pays one statement more (for
// [NewPipelined], one round trip more). Use it when duplicates are
// frequent (a worker that replays a topic with kafka.Replay, a redrive of
// dead letters), when the write is expensive, or when a duplicate's
// rolled-back write must not happen at all. [New] and [NewPipelined] heed
// it.
func WithLookupFirst() Option {
	return func(c *config) { c.set(optLookupFirst); c.lookupFirst = true }
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
// with one query ([SeenBatch]); those found committed with the same
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
// Only [ApplyBatch] heeds it.
func WithPrecheck(filter KeyFilter) Option {
	return func(c *config) { c.set(optPrecheck); c.precheck = filter }
}

// WithoutGroupCommit makes [New]'s Effect run every Apply in a
// transaction of its own, also when other Applies of the Effect run at the
// same moment: the shape of a lone Apply (see [Effect.Apply]), one COMMIT
// per Apply. By default concurrent Applies share transactions (group
// commit), and a member of a group waits for the writes of the members
// before it and commits with the last. Use it when the writes are slow or
// hold locks for long, so that each Apply commits as soon as its own write
// is done. [WithLookupFirst] has no grouped shape either. Only [New] heeds
// it.
func WithoutGroupCommit() Option {
	return func(c *config) { c.set(optNoGroupCommit); c.noGroupCommit = true }
}
