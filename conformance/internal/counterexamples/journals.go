package counterexamples

import (
	"context"
	"errors"
	"sync"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
)

// Journals that break the [journal.Journal] contract, each in one way, to
// prove conformance.RunJournal. Each wraps an honest in-memory journal and
// changes one thing.

// TwoLeases lets a second attempt take a lease that another attempt
// holds: when the journal says ErrInFlight it grants the lease anyway.
// Two attempts then do the effect at once. Caught by lease,
// concurrent-begin and crashed-holder.
type TwoLeases struct{ *memjournal.Journal }

// Begin grants the lease even while another attempt holds it.
func (j TwoLeases) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (journal.Record, error) {
	rec, err := j.Journal.Begin(ctx, key, fp, lease)
	if errors.Is(err, effects.ErrInFlight) {
		return journal.Record{Attempt: j.Get(key).Attempt}, nil
	}
	return rec, err
}

// UnfencedRelease ignores the attempt number in Release: a slow attempt
// whose lease expired frees the lease of the attempt that took over.
// Caught by fencing.
type UnfencedRelease struct{ *memjournal.Journal }

// Release releases whatever attempt holds the key.
func (j UnfencedRelease) Release(ctx context.Context, key effects.Key, _ int) error {
	return j.Journal.Release(ctx, key, j.Get(key).Attempt)
}

// NoExpiry never lets a lease expire: a crashed holder blocks its key
// forever. Caught by lease-expiry and crashed-holder.
type NoExpiry struct{ *memjournal.Journal }

// Begin asks for a lease of a hundred years.
func (j NoExpiry) Begin(ctx context.Context, key effects.Key, fp []byte, _ time.Duration) (journal.Record, error) {
	return j.Journal.Begin(ctx, key, fp, 100*365*24*time.Hour)
}

// LastRefWins overwrites the reference on every Complete, so a slow
// attempt's late Complete replaces the reference that replays returned.
// Caught by complete-keeps-first-ref.
type LastRefWins struct {
	*memjournal.Journal
	mu   sync.Mutex
	refs map[effects.Key]string
}

// NewLastRefWins returns a LastRefWins over a new in-memory journal.
func NewLastRefWins() *LastRefWins {
	return &LastRefWins{Journal: memjournal.New(nil), refs: map[effects.Key]string{}}
}

// Complete records ref, replacing any earlier one.
func (j *LastRefWins) Complete(ctx context.Context, key effects.Key, ref string) error {
	if err := j.Journal.Complete(ctx, key, ref); err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.refs[key] = ref
	return nil
}

// Begin returns the last reference of a done key.
func (j *LastRefWins) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (journal.Record, error) {
	rec, err := j.Journal.Begin(ctx, key, fp, lease)
	if err == nil && rec.Done {
		j.mu.Lock()
		rec.Ref = j.refs[key]
		j.mu.Unlock()
	}
	return rec, err
}

// LookupIgnoresFingerprint answers Lookup by the key alone: a key reused
// with another payload replays the first payload's reference instead of
// being refused, so an owner-keyed effect reports someone else's object.
// Caught by lookup-mark-done.
type LookupIgnoresFingerprint struct{ *memjournal.Journal }

// Lookup looks key up with the stored fingerprint, whatever fp is.
func (j LookupIgnoresFingerprint) Lookup(ctx context.Context, key effects.Key, fp []byte) (journal.Record, error) {
	if stored := j.Get(key).Fingerprint; stored != nil {
		fp = stored
	}
	return j.Journal.Lookup(ctx, key, fp)
}

// MarkDoneNeedsBegin records nothing for a key that was never begun, as
// Complete would, yet reports success: an owner-keyed effect done without
// a lease is never recorded, and a redelivery past the owner's horizon
// does it again. Caught by lookup-mark-done.
type MarkDoneNeedsBegin struct{ *memjournal.Journal }

// MarkDone does nothing, successfully, for a key without a record.
func (j MarkDoneNeedsBegin) MarkDone(ctx context.Context, key effects.Key, fp []byte, ref string) error {
	if j.Get(key).Fingerprint == nil {
		return nil
	}
	return j.Journal.MarkDone(ctx, key, fp, ref)
}

// CompleteCreates records a key it was asked to Complete without a Begin:
// the record has no fingerprint, so a later attempt at the key, whatever
// its payload, finds it taken. Caught by complete-keeps-first-ref.
type CompleteCreates struct{ *memjournal.Journal }

// Complete marks a key never begun done, with no fingerprint.
func (j CompleteCreates) Complete(ctx context.Context, key effects.Key, ref string) error {
	if j.Get(key).Fingerprint == nil {
		return j.Journal.MarkDone(ctx, key, nil, ref)
	}
	return j.Journal.Complete(ctx, key, ref)
}

// FingerprintOnTakeover checks the fingerprint only while a lease is live
// or the key is done: a Begin with another payload after the lease expired
// or was released takes the key over, so two payloads share one key.
// Caught by lease-expiry and key-reuse.
type FingerprintOnTakeover struct{ *memjournal.Journal }

// Begin takes over a free, pending key whatever fp is.
func (j FingerprintOnTakeover) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (journal.Record, error) {
	if r := j.Get(key); r.Fingerprint != nil && !r.Done && !r.LeaseUntil.After(time.Now()) {
		fp = r.Fingerprint
	}
	return j.Journal.Begin(ctx, key, fp, lease)
}

// ShortLease grants at most 200 ms whatever lease is asked for: an
// attempt that runs longer has a second attempt start beside it. Caught
// by lease-expiry (a lease longer than the scenario waits must still
// hold).
type ShortLease struct{ *memjournal.Journal }

// Begin caps lease at 200 ms.
func (j ShortLease) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (journal.Record, error) {
	return j.Journal.Begin(ctx, key, fp, min(lease, 200*time.Millisecond))
}

// EmptyRefNotDone takes an empty reference for "not done": Complete and
// MarkDone with ref "" release the key instead of marking it done, so an
// effect with nothing to refer to is done again on every redelivery.
// Caught by complete-keeps-first-ref and lookup-mark-done.
type EmptyRefNotDone struct{ *memjournal.Journal }

// Complete with an empty ref releases the lease.
func (j EmptyRefNotDone) Complete(ctx context.Context, key effects.Key, ref string) error {
	if ref == "" {
		return j.Journal.Release(ctx, key, j.Get(key).Attempt)
	}
	return j.Journal.Complete(ctx, key, ref)
}

// MarkDone with an empty ref records nothing.
func (j EmptyRefNotDone) MarkDone(ctx context.Context, key effects.Key, fp []byte, ref string) error {
	if ref == "" {
		return nil
	}
	return j.Journal.MarkDone(ctx, key, fp, ref)
}

// ReleaseMarksDone answers Lookup "done" for a key whose lease was
// released, as if a record that is not pending any more were complete: an
// owner-keyed effect whose attempt failed and released is never done.
// Caught by lookup-mark-done.
type ReleaseMarksDone struct{ *memjournal.Journal }

// Lookup reports a released key as done, with no reference.
func (j ReleaseMarksDone) Lookup(ctx context.Context, key effects.Key, fp []byte) (journal.Record, error) {
	rec, err := j.Journal.Lookup(ctx, key, fp)
	if r := j.Get(key); err == nil && !rec.Done && r.Fingerprint != nil && r.Attempt > 0 && !r.LeaseUntil.After(time.Now()) {
		return journal.Record{Done: true, Attempt: r.Attempt}, nil
	}
	return rec, err
}
