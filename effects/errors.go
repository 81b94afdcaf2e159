package effects

import (
	"context"
	"errors"
	"fmt"
)

// Sentinel errors. Adapters return them wrapped in an *[Error] (or wrap them
// with %w), so callers branch with errors.Is and still reach the vendor's
// error underneath with errors.As.
var (
	// ErrInvalidKey means the key is empty, too long, not UTF-8 or holds
	// control characters. Permanent: nothing was done, and retrying the same
	// key cannot succeed.
	ErrInvalidKey = errors.New("invalid idempotency key")

	// ErrKeyReused means the key was already used with a different payload.
	// Permanent, and never silently treated as a duplicate: two different
	// requests share a key, which is a bug in how keys are built.
	ErrKeyReused = errors.New("idempotency key reused with a different payload")

	// ErrInFlight means another attempt with the same key is running now (a
	// concurrent duplicate, or a crashed attempt whose lease has not expired).
	// Retry later with the same key; the other attempt's outcome will be
	// replayed.
	ErrInFlight = errors.New("another attempt with this idempotency key is in flight")

	// ErrAmbiguous means the outcome is unknown: the request may or may not
	// have been applied (a lost COMMIT reply, a connection cut after the
	// request was sent). Retrying with the same key resolves it: the retry
	// either applies the effect or replays the earlier one. Never retry an
	// ambiguous failure with a new key.
	ErrAmbiguous = errors.New("outcome unknown")

	// ErrTransient marks a failure after which nothing was applied and the
	// same key may be retried (a serialization failure, a refused
	// connection, a rate limit refused before any work). A failure that may
	// have applied the effect (most 5xx replies, a lost reply) is
	// ErrAmbiguous instead, even when the same key may be retried.
	ErrTransient = errors.New("transient failure")
)

// Error is the error adapters return. Kind is one of the sentinels above and
// decides errors.Is; Err is the underlying cause (often a vendor error such
// as *pgconn.PgError or *stripe.Error) and is reachable with errors.As.
type Error struct {
	// Kind is ErrInvalidKey, ErrKeyReused, ErrInFlight, ErrAmbiguous or
	// ErrTransient.
	Kind error
	// Op names the operation that failed, e.g. "postgres.Apply".
	Op string
	// Key is the idempotency key involved, if any.
	Key Key
	// Err is the underlying cause; may be nil.
	Err error
}

// Error describes what happened and what to do.
func (e *Error) Error() string {
	msg := e.Op
	if msg == "" {
		msg = "effects"
	}
	if e.Key != "" {
		k := string(e.Key)
		if len(k) > 64 {
			k = k[:64] + "..."
		}
		msg += fmt.Sprintf(" key %q", k)
	}
	msg += ": " + e.Kind.Error()
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	switch e.Kind {
	case ErrAmbiguous:
		msg += " (retry with the same key to resolve)"
	case ErrInFlight, ErrTransient:
		msg += " (retry later with the same key)"
	}
	return msg
}

// Is reports whether target is e's Kind.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// Ambiguous wraps err as an outcome-unknown failure of op on key.
func Ambiguous(op string, key Key, err error) error {
	return &Error{Kind: ErrAmbiguous, Op: op, Key: key, Err: err}
}

// Transient wraps err as a failure after which nothing was applied and the
// same key may be retried.
func Transient(op string, key Key, err error) error {
	return &Error{Kind: ErrTransient, Op: op, Key: key, Err: err}
}

// Retryable reports whether an Apply that failed with err may be retried with
// the same key and is expected to make progress: ErrAmbiguous, ErrInFlight
// and ErrTransient, and a context error that interrupted an attempt
// (context.Canceled, context.DeadlineExceeded), whose outcome the retry
// resolves. ErrInvalidKey and ErrKeyReused are permanent, and so is any
// error an adapter did not classify: an unknown failure is not retried
// blindly.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrKeyReused) {
		return false
	}
	return errors.Is(err, ErrAmbiguous) || errors.Is(err, ErrInFlight) ||
		errors.Is(err, ErrTransient) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
