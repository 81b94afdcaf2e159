// Package negcache keeps a Bloom filter of idempotency keys known to be
// committed, so that an effect can skip a pre-check query for keys that are
// certainly new. It is an optimization for replay storms and never the
// authority: the filter only decides whether a pre-check runs, never
// whether a write is skipped.
//
// The problem: re-feeding a million messages of which 99% already landed
// costs a million transactions (BEGIN, a claim that conflicts, ROLLBACK)
// just to learn that they are duplicates. A read-only pre-check (one
// SELECT on the key's primary key, such as postgres.Seen) answers that in
// one round trip and returns the stored reference, as the effect's Apply
// would. But on live traffic, where most keys are new, the same pre-check
// is a wasted round trip before every write. The filter removes that
// waste: a Bloom filter never says "not seen" for a key it holds, so when
// it says "not seen" the key was not committed by anyone who told the
// filter, and the pre-check is skipped: the effect's Apply runs at once.
// When it says "maybe seen", the pre-check runs, and if the key is not
// there after all (a false positive, or a key committed elsewhere and since
// pruned), Apply runs as usual, where ON CONFLICT, or whatever enforces the
// effect's key, decides.
//
// The rules that keep it honest:
//
//   - The filter only skips a pre-check. A key that is not in the filter
//     goes to Apply, and Apply is always idempotent on its own, so a key
//     committed by another process, a filter lost in a restart, or a filter
//     that was never warmed cost a transaction, never a duplicate.
//   - A "maybe seen" answer is confirmed by the authoritative pre-check,
//     which reads committed state; a false positive costs a SELECT.
//   - Keys are added only after their effect committed (Apply returned nil),
//     never before: a filter that learned a key from an attempt that rolled
//     back would still be safe here, but a filter that is only ever told the
//     truth is one nobody can later misuse as "seen, skip it".
//
// What it does not do: make a replay storm cheap by itself. A filter can
// never prove that a key was seen, so every duplicate still costs a pre-check
// round trip. What it buys is that the pre-check can stay on for all
// traffic, new keys paying nothing for it. For a large replay, batch the
// pre-check too: postgres.ApplyBatch with postgres.WithPrecheck(filter)
// looks up all the keys of a batch that the filter may have seen with one
// query, replays those found without a transaction, and claims only the
// rest (a *Filter is a postgres.KeyFilter); kafka.Replay with
// kafka.WithBatchSize hands a replay to it N records at a time. See the
// benchmark in this package's tests for what each way costs.
//
// Sizing: New(n, fp) sizes the filter for n keys at a false-positive rate
// fp (about 1.2 MB for a million keys at 1%). Past n keys the rate climbs
// (see [Filter.FalsePositiveRate]); build a bigger filter and warm it
// again, for instance with postgres.Keys.
package negcache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/bits-and-blooms/bloom/v3"

	"effectively.dev/effects"
)

// Filter is a Bloom filter of committed keys, safe for concurrent use.
// The zero value is not usable; create one with [New].
type Filter struct {
	mu    sync.RWMutex
	bf    *bloom.BloomFilter
	added atomic.Uint64
}

// New returns a filter sized for n keys with a false-positive rate of fp,
// which must be between 0 and 1 exclusive; n must be positive. A value
// out of range is an [*effects.ConfigError].
func New(n uint, fp float64) (*Filter, error) {
	const op = "negcache.New"
	if n == 0 {
		return nil, &effects.ConfigError{Op: op, Option: "n", Reason: "capacity 0; want the number of keys the filter should hold"}
	}
	if !(fp > 0 && fp < 1) {
		return nil, &effects.ConfigError{Op: op, Option: "fp", Reason: fmt.Sprintf("false-positive rate %v, want 0 < fp < 1", fp)}
	}
	return &Filter{bf: bloom.NewWithEstimates(n, fp)}, nil
}

// MaybeSeen reports whether key may have been added. False means it
// certainly was not: no [Filter.Add] call with it happened before.
func (f *Filter) MaybeSeen(key effects.Key) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.bf.TestString(string(key))
}

// Add records key. Call it only after the key's effect committed.
func (f *Filter) Add(key effects.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bf.AddString(string(key))
	f.added.Add(1)
}

// Added returns how many times Add was called (repeats included).
func (f *Filter) Added() uint64 { return f.added.Load() }

// FalsePositiveRate estimates the current false-positive rate from the
// filter's size and the number of Add calls: (1 - e^(-k·n/m))^k. Repeated
// keys make it an overestimate.
func (f *Filter) FalsePositiveRate() float64 {
	f.mu.RLock()
	m, k := float64(f.bf.Cap()), float64(f.bf.K())
	f.mu.RUnlock()
	n := float64(f.added.Load())
	return math.Pow(1-math.Exp(-k*n/m), k)
}

// Prechecked is an effect wrapped by [Precheck].
type Prechecked[In any] struct {
	eff  effects.Effect[In]
	f    *Filter
	seen func(ctx context.Context, key effects.Key, in In) (effects.Result, bool, error)

	skipped, checked, hits, lookupErrs atomic.Int64
}

var _ effects.Effect[struct{}] = (*Prechecked[struct{}])(nil)

// Precheck wraps eff so that Apply runs the pre-check seen only for keys
// that f says it may have seen, and adds keys to f after eff's Apply
// committed them.
//
// seen is an authoritative, read-only pre-check for key: found reports
// whether the key's effect was committed; when it was, res is what the
// effect's Apply would return for it now (Status Replayed and the stored
// Ref). It returns an error wrapping [effects.ErrKeyReused] when the key
// was committed with another payload. postgres.Seen is one:
//
//	func(ctx context.Context, key effects.Key, p Payment) (effects.Result, bool, error) {
//		fp, err := effects.FingerprintJSON(p)
//		if err != nil {
//			return effects.Result{}, false, err
//		}
//		return postgres.Seen(ctx, pool, "billing", key, fp)
//	}
//
// Apply then goes:
//
//   - f says "not seen": Apply calls eff.Apply directly (no pre-check).
//   - f says "maybe seen": Apply calls seen. Found: it returns seen's result
//     (Replayed, with the stored Ref) without calling eff.Apply. Key reused:
//     it returns that error. Not found: it calls eff.Apply. If seen fails
//     otherwise, Apply falls back to eff.Apply, which is the authority.
//   - eff.Apply returned nil (Applied or Replayed: the effect is
//     committed): the key is added to f.
//
// The wrapper declares eff's contract: it changes the cost of duplicates,
// not the guarantee. seen must read only committed state, as postgres.Seen
// does; a pre-check that answered "found" for a key whose effect might
// still roll back would lose that effect. A nil argument is an
// [*effects.ConfigError].
func Precheck[In any](eff effects.Effect[In], f *Filter, seen func(ctx context.Context, key effects.Key, in In) (res effects.Result, found bool, err error)) (*Prechecked[In], error) {
	const op = "negcache.Precheck"
	switch {
	case eff == nil:
		return nil, &effects.ConfigError{Op: op, Option: "eff", Reason: "nil effect"}
	case f == nil:
		return nil, &effects.ConfigError{Op: op, Option: "f", Reason: "nil filter"}
	case seen == nil:
		return nil, &effects.ConfigError{Op: op, Option: "seen", Reason: "nil lookup"}
	}
	return &Prechecked[In]{eff: eff, f: f, seen: seen}, nil
}

// Contract returns the wrapped effect's contract.
func (p *Prechecked[In]) Contract() effects.Contract { return p.eff.Contract() }

// Apply does the effect for in under key, once; see [Precheck].
func (p *Prechecked[In]) Apply(ctx context.Context, key effects.Key, in In) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	if !p.f.MaybeSeen(key) {
		p.skipped.Add(1)
	} else {
		p.checked.Add(1)
		res, found, err := p.seen(ctx, key, in)
		switch {
		case errors.Is(err, effects.ErrKeyReused):
			return effects.Result{}, err
		case err != nil:
			p.lookupErrs.Add(1) // fall back to the authority
		case found:
			p.hits.Add(1)
			return res, nil
		}
	}
	res, err := p.eff.Apply(ctx, key, in)
	if err == nil {
		p.f.Add(key) // committed: now, and only now, the filter may know it
	}
	return res, err
}

// PrecheckStats counts what a [Prechecked] effect's Apply did.
type PrecheckStats struct {
	// Skipped counts keys the filter had not seen: no pre-check ran.
	Skipped int64
	// Checked counts pre-checks run ("maybe seen"), and Hits those that
	// found the key committed and so replayed without a transaction.
	Checked, Hits int64
	// LookupErrors counts pre-checks that failed and fell back to Apply.
	LookupErrors int64
}

// Stats returns the counters.
func (p *Prechecked[In]) Stats() PrecheckStats {
	return PrecheckStats{Skipped: p.skipped.Load(), Checked: p.checked.Load(), Hits: p.hits.Load(), LookupErrors: p.lookupErrs.Load()}
}
