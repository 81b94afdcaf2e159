package effects

import (
	"context"
	"time"
)

// Journal keeps sent-records for effects whose owner cannot hold the key
// (email, a Kafka producer across sessions, Stripe past its key horizon).
// The adapter claims a key before the effect, does the effect, then records
// its reference:
//
//	rec, err := j.Begin(ctx, key, fp, effects.DefaultLease)
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
	// earlier; ErrInFlight when another attempt holds an unexpired lease;
	// ErrKeyReused when the key was begun with a different fingerprint.
	// Otherwise the caller holds the lease and should do the effect; Record
	// Attempt counts the attempts that began, so Attempt > 1 means an earlier
	// attempt may have done the effect already.
	Begin(ctx context.Context, key Key, fingerprint []byte, lease time.Duration) (Record, error)
	// Complete marks key done with the backend's reference. Completing a
	// done key again keeps the first reference. Completing a key that was
	// never begun fails and records nothing (a record without the
	// payload's fingerprint would replay for any payload).
	Complete(ctx context.Context, key Key, ref string) error
	// Release gives up the lease of attempt (the Record.Attempt that Begin
	// returned) on a key that is not done, after a failure that definitely
	// did not apply the effect, so the next attempt need not wait for the
	// lease to expire. The attempt number fences it: if the lease expired
	// and a later attempt took the key over, Release does nothing, so a slow
	// attempt can never free a lease that another attempt holds.
	Release(ctx context.Context, key Key, attempt int) error
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
	Lookup(ctx context.Context, key Key, fingerprint []byte) (Record, error)
	// MarkDone records key done with ref, creating its record with
	// fingerprint when key was never begun, and ending any lease on it. A
	// key already done keeps its first reference (and MarkDone returns
	// nil); a key recorded with another fingerprint is ErrKeyReused and
	// stays as it was.
	MarkDone(ctx context.Context, key Key, fingerprint []byte, ref string) error
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

// BatchJournal is a [DoneJournal] that can write the records of several
// effects in one transaction. [Plan.Run] uses it to commit its steps'
// records together: a lease-free step's MarkDone (see [DoneJournal]) is
// held back until the next Complete on the same journal in the same run
// (a leased step's record), or until the run ends, and then written with
// it in one CompleteAll: one commit instead of two, and none on the
// lease-free step's path. Every record still commits before Run returns,
// so what a record guards, a redelivery past the owner's own key horizon,
// is unchanged. What moves is when: the step's Apply returns before its
// record commits, and a concurrent redelivery meanwhile finds no record
// and calls the owner again, which replays it under its key (the same as
// before the record committed, only for longer). Only journals that are
// pointers are batched (records are grouped by journal). Package postgres
// implements it.
//
// A type that embeds a BatchJournal and overrides Complete or MarkDone
// (to count, trace or inject faults) must override CompleteAll too:
// otherwise the embedded CompleteAll writes records that its overrides
// never see.
type BatchJournal interface {
	DoneJournal
	// CompleteAll writes every completion as [Journal.Complete] (or, with
	// MarkDone set, [DoneJournal.MarkDone]) would write it alone, in one
	// transaction where the backend has them, and returns one error per
	// completion, in order (nil for the ones written or found done). A
	// failure of the transaction is every completion's error, and then
	// none of them was written (or, when the reply was lost, maybe all:
	// [ErrAmbiguous]; each call is idempotent, so retry them).
	CompleteAll(ctx context.Context, cs []Completion) []error
}

// Completion is one record for [BatchJournal.CompleteAll]: key done with
// ref, as Complete writes it, or, with MarkDone set, as MarkDone writes it
// with Fingerprint.
type Completion struct {
	Key         Key
	Ref         string
	MarkDone    bool
	Fingerprint []byte
}
