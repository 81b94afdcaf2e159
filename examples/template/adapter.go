// Package template is a skeleton adapter to copy: an effectively-once
// effect over a small key/value "ledger" kept in process memory. Replace
// the Backend with your client and keep the shape: every backend call goes
// through a [Caller] (so the conformance suite can fault it), the key is
// validated before any call, and every error is classified by what the
// backend may have applied (see README.md, the checklist).
package template

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"effectively.dev/effects"
)

// Entry is the input of one Apply: a ledger entry.
type Entry struct {
	Account string
	Amount  int64
}

// ErrClosed is what a backend call on a handle closed by
// [Backend.Restart] returns: nothing was applied; open a new handle.
var ErrClosed = errors.New("template: backend handle closed")

// RefusalError is the backend's definite refusal of an entry: it applied
// nothing and never will for this entry.
type RefusalError struct{ Reason string }

// Error says why the entry was refused.
func (e *RefusalError) Error() string { return "template: refused: " + e.Reason }

// Backend stands for the server or store an adapter talks to. It outlives
// adapter instances: a successor process builds a new [Adapter] over the
// same Backend. Each record (the dedup row) is written with its entry in
// one atomic step, which is what makes the effect effectively-once.
type Backend struct {
	// AsyncCommit stands for a durability setting to refuse (postgres's
	// synchronous_commit=off, a broker's acks=1): writes acknowledged
	// before they are durable. [Adapter.Check] reports it as a config
	// error.
	AsyncCommit bool

	mu      sync.Mutex
	handle  int64 // the open handle; Restart opens a new one
	records map[effects.Key]record
	entries map[effects.Key]int // effects written, per key: what the harness counts
	total   int
	seq     int
}

// record is a key's dedup record: the payload's fingerprint, the first
// Apply's ref, and when it was written (a backend that expires keys reads
// it; this one keeps them until pruned).
type record struct {
	fp, ref string
	at      time.Time
}

// NewBackend returns an empty, durable backend.
func NewBackend() *Backend {
	return &Backend{handle: 1, records: map[effects.Key]record{}, entries: map[effects.Key]int{}}
}

// open returns the backend's current handle, as connecting would.
func (b *Backend) open() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.handle
}

// Restart closes every open handle, keeping the committed state: calls on
// an old handle return [ErrClosed].
func (b *Backend) Restart() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.handle++
}

// do runs fn as one backend call on handle h, atomically.
func (b *Backend) do(h int64, fn func() error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h != b.handle {
		return ErrClosed
	}
	return fn()
}

// Caller runs one backend call. *conformance.Faults implements it
// (RoundTrip), so the conformance harness passes its Faults and the suite
// faults every call as it would a network round trip.
type Caller interface {
	RoundTrip(ctx context.Context, fn func() error) error
}

// direct is the production Caller: the call itself.
type direct struct{}

func (direct) RoundTrip(ctx context.Context, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return fn()
}

// Option configures [New].
type Option func(*Adapter)

// WithCaller runs every backend call through c (default: the call itself).
func WithCaller(c Caller) Option { return func(a *Adapter) { a.calls = c } }

// Adapter is the effect: it implements effects.Effect[Entry] and
// effects.Checker.
type Adapter struct {
	b      *Backend
	calls  Caller
	handle atomic.Int64
}

var (
	_ effects.Effect[Entry] = (*Adapter)(nil)
	_ effects.Checker       = (*Adapter)(nil)
)

// New returns an adapter over b. A missing backend is a
// *effects.ConfigError; options only record values and are validated here.
func New(b *Backend, opts ...Option) (*Adapter, error) {
	if b == nil {
		return nil, &effects.ConfigError{Op: "template.New", Option: "backend", Reason: "is nil"}
	}
	a := &Adapter{b: b, calls: direct{}}
	for _, o := range opts {
		if o != nil {
			o(a)
		}
	}
	if a.calls == nil {
		return nil, &effects.ConfigError{Op: "template.New", Option: "WithCaller", Reason: "is nil"}
	}
	a.handle.Store(b.open())
	return a, nil
}

// Contract declares what the suite verifies: one effect per key, records
// kept until pruned (Horizon 0), key reuse detected.
func (a *Adapter) Contract() effects.Contract {
	return effects.Contract{
		Guarantee:       effects.EffectivelyOnce,
		Enforcer:        "the backend's record, written with the entry in one step",
		DetectsKeyReuse: true,
	}
}

// call runs fn as one backend call on the adapter's handle. On a closed
// handle it opens a new one for the next call and returns ErrClosed.
func (a *Adapter) call(ctx context.Context, fn func() error) error {
	h := a.handle.Load()
	err := a.calls.RoundTrip(ctx, func() error { return a.b.do(h, fn) })
	if errors.Is(err, ErrClosed) {
		a.handle.CompareAndSwap(h, a.b.open())
	}
	return err
}

// Check probes the backend's configuration (effects.Checker): a backend
// that acknowledges writes before they are durable is a config error.
func (a *Adapter) Check(ctx context.Context) error {
	var async bool
	if err := a.call(ctx, func() error { async = a.b.AsyncCommit; return nil }); err != nil {
		return fmt.Errorf("template.Check: backend unreachable: %w", err) // retryable: the setting may be right
	}
	if async {
		return &effects.ConfigError{Op: "template.Check", Option: "backend AsyncCommit",
			Reason: "acknowledges writes before they are durable; an acknowledged effect could be lost"}
	}
	return nil
}

// Apply writes in under key once. A redelivery of the same key and entry
// replays the first Result; another entry under the key is ErrKeyReused.
func (a *Adapter) Apply(ctx context.Context, key effects.Key, in Entry) (effects.Result, error) {
	const op = "template.Apply"
	if err := key.Validate(); err != nil { // before any I/O: ErrInvalidKey, permanent
		return effects.Result{}, err
	}
	fp := string(effects.Fingerprint([]byte(in.Account), binary.BigEndian.AppendUint64(nil, uint64(in.Amount))))

	// 1. Look the key up. A lookup applies nothing: any error is transient.
	var (
		rec   record
		found bool
	)
	if err := a.call(ctx, func() error { rec, found = a.b.records[key]; return nil }); err != nil {
		return effects.Result{}, effects.Transient(op, key, err)
	}

	// 2. Commit the record and the entry in one step, unless another
	// attempt committed first (rec then holds its record).
	created := false
	if !found {
		err := a.call(ctx, func() error {
			if r, ok := a.b.records[key]; ok {
				rec = r
				return nil
			}
			if in.Amount == 0 {
				return &RefusalError{Reason: "zero amount"}
			}
			a.b.seq++
			rec = record{fp: fp, ref: fmt.Sprintf("entry-%d", a.b.seq), at: time.Now()}
			a.b.records[key] = rec
			a.b.entries[key]++
			a.b.total++
			created = true
			return nil
		})
		var refused *RefusalError
		switch {
		case errors.As(err, &refused): // the backend guarantees nothing was applied
			return effects.Result{}, effects.Refused(op, key, err)
		case errors.Is(err, ErrClosed): // the call never reached the store
			return effects.Result{}, effects.Transient(op, key, err)
		case err != nil: // a lost reply, a cancel, a timeout: it may have committed
			return effects.Result{}, effects.Ambiguous(op, key, err)
		}
	}

	switch {
	case rec.fp != fp:
		return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Op: op, Key: key}
	case created:
		return effects.Result{Status: effects.Applied, Ref: rec.ref}, nil
	}
	return effects.Result{Status: effects.Replayed, Ref: rec.ref}, nil
}

// Counts returns the entries written under each of keys and the total
// written, read from the backend's own state: what a conformance harness
// counts (rows, object versions, messages).
func (b *Backend) Counts(keys []effects.Key) ([]int, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := make([]int, len(keys))
	for i, k := range keys {
		n[i] = b.entries[k]
	}
	return n, b.total
}

// Age makes every record d older, as if d had passed; it prunes nothing.
// A backend that expires keys must honour the adapter's declared Horizon.
func (b *Backend) Age(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, r := range b.records {
		r.at = r.at.Add(-d)
		b.records[k] = r
	}
}
