package conformance

import (
	"context"
	"testing"
	"time"

	"effectively.dev/effects"
)

// Harness connects the suite to one adapter and its backend. An adapter's
// test returns a fresh Harness from its [Maker] for every scenario.
type Harness[In any] interface {
	// Make builds a new instance of the adapter under test, as a process
	// would at start-up, with every connection to the backend going through
	// f (f.DialContext or f.Transport). The returned close function releases
	// the instance (pools, clients); the suite calls it when done. Make may
	// be called many times in one scenario, each with a new Faults.
	Make(ctx context.Context, f *Faults) (effects.Effect[In], func(), error)
	// Input returns the input to apply under key. Variant 0 is the ordinary
	// payload; variant 1 must differ from it in payload (the suite uses it to
	// reuse a key with another payload). The harness may embed key in the
	// input so that Count can find the effect; it must cope with invalid keys.
	Input(key effects.Key, variant int) In
	// Count returns how many times the effect applied under key is visible
	// in the backend itself (rows in a table without a unique index, object
	// versions, charges, records under read_committed, received messages),
	// never from the adapter's own bookkeeping. Count writes, not what
	// survives them: where a second write overwrites the first (a plain S3
	// bucket), count versions, or the duplicate can never be seen.
	Count(ctx context.Context, key effects.Key) (int, error)
	// Total returns the number of visible effects of all keys; the suite
	// uses it to prove that a refused call wrote nothing.
	Total(ctx context.Context) (int, error)
}

// Restarter is implemented by a Harness that can restart its backend (stop
// and start the same server with its data). The backend-restart scenario
// runs only when it is implemented.
type Restarter interface {
	Restart(ctx context.Context) error
}

// Maker returns a fresh Harness for one scenario. It starts or connects to
// the backend and registers cleanup with t.Cleanup; if the backend cannot be
// had it fails t (a missing server is a failure, not a skip).
type Maker[In any] func(t testing.TB) Harness[In]

// Option changes how the suite runs.
type Option func(*config)

type config struct {
	concurrency int
	stormKeys   int
	stormSeen   float64
	maxSweep    int
	timeout     time.Duration
	retryFor    time.Duration
	only        map[string]bool
}

func defaults() config {
	return config{
		concurrency: 16,
		stormKeys:   1000,
		stormSeen:   0.99,
		maxSweep:    64,
		timeout:     3 * time.Minute,
		retryFor:    30 * time.Second,
	}
}

// WithConcurrency sets how many goroutines apply one key at once in the
// concurrent-duplicates scenario (default 16, at least 16 counts as the
// full scenario).
func WithConcurrency(n int) Option { return func(c *config) { c.concurrency = n } }

// WithStorm sets the replay storm's size: keys in all, and the fraction
// already applied before the storm (default 1000 and 0.99).
func WithStorm(keys int, seen float64) Option {
	return func(c *config) { c.stormKeys, c.stormSeen = keys, seen }
}

// WithMaxSweep bounds how many round trips the fault sweeps visit (default
// 64); a clean apply with more round trips is swept up to this bound and the
// report says so.
func WithMaxSweep(n int) Option { return func(c *config) { c.maxSweep = n } }

// WithRetryFor bounds how long the suite keeps retrying a key whose Apply
// failed with a retryable error (default 30s). Adapters with leases (a
// Journal) need it longer than their lease.
func WithRetryFor(d time.Duration) Option { return func(c *config) { c.retryFor = d } }

// WithTimeout bounds each scenario (default 3 minutes).
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// Only runs just the named scenarios; the others are reported as not run.
func Only(names ...string) Option {
	return func(c *config) {
		c.only = map[string]bool{}
		for _, n := range names {
			c.only[n] = true
		}
	}
}
