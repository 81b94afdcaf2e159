package postgres

import (
	"github.com/jackc/pgx/v5"
)

// defaultMaxRetries is how often Apply retries a transaction that failed
// with a serialization failure or a deadlock before giving up.
const defaultMaxRetries = 5

// An Option configures [New]. [Claim] and [ClaimBatch] accept options too,
// and heed only [AllowAsyncCommit].
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	fingerprint      any // func(In) ([]byte, error), checked by New
	maxRetries       int
	isolation        pgx.TxIsoLevel
	allowAsyncCommit bool
}

func newConfig(opts []Option) config {
	c := config{maxRetries: defaultMaxRetries}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

// WithFingerprint sets how Apply fingerprints its input to detect a key
// reused with a different payload ([effects.ErrKeyReused]). The default is
// [effects.FingerprintJSON]. Fingerprint only what identifies the request,
// and make it deterministic: a field that changes between deliveries of the
// same message (a receive timestamp, a delivery count) turns every
// redelivery into ErrKeyReused. In must be the Effect's input type, or New
// fails.
func WithFingerprint[In any](f func(In) ([]byte, error)) Option {
	return optionFunc(func(c *config) { c.fingerprint = f })
}

// WithMaxRetries sets how many times Apply retries the whole transaction,
// after a short jittered backoff, when PostgreSQL aborts it with a
// serialization failure (40001) or a deadlock (40P01). After the last retry
// Apply returns an [effects.ErrTransient] error. Default 5; 0 disables
// retries. The write function runs once per attempt, so it must do nothing
// outside the transaction.
func WithMaxRetries(n int) Option {
	return optionFunc(func(c *config) { c.maxRetries = max(n, 0) })
}

// WithIsolation sets the isolation level of Apply's transactions, e.g.
// pgx.Serializable when the write reads before it writes. The default is the
// server's default_transaction_isolation (normally READ COMMITTED), which is
// enough for the claim itself: the primary key decides between concurrent
// duplicates at any level. At REPEATABLE READ and SERIALIZABLE a duplicate
// that commits while the claim waits makes the claim fail with 40001, which
// Apply retries, and the retry replays.
func WithIsolation(level pgx.TxIsoLevel) Option {
	return optionFunc(func(c *config) { c.isolation = level })
}

// AllowAsyncCommit lets claims run with synchronous_commit = off instead of
// failing with [ErrAsyncCommit]. Use it only when nothing is acknowledged on
// the strength of the commit, for example a backfill that can be re-run:
// after a server crash the last commits and their keys are gone, so an acked
// message would have lost its effect.
func AllowAsyncCommit() Option {
	return optionFunc(func(c *config) { c.allowAsyncCommit = true })
}
