// Package memjournal is an in-memory [journal.DoneJournal] for tests,
// examples and adapter authors, as gocloud's memblob is for blob: the same
// semantics as postgres.Journal (leases, takeover after expiry, fencing,
// key-reuse detection), with a clock the test can move.
//
// It forgets everything when the process exits, so it protects nothing
// across restarts: programs use postgres.NewJournal. The conformance
// suite's RunJournal passes on it, except for the scenarios that need a
// durable backend.
//
//	j := memjournal.New(nil) // time.Now
//	pj, err := journal.NewJournaled("email.Send", j)
package memjournal

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
)

// Journal implements [journal.DoneJournal] with the same semantics as
// postgres.Journal: leases, takeover after expiry with Attempt + 1,
// ErrKeyReused on another fingerprint, ErrInFlight with the rest of the
// lease as its RetryAfter, Release fenced by the attempt, Lookup and
// MarkDone for the path without a lease. It is safe for concurrent use.
type Journal struct {
	now func() time.Time

	mu       sync.Mutex
	recs     map[effects.Key]*Record
	releases int
}

// Record is the journal's state for one key, as [Journal.Get] returns it.
type Record struct {
	// Fingerprint is the payload's fingerprint from the first Begin or
	// MarkDone.
	Fingerprint []byte
	// Done reports whether the key was completed; Ref is its reference.
	Done bool
	Ref  string
	// Attempt counts the attempts begun.
	Attempt int
	// LeaseUntil is when the current lease ends (zero when none).
	LeaseUntil time.Time
}

// New returns an empty journal reading time from now (time.Now if nil).
func New(now func() time.Time) *Journal {
	if now == nil {
		now = time.Now
	}
	return &Journal{now: now, recs: map[effects.Key]*Record{}}
}

// usable refuses an invalid key, then an ended context, before any work.
func usable(ctx context.Context, key effects.Key) error {
	if err := key.Validate(); err != nil {
		return err
	}
	return ctx.Err()
}

// Begin implements [journal.Journal].
func (j *Journal) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (journal.Record, error) {
	if err := usable(ctx, key); err != nil {
		return journal.Record{}, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	r := j.recordLocked(key, fp)
	switch {
	case !bytes.Equal(r.Fingerprint, fp):
		return journal.Record{}, &effects.Error{Kind: effects.ErrKeyReused, Op: "memjournal.Begin", Key: key}
	case r.Done:
		return journal.Record{Done: true, Ref: r.Ref, Attempt: r.Attempt}, nil
	case j.now().Before(r.LeaseUntil):
		return journal.Record{}, &effects.Error{Kind: effects.ErrInFlight, Op: "memjournal.Begin", Key: key,
			RetryAfter: r.LeaseUntil.Sub(j.now())}
	}
	r.Attempt++
	r.LeaseUntil = j.now().Add(lease)
	return journal.Record{Attempt: r.Attempt}, nil
}

// recordLocked returns key's record, creating it with fp if there is none.
// j.mu must be held.
func (j *Journal) recordLocked(key effects.Key, fp []byte) *Record {
	r := j.recs[key]
	if r == nil {
		r = &Record{Fingerprint: fp}
		j.recs[key] = r
	}
	return r
}

// Complete implements [journal.Journal]. Like postgres.Journal, it refuses
// a key that was never begun.
func (j *Journal) Complete(_ context.Context, key effects.Key, ref string) error {
	if err := key.Validate(); err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	r := j.recs[key]
	if r == nil {
		return fmt.Errorf("memjournal.Complete key %q: not begun", key)
	}
	if !r.Done {
		r.Done, r.Ref, r.LeaseUntil = true, ref, time.Time{}
	}
	return nil
}

// Lookup implements [journal.DoneJournal].
func (j *Journal) Lookup(ctx context.Context, key effects.Key, fp []byte) (journal.Record, error) {
	if err := usable(ctx, key); err != nil {
		return journal.Record{}, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	switch r := j.recs[key]; {
	case r == nil:
		return journal.Record{}, nil
	case !bytes.Equal(r.Fingerprint, fp):
		return journal.Record{}, &effects.Error{Kind: effects.ErrKeyReused, Op: "memjournal.Lookup", Key: key}
	case r.Done:
		return journal.Record{Done: true, Ref: r.Ref, Attempt: r.Attempt}, nil
	}
	return journal.Record{}, nil
}

// MarkDone implements [journal.DoneJournal].
func (j *Journal) MarkDone(ctx context.Context, key effects.Key, fp []byte, ref string) error {
	if err := usable(ctx, key); err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	r := j.recordLocked(key, fp)
	switch {
	case !bytes.Equal(r.Fingerprint, fp):
		return &effects.Error{Kind: effects.ErrKeyReused, Op: "memjournal.MarkDone", Key: key}
	case !r.Done:
		r.Done, r.Ref, r.LeaseUntil = true, ref, time.Time{}
	}
	return nil
}

// Release implements [journal.Journal].
func (j *Journal) Release(_ context.Context, key effects.Key, attempt int) error {
	if err := key.Validate(); err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.releases++
	if r := j.recs[key]; r != nil && !r.Done && r.Attempt == attempt {
		r.LeaseUntil = time.Time{}
	}
	return nil
}

// Releases returns how many times Release was called.
func (j *Journal) Releases() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.releases
}

// Get returns a copy of key's record (zero if none).
func (j *Journal) Get(key effects.Key) Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	if r := j.recs[key]; r != nil {
		return *r
	}
	return Record{}
}
