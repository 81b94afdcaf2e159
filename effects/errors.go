package effects

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
)

// Sentinel errors. Adapters return them wrapped in an *[Error] (or wrap them
// with %w), so callers branch with errors.Is and still reach the vendor's
// error underneath with errors.As. Each belongs to one [Class]; see
// [ClassOf].
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
	// Retryable: retry later with the same key, and the other attempt's
	// outcome will be replayed. It is not a failed attempt: the effect is
	// being done. [RetryAfter] reports how long the other attempt may still
	// hold the key, when the adapter knows.
	ErrInFlight = errors.New("another attempt with this idempotency key is in flight")

	// ErrAmbiguous means the outcome is unknown: the request may or may not
	// have been applied (a lost COMMIT reply, a connection cut after the
	// request was sent). Retryable: retrying with the same key resolves it,
	// either applying the effect or replaying the earlier one. Never retry
	// an ambiguous failure with a new key.
	ErrAmbiguous = errors.New("outcome unknown")

	// ErrTransient marks a failure after which nothing was applied and the
	// same key may be retried (a serialization failure, a refused
	// connection, a rate limit refused before any work). Retryable. A
	// failure that may have applied the effect (most 5xx replies, a lost
	// reply) is ErrAmbiguous instead. The conformance suite checks the
	// promise: after ErrTransient, the effect is not there.
	ErrTransient = errors.New("transient failure")

	// ErrRefused means the effect's owner refused the request for good: a
	// card decline, an invalid request, an SMTP 5xx rejection, an S3 4xx
	// that is not about configuration. Permanent: nothing was applied, and
	// retrying the same key gets the same refusal (an owner that stores
	// responses by key, like Stripe, replays it).
	ErrRefused = errors.New("refused by the effect's owner")

	// ErrPoison marks a delivery that no retry can handle, such as a body
	// that does not parse. Permanent: a consumer dead-letters it at the
	// first attempt. Wrap it:
	//
	//	fmt.Errorf("decoding the event: %w: %w", effects.ErrPoison, err)
	ErrPoison = errors.New("poison delivery: retrying cannot succeed")

	// ErrPanic is what a *[PanicError] unwraps to: a handler or a plan step
	// panicked. Permanent: the same input panics again.
	ErrPanic = errors.New("panic")
)

// Class is what a caller should do after an error. Every error an adapter
// returns is in exactly one class other than [Unclassified], and [ClassOf]
// tells which.
type Class int

const (
	// Unclassified: no sentinel of this package is in the error's chain.
	// Adapters never return such errors; an application's own handler may.
	// A consumer retries them within its attempt budget.
	Unclassified Class = iota
	// Retryable: retry with the same key ([ErrAmbiguous],
	// [ErrInFlight], [ErrTransient], context.Canceled,
	// context.DeadlineExceeded).
	Retryable
	// Permanent: retrying cannot succeed; dead-letter the delivery
	// ([ErrInvalidKey], [ErrKeyReused], [ErrRefused], [ErrPoison],
	// [ErrPanic]).
	Permanent
	// InvalidConfig: the configuration is wrong (a bad credential, a missing
	// bucket, table or topic, an invalid option): stop the worker, fix the
	// configuration, restart; never dead-letter for it ([ErrInvalidConfig]).
	InvalidConfig
)

// String names the class: "unclassified", "retryable", "permanent" or
// "configuration".
func (c Class) String() string {
	switch c {
	case Unclassified:
		return "unclassified"
	case Retryable:
		return "retryable"
	case Permanent:
		return "permanent"
	case InvalidConfig:
		return "configuration"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// ClassOf returns err's class. When err's chain holds sentinels of several
// classes, configuration wins over permanent, and permanent over
// retryable: a retry of a key reused cannot succeed even if the reply was
// also cut short, and no retry succeeds before a wrong credential is fixed.
// ClassOf(nil) is Unclassified.
func ClassOf(err error) Class {
	switch {
	case err == nil:
		return Unclassified
	case errors.Is(err, ErrInvalidConfig):
		return InvalidConfig
	case errors.Is(err, ErrInvalidKey), errors.Is(err, ErrKeyReused), errors.Is(err, ErrRefused),
		errors.Is(err, ErrPoison), errors.Is(err, ErrPanic):
		return Permanent
	case errors.Is(err, ErrAmbiguous), errors.Is(err, ErrInFlight), errors.Is(err, ErrTransient),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Retryable
	}
	return Unclassified
}

// Error is the error adapters return. Kind is one of the sentinels above and
// decides errors.Is; Err is the underlying cause (often a vendor error such
// as *pgconn.PgError or *stripe.Error) and is reachable with errors.As.
type Error struct {
	// Kind is one of this package's sentinels: ErrInvalidKey,
	// ErrKeyReused, ErrInFlight, ErrAmbiguous, ErrTransient or ErrRefused.
	Kind error
	// Op names the operation that failed, e.g. "postgres.Apply".
	Op string
	// Key is the idempotency key involved, if any.
	Key Key
	// Err is the underlying cause; may be nil.
	Err error
	// RetryAfter, when positive, is the earliest a retry can make
	// progress: the rest of the lease another attempt holds
	// ([ErrInFlight]), or the owner's Retry-After. See [RetryAfter].
	RetryAfter time.Duration
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
	// The advice once, from the outermost *Error: a cause that is an
	// *Error already said it.
	var inner *Error
	if e.Err != nil && errors.As(e.Err, &inner) {
		return msg
	}
	if e.Key == "" { // a probe (a start-up check), not an effect: no key to retry with
		return msg
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

// Refused wraps err as the owner's definite refusal of op on key
// ([ErrRefused]).
func Refused(op string, key Key, err error) error {
	return &Error{Kind: ErrRefused, Op: op, Key: key, Err: err}
}

// RetryAfter returns the first positive [Error].RetryAfter in err's chain:
// how long a retry should wait to make progress. It reports false when no
// error in the chain says.
func RetryAfter(err error) (time.Duration, bool) {
	for err != nil {
		var e *Error
		if !errors.As(err, &e) {
			return 0, false
		}
		if e.RetryAfter > 0 {
			return e.RetryAfter, true
		}
		err = e.Err
	}
	return 0, false
}

// PanicError is a recovered panic: of a handler, a batch handler or a plan
// step. It unwraps to [ErrPanic], so it is in class [Permanent].
type PanicError struct {
	// Where names what panicked, e.g. `plan step "charge"`.
	Where string
	// Value is what was passed to panic.
	Value any
	// Stack is the panicking goroutine's stack.
	Stack []byte
}

// Error says "panic", where, and the value; the stack is in Stack.
func (e *PanicError) Error() string {
	return fmt.Sprintf("panic in %s: %v", e.Where, e.Value)
}

// Unwrap returns [ErrPanic].
func (e *PanicError) Unwrap() error { return ErrPanic }

// Recover turns a panic into a *[PanicError] stored in *err, for a
// deferred call:
//
//	defer effects.Recover("handler", &err)
//
// It does nothing when there is no panic.
func Recover(where string, err *error) {
	if v := recover(); v != nil {
		*err = &PanicError{Where: where, Value: v, Stack: debug.Stack()}
	}
}
