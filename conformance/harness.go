package conformance

import (
	"context"
	"time"

	"effectively.dev/effects"
)

// Harness connects the effect suite ([Run]) to one adapter and its
// backend. An adapter's test gives [Run] a function that returns a
// fresh Harness for every scenario. Optional capabilities ([Restarter], [Ager],
// [BatchCounter], [CrashRestarter], [Attacher]) are further interfaces
// the same value may implement; a scenario that needs a missing one is
// reported as not run, and the fields it verifies as not verified, which
// fails [Run] unless [AllowUnverified] says why.
type Harness[In any] interface {
	// Make builds a new instance of the adapter under test, as a process
	// would at start-up, with every connection to the backend going through
	// f (f.DialContext or f.Transport). The returned close function releases
	// the instance (pools, clients); the suite calls it when done, and
	// before it retries a key after a fault on a new instance (a successor
	// process). Make may be called many times in one scenario, each with a
	// new Faults. Round trips that Make itself makes (a handshake, a
	// metadata request) are not swept: the sweeps count from the first
	// round trip after Make returned.
	Make(ctx context.Context, f *Faults) (effects.Effect[In], func(), error)
	// Input returns the input to apply under key. Variant 0 is the ordinary
	// payload; variant 1 must differ from it in payload (the suite uses it to
	// reuse a key with another payload). The harness may embed key in the
	// input so that Count can find the effect; it must cope with invalid
	// keys and with keys that differ only in letter case or Unicode
	// normalization.
	Input(key effects.Key, variant int) In
	// Count returns how many times the effect applied under key is visible
	// in the backend itself (rows in a table without a unique index, object
	// versions, charges, records under read_committed, received messages),
	// never from the adapter's own bookkeeping. Count writes, not what
	// survives them: where a second write overwrites the first (a plain S3
	// bucket), count versions, or the duplicate can never be seen. Keys
	// that differ in any byte are different keys.
	Count(ctx context.Context, key effects.Key) (int, error)
	// Total returns the number of visible effects of all keys; the suite
	// uses it to prove that a refused call wrote nothing and to measure the
	// backend's growth.
	Total(ctx context.Context) (int, error)
}

// Restarter is implemented by a harness (effect, journal) that can restart
// its backend with its data, as an operator does: a server is stopped
// cleanly and started again on the same address; an in-process backend
// (an embedded database, a store in process memory standing for a server)
// closes every handle it has open and opens them again over the same
// files or the same state, so that nothing an instance cached in a handle
// survives. The backend-restart scenarios run only when it is
// implemented.
type Restarter interface {
	Restart(ctx context.Context) error
}

// Ager is implemented by a Harness that can make its backend's records
// older, as if d more time had passed since every one of them was written:
// by moving the backend's clock forward (stripetest.WithClock, a clock the
// journal reads) or by moving stored timestamps back (UPDATE ... SET
// created_at = created_at - d). A backend whose clock cannot be moved
// may simply wait d, when the declared horizon is short enough for a test
// to wait it out. Age must reach whatever enforces the adapter's keys
// (the dedup table, the journal, the vendor's key store), and must not
// prune: pruning is the application's decision, which a Horizon of 0
// ("until pruned") leaves to it. The horizon scenario runs
// only when it is implemented, and without it the matrix reports the
// contract's Horizon as not verified.
type Ager interface {
	Age(ctx context.Context, d time.Duration) error
}

// BatchCounter is implemented by a Harness that can count the effects of
// many keys in one look at the backend (one query, one read of a topic,
// one listing). The replay storm counts every one of its keys, key by key
// through Count when this is not implemented.
type BatchCounter interface {
	// CountBatch returns, for each key in keys, what Count would return
	// for it, in the same order.
	CountBatch(ctx context.Context, keys []effects.Key) ([]int, error)
}

// Attacher is implemented by a Harness whose backend a second process can
// reach: a server on a loopback address, files on disk. Attachment returns
// what that process needs to connect (a connection string, an endpoint
// and a bucket), which [WithSuccessorProcess]'s attach function receives in
// the child process. The successor-process scenario runs only when the
// harness implements it and the option is given; one without the other is
// a mistake that fails the scenario.
type Attacher interface {
	Attachment() string
}
