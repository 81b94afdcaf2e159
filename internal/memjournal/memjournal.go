// Package memjournal is an in-memory effects.Journal for tests and
// examples. It forgets everything when the process exits, so it protects
// nothing across restarts: programs use postgres.NewJournal.
package memjournal

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"effectively.dev/effects"
)

// Journal implements effects.BatchJournal with the same semantics as
// postgres.Journal: leases, takeover after expiry with Attempt + 1,
// ErrKeyReused on another fingerprint, Release fenced by the attempt,
// Lookup and MarkDone for the path without a lease, CompleteAll.
type Journal struct {
	now func() time.Time

	mu       sync.Mutex
	recs     map[effects.Key]*Record
	releases int
}

// Record is the journal's state for one key.
type Record struct {
	Fingerprint []byte
	Done        bool
	Ref         string
	Attempt     int
	LeaseUntil  time.Time
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

// Begin implements effects.Journal.
func (j *Journal) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (effects.Record, error) {
	if err := usable(ctx, key); err != nil {
		return effects.Record{}, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	r := j.recordLocked(key, fp)
	switch {
	case !bytes.Equal(r.Fingerprint, fp):
		return effects.Record{}, &effects.Error{Kind: effects.ErrKeyReused, Op: "memjournal.Begin", Key: key}
	case r.Done:
		return effects.Record{Done: true, Ref: r.Ref, Attempt: r.Attempt}, nil
	case j.now().Before(r.LeaseUntil):
		return effects.Record{}, &effects.Error{Kind: effects.ErrInFlight, Op: "memjournal.Begin", Key: key}
	}
	r.Attempt++
	r.LeaseUntil = j.now().Add(lease)
	return effects.Record{Attempt: r.Attempt}, nil
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

// Complete implements effects.Journal. Like postgres.Journal, it refuses
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

// Lookup implements effects.DoneJournal.
func (j *Journal) Lookup(ctx context.Context, key effects.Key, fp []byte) (effects.Record, error) {
	if err := usable(ctx, key); err != nil {
		return effects.Record{}, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	switch r := j.recs[key]; {
	case r == nil:
		return effects.Record{}, nil
	case !bytes.Equal(r.Fingerprint, fp):
		return effects.Record{}, &effects.Error{Kind: effects.ErrKeyReused, Op: "memjournal.Lookup", Key: key}
	case r.Done:
		return effects.Record{Done: true, Ref: r.Ref, Attempt: r.Attempt}, nil
	}
	return effects.Record{}, nil
}

// MarkDone implements effects.DoneJournal.
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

// CompleteAll implements effects.BatchJournal: each completion as
// Complete or MarkDone alone would write it (there is no transaction to
// fail in memory).
func (j *Journal) CompleteAll(ctx context.Context, cs []effects.Completion) []error {
	errs := make([]error, len(cs))
	for i, c := range cs {
		if c.MarkDone {
			errs[i] = j.MarkDone(ctx, c.Key, c.Fingerprint, c.Ref)
		} else {
			errs[i] = j.Complete(ctx, c.Key, c.Ref)
		}
	}
	return errs
}

// Release implements effects.Journal.
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
