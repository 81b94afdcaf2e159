package counterexamples

import (
	"context"
	"sync"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
)

// Journals of round 3, whose every call is a round trip through the
// suite's Faults ([TripJournal]):
//
//   - [SwallowedComplete]: Complete reports success when its round trip
//     failed ("the next attempt completes it"): a cut Complete leaves the
//     key not done while the caller took it for done.
//   - [CachedAttempt]: an instance that re-takes a key it held itself
//     (its lease expired, or it released it) reports the attempt number it
//     had, taking the re-take for a renewal: a fenced Release of that
//     number then frees nothing.
//   - [AsyncComplete]: over an [AsyncBackend], Complete is an asynchronous
//     write that only a later synchronous one (a Begin) makes durable, as
//     PostgreSQL's synchronous_commit = off does: a crash right after the
//     last Complete loses it.

// TripJournal is an honest journal over a shared inner journal, each call
// one round trip of Trip (the suite's Faults.RoundTrip); a failed round
// trip is the call's error.
type TripJournal struct {
	Inner journal.DoneJournal
	Trip  func(ctx context.Context, fn func() error) error
}

func (j TripJournal) trip(ctx context.Context, fn func() error) error {
	if j.Trip == nil {
		return fn()
	}
	return j.Trip(ctx, fn)
}

// Begin claims key in one round trip.
func (j TripJournal) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (rec journal.Record, err error) {
	if err := key.Validate(); err != nil {
		return journal.Record{}, err
	}
	if terr := j.trip(ctx, func() error { rec, err = j.Inner.Begin(ctx, key, fp, lease); return nil }); terr != nil {
		return journal.Record{}, effects.Ambiguous("counterexamples.TripJournal", key, terr)
	}
	return rec, err
}

// Complete marks key done in one round trip.
func (j TripJournal) Complete(ctx context.Context, key effects.Key, ref string) (err error) {
	if err := key.Validate(); err != nil {
		return err
	}
	if terr := j.trip(ctx, func() error { err = j.Inner.Complete(ctx, key, ref); return nil }); terr != nil {
		return effects.Ambiguous("counterexamples.TripJournal", key, terr)
	}
	return err
}

// Release gives up attempt's lease in one round trip.
func (j TripJournal) Release(ctx context.Context, key effects.Key, attempt int) (err error) {
	if err := key.Validate(); err != nil {
		return err
	}
	if terr := j.trip(ctx, func() error { err = j.Inner.Release(ctx, key, attempt); return nil }); terr != nil {
		return effects.Ambiguous("counterexamples.TripJournal", key, terr)
	}
	return err
}

// Lookup reads key in one round trip.
func (j TripJournal) Lookup(ctx context.Context, key effects.Key, fp []byte) (rec journal.Record, err error) {
	if err := key.Validate(); err != nil {
		return journal.Record{}, err
	}
	if terr := j.trip(ctx, func() error { rec, err = j.Inner.Lookup(ctx, key, fp); return nil }); terr != nil {
		return journal.Record{}, effects.Ambiguous("counterexamples.TripJournal", key, terr)
	}
	return rec, err
}

// MarkDone marks key done without Begin in one round trip.
func (j TripJournal) MarkDone(ctx context.Context, key effects.Key, fp []byte, ref string) (err error) {
	if err := key.Validate(); err != nil {
		return err
	}
	if terr := j.trip(ctx, func() error { err = j.Inner.MarkDone(ctx, key, fp, ref); return nil }); terr != nil {
		return effects.Ambiguous("counterexamples.TripJournal", key, terr)
	}
	return err
}

// SwallowedComplete is a TripJournal whose Complete reports success when
// its round trip failed.
type SwallowedComplete struct{ TripJournal }

// Complete swallows the failure of its round trip.
func (j SwallowedComplete) Complete(ctx context.Context, key effects.Key, ref string) error {
	err := j.TripJournal.Complete(ctx, key, ref)
	if effects.ClassOf(err) == effects.Retryable {
		return nil // best effort: the next attempt completes it
	}
	return err
}

// CachedAttempt is a TripJournal instance that remembers the attempt
// number of every key it began, and reports it again when it takes the
// key again with no other attempt in between.
type CachedAttempt struct {
	TripJournal
	mu       sync.Mutex
	attempts map[effects.Key]int
}

// NewCachedAttempt returns the instance over j.
func NewCachedAttempt(j TripJournal) *CachedAttempt {
	return &CachedAttempt{TripJournal: j, attempts: map[effects.Key]int{}}
}

// Begin reports the attempt this instance had for key, if it had one.
func (j *CachedAttempt) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (journal.Record, error) {
	rec, err := j.TripJournal.Begin(ctx, key, fp, lease)
	if err != nil || rec.Done {
		return rec, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if n, ok := j.attempts[key]; ok && rec.Attempt == n+1 {
		// No one else took the key since our attempt: "our own lease, a
		// renewal".
		rec.Attempt = n
		return rec, nil
	}
	j.attempts[key] = rec.Attempt
	return rec, nil
}

// AsyncBackend is a journal backend whose synchronous writes (Begin,
// Release, MarkDone) are durable at once and make every earlier write
// durable, and whose asynchronous writes (Complete of [AsyncComplete])
// are visible at once but durable only after the next synchronous one.
// CrashRestart loses what is not durable.
type AsyncBackend struct {
	mu      sync.Mutex
	durable *memjournal.Journal
	pending []pendingComplete
	begun   map[effects.Key]bool
}

type pendingComplete struct {
	key effects.Key
	ref string
}

// NewAsyncBackend returns an empty backend.
func NewAsyncBackend() *AsyncBackend {
	return &AsyncBackend{durable: memjournal.New(nil), begun: map[effects.Key]bool{}}
}

// CrashRestart stops the backend at once and starts it again: writes not
// yet durable are lost.
func (b *AsyncBackend) CrashRestart(context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending = nil
	return nil
}

// flushLocked makes every pending write durable.
func (b *AsyncBackend) flushLocked(ctx context.Context) {
	for _, p := range b.pending {
		_ = b.durable.Complete(ctx, p.key, p.ref)
	}
	b.pending = nil
}

// syncJournal is the backend as a DoneJournal whose every write is
// synchronous; Complete of an AsyncComplete goes through complete instead.
type syncJournal struct{ b *AsyncBackend }

func (s syncJournal) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (journal.Record, error) {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.b.flushLocked(ctx)
	rec, err := s.b.durable.Begin(ctx, key, fp, lease)
	if err == nil {
		s.b.begun[key] = true
	}
	return rec, err
}

func (s syncJournal) Complete(ctx context.Context, key effects.Key, ref string) error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.b.flushLocked(ctx)
	return s.b.durable.Complete(ctx, key, ref)
}

func (s syncJournal) Release(ctx context.Context, key effects.Key, attempt int) error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.b.flushLocked(ctx)
	return s.b.durable.Release(ctx, key, attempt)
}

func (s syncJournal) Lookup(ctx context.Context, key effects.Key, fp []byte) (journal.Record, error) {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	rec, err := s.b.durable.Lookup(ctx, key, fp)
	if err == nil && !rec.Done {
		for _, p := range s.b.pending {
			if p.key == key {
				return journal.Record{Done: true, Ref: p.ref, Attempt: rec.Attempt}, nil
			}
		}
	}
	return rec, err
}

func (s syncJournal) MarkDone(ctx context.Context, key effects.Key, fp []byte, ref string) error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.b.flushLocked(ctx)
	err := s.b.durable.MarkDone(ctx, key, fp, ref)
	if err == nil {
		s.b.begun[key] = true
	}
	return err
}

// Sync returns the backend as a journal whose every write is durable when
// it returns: the honest control.
func (b *AsyncBackend) Sync(trip func(ctx context.Context, fn func() error) error) TripJournal {
	return TripJournal{Inner: syncJournal{b}, Trip: trip}
}

// AsyncComplete is a journal over an AsyncBackend whose Complete is an
// asynchronous write.
type AsyncComplete struct {
	TripJournal
	B *AsyncBackend
}

// NewAsyncComplete returns the journal over b.
func NewAsyncComplete(b *AsyncBackend, trip func(ctx context.Context, fn func() error) error) AsyncComplete {
	return AsyncComplete{TripJournal: b.Sync(trip), B: b}
}

// Complete writes asynchronously: visible at once, durable at the next
// synchronous write.
func (j AsyncComplete) Complete(ctx context.Context, key effects.Key, ref string) (err error) {
	if err := key.Validate(); err != nil {
		return err
	}
	if terr := j.trip(ctx, func() error {
		j.B.mu.Lock()
		defer j.B.mu.Unlock()
		if !j.B.begun[key] {
			err = j.B.durable.Complete(ctx, key, ref) // refused: never begun
			return nil
		}
		j.B.pending = append(j.B.pending, pendingComplete{key, ref})
		return nil
	}); terr != nil {
		return effects.Ambiguous("counterexamples.AsyncComplete", key, terr)
	}
	return err
}
