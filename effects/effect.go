package effects

import (
	"context"
	"fmt"
)

// Status says whether Apply did the effect now or found it done.
type Status int

const (
	// Applied: the effect was done by this call.
	Applied Status = iota + 1
	// Replayed: the effect was done earlier with this key (and, where the
	// contract detects key reuse, the same payload); nothing changed now.
	// "Earlier" includes this call's own earlier attempts: when an SDK
	// retries internally, or a caller retries after ErrAmbiguous, the
	// attempt that succeeds may find the first attempt's effect and report
	// Replayed. So count effects from the backend, not from Applied results.
	Replayed
)

// String returns "applied" or "replayed".
func (s Status) String() string {
	switch s {
	case Applied:
		return "applied"
	case Replayed:
		return "replayed"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// Result is the outcome of a successful Apply.
type Result struct {
	// Status is Applied or Replayed.
	Status Status
	// Ref is the backend's reference to the effect, the same on every replay
	// where the backend keeps it: a ledger row id, a PaymentIntent id
	// ("pi_..."), an object's ETag or version id, a Kafka partition and
	// offset, an SMTP queue id. Empty when the backend gives none.
	Ref string
}

// Replayed reports whether the effect had been done before this call.
func (r Result) Replayed() bool { return r.Status == Replayed }

// Effect is one kind of side effect, made idempotent by its owner.
//
// Apply does the effect for input in under key, or finds it done: it returns
// Status Applied the first time and Replayed afterwards, for the same key and
// payload, however often and however concurrently it is called. It validates
// key before any I/O ([ErrInvalidKey]). On failure it returns an error that
// [ClassOf] classifies; an [ErrAmbiguous] failure must be retried with the
// same key, never a new one.
//
// Contract declares what Apply guarantees; package conformance verifies it.
// Implementations must be safe for concurrent use.
type Effect[In any] interface {
	Contract() Contract
	Apply(ctx context.Context, key Key, in In) (Result, error)
}
