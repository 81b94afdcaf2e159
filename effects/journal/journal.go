// Package journal is the kit for adapters whose effect's owner cannot
// hold the idempotency key for as long as messages can come back: email,
// a Kafka producer across sessions, an HTTP API past its key horizon. The
// adapter keeps a sent-record per key in a [Journal] and runs its call
// through [Journaled], which holds the protocol (Begin, replay or take the
// lease, the call, Complete or Release) and its failure policy once, for
// every such adapter.
//
// Users of adapters import package effects; authors of journal-backed
// adapters import this package too, as database/sql/driver sits beside
// database/sql. Package postgres implements a durable [Journal]; package
// memjournal is an in-memory one for tests and examples.
//
// The shortest correct use, inside an adapter's Apply:
//
//	j, err := journal.NewJournaled("email.Send", pgJournal)
//	...
//	return j.Apply(ctx, key, fingerprint, func(ctx context.Context, a *journal.Attempt) (effects.Result, error) {
//		ref, err := send(ctx, key, msg)
//		if err != nil {
//			return effects.Result{}, classify(err) // ErrAmbiguous, ErrTransient, ErrRefused, ...
//		}
//		return effects.Result{Status: effects.Applied, Ref: ref}, nil
//	})
package journal

import (
	"context"
	"time"

	"effectively.dev/effects"
)

// Journal keeps sent-records for effects whose owner cannot hold the key
// (email, a Kafka producer across sessions, Stripe past its key horizon).
// The adapter claims a key before the effect, does the effect, then records
// its reference:
//
//	rec, err := j.Begin(ctx, key, fp, time.Minute)
//	switch {
//	case err != nil: // ErrInFlight, ErrKeyReused, or a backend failure
//	case rec.Done:   // replay rec.Ref, do nothing
//	default:         // do the effect, then j.Complete(ctx, key, ref)
//	}
//
// Adapters do not write that protocol themselves: [Journaled] runs it,
// with one policy for journal errors, Complete's retries, the lease and an
// effect whose record did not commit, and the adapter supplies only its
// call and the classification of its errors.
//
// A journal cannot make such an effect effectively once: a crash after the
// effect and before Complete commits leaves the record pending, and when the
// lease expires the next attempt does the effect again. That is the
// duplicate window an adapter using a journal must declare.
//
// Package postgres implements Journal. Implementations must be safe for
// concurrent use.
type Journal interface {
	// Begin claims key for one attempt lasting at most lease. It returns a
	// Record with Done set (and the stored Ref) when the key was completed
	// earlier; ErrInFlight when another attempt holds an unexpired lease
	// (an *effects.Error whose RetryAfter is the rest of that lease, where
	// the journal knows it); ErrKeyReused when the key was begun with a
	// different fingerprint.
	// Otherwise the caller holds the lease and should do the effect; Record
	// Attempt counts the attempts that began, so Attempt > 1 means an earlier
	// attempt may have done the effect already.
	Begin(ctx context.Context, key effects.Key, fingerprint []byte, lease time.Duration) (Record, error)
	// Complete marks key done with the backend's reference. Completing a
	// done key again keeps the first reference. Completing a key that was
	// never begun fails and records nothing (a record without the
	// payload's fingerprint would replay for any payload).
	Complete(ctx context.Context, key effects.Key, ref string) error
	// Release gives up the lease of attempt (the Record.Attempt that Begin
	// returned) on a key that is not done, after a failure that definitely
	// did not apply the effect, so the next attempt need not wait for the
	// lease to expire. The attempt number fences it: if the lease expired
	// and a later attempt took the key over, Release does nothing, so a slow
	// attempt can never free a lease that another attempt holds.
	Release(ctx context.Context, key effects.Key, attempt int) error
}

// DoneJournal is a [Journal] that can also read a key without taking a
// lease and record a key done in one write, whether or not it was begun.
// [Journaled] uses it for effects whose owner dedups on the key itself
// ([WithOwnerIdempotency], Stripe's Idempotency-Key): the owner already
// answers a concurrent attempt with in-flight and a repeated one with a
// replay, so the lease adds nothing there, and Lookup, the call and
// MarkDone do the work of Begin, the call and Complete with one write to
// the journal instead of two. Package postgres implements it.
type DoneJournal interface {
	Journal
	// Lookup reads key without changing it. It returns a Record with Done
	// set and the stored Ref when key was completed; a zero Record when
	// key is unknown or begun and not done; ErrKeyReused when key was
	// begun or completed with another fingerprint.
	Lookup(ctx context.Context, key effects.Key, fingerprint []byte) (Record, error)
	// MarkDone records key done with ref, creating its record with
	// fingerprint when key was never begun, and ending any lease on it. A
	// key already done keeps its first reference (and MarkDone returns
	// nil); a key recorded with another fingerprint is ErrKeyReused and
	// stays as it was.
	MarkDone(ctx context.Context, key effects.Key, fingerprint []byte, ref string) error
}

// Record is a journal's view of one key.
type Record struct {
	// Done reports whether the effect was completed earlier.
	Done bool
	// Ref is the reference stored by Complete.
	Ref string
	// Attempt is the number of attempts begun for the key, this one
	// included, and the fencing token Release takes. Attempt > 1 means an
	// earlier attempt was released after a definite failure or its lease
	// expired; after an expiry it may have done the effect.
	Attempt int
}
