package counterexamples

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
)

// More liars: each breaks its contract in a class of mistake of its own,
// and the suite's own tests prove each is rejected (counterexamples_test.go, journals_test.go and the source
// cases in package conformance's tests).

// PanicOnReplay dedups correctly but keeps each applied key's ref in the
// instance's memory, and its replay path dereferences that entry: on an
// instance that did not apply the key (a successor process), the replay
// panics. A panic in an adapter's goroutine ends a test binary, and a
// worker; the suite must report it as a failure, not die of it.
type PanicOnReplay struct {
	DB   *pgxpool.Pool
	mu   sync.Mutex
	refs map[effects.Key]*effects.Result
}

// Contract claims EffectivelyOnce.
func (e *PanicOnReplay) Contract() effects.Contract {
	return claim("counterexample: replay path reads a ref only the applying instance holds")
}

// Apply dedups, and replays from memory.
func (e *PanicOnReplay) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	res, err := dedupInsert(ctx, e.DB, key, in, true)
	if err != nil {
		return res, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if res.Status == effects.Replayed {
		return *e.refs[key], nil // nil on another instance: the panic
	}
	if e.refs == nil {
		e.refs = map[effects.Key]*effects.Result{}
	}
	e.refs[key] = &res
	return res, nil
}

// GroupCommit dedups in the write's transaction but commits it on a
// timer, 100 ms after Apply returned Applied ("commits are batched"): the
// caller acks a delivery whose effect is not yet durable, and a crash in
// those 100 ms loses it.
type GroupCommit struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce.
func (e GroupCommit) Contract() effects.Contract {
	return claim("counterexample: reports Applied before its transaction commits")
}

// Apply writes in a transaction committed later.
func (e GroupCommit) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	tx, err := e.DB.Begin(ctx)
	if err != nil {
		return effects.Result{}, classify(key, err)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO cx_seen (key, cents) VALUES ($1, $2) ON CONFLICT DO NOTHING`, string(key), in.Cents)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return effects.Result{}, classify(key, err)
	}
	if tag.RowsAffected() == 0 {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return effects.Result{Status: effects.Replayed}, nil
	}
	if _, err := tx.Exec(ctx, `INSERT INTO cx_ledger (event_id, cents) VALUES ($1, $2)`, in.EventID, in.Cents); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return effects.Result{}, classify(key, err)
	}
	time.AfterFunc(100*time.Millisecond, func() { _ = tx.Commit(context.Background()) })
	return effects.Result{Status: effects.Applied}, nil
}

// InvertedConflict dedups correctly but reads ON CONFLICT DO NOTHING's
// row count the wrong way round: a first Apply says Replayed, a
// redelivery says Applied. Anything that trusts Replayed (skip the
// receipt mail, count a duplicate) does the wrong thing on both.
type InvertedConflict struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce.
func (e InvertedConflict) Contract() effects.Contract {
	return claim("counterexample: Applied and Replayed swapped")
}

// Apply dedups and swaps the status.
func (e InvertedConflict) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	res, err := dedupInsert(ctx, e.DB, key, in, true)
	if err == nil {
		res.Status = map[effects.Status]effects.Status{effects.Applied: effects.Replayed, effects.Replayed: effects.Applied}[res.Status]
	}
	return res, err
}

// LastRef dedups correctly, refs its effects by a counter, and answers a
// replay with the last ref this instance handed out (a "last result"
// field reused across keys) instead of the key's own.
type LastRef struct {
	DB   *pgxpool.Pool
	mu   sync.Mutex
	n    int
	last string
}

// Contract claims EffectivelyOnce, whose replays return the first ref.
func (e *LastRef) Contract() effects.Contract {
	return claim("counterexample: a replay returns the instance's last ref")
}

// Apply dedups; a replay returns the last ref.
func (e *LastRef) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	res, err := dedupInsert(ctx, e.DB, key, in, true)
	if err != nil {
		return res, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if res.Status == effects.Applied {
		e.n++
		e.last = "ref-" + strconv.Itoa(e.n)
	}
	res.Ref = e.last
	return res, nil
}

// CancelIsPermanent dedups correctly but calls a cancelled or expired
// context a permanent failure ("the caller gave up"): a consumer then
// dead-letters a delivery whose effect may have been applied, and never
// retries it with the same key.
type CancelIsPermanent struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce.
func (e CancelIsPermanent) Contract() effects.Contract {
	return claim("counterexample: a cancelled context is permanent")
}

// Apply dedups and classifies cancellation as permanent.
func (e CancelIsPermanent) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	res, err := dedupInsert(ctx, e.DB, key, in, true)
	if err != nil && ctx.Err() != nil {
		return res, &effects.Error{Kind: effects.ErrRefused, Key: key, Err: errors.Join(ctx.Err(), err)}
	}
	return res, err
}

// LookupLeasedDone is a journal whose Lookup reports a key done while an
// attempt only holds its lease: a second instance then skips an effect
// the first has not done (and may never do, if it crashes).
type LookupLeasedDone struct{ *memjournal.Journal }

// Lookup reports a leased key done.
func (j LookupLeasedDone) Lookup(ctx context.Context, key effects.Key, fp []byte) (journal.Record, error) {
	rec, err := j.Journal.Lookup(ctx, key, fp)
	if err == nil && !rec.Done && j.Get(key).Attempt > 0 {
		rec.Done = true
	}
	return rec, err
}

// AttemptPerLease numbers attempts per lease instead of per key: a
// takeover after an expired lease is attempt 1 again. The fencing token
// then cannot tell the old holder from the new one, and nothing
// tells the new holder that an earlier attempt may have done the effect.
type AttemptPerLease struct{ *memjournal.Journal }

// Begin reports every attempt as the first.
func (j AttemptPerLease) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (journal.Record, error) {
	rec, err := j.Journal.Begin(ctx, key, fp, lease)
	if err == nil && !rec.Done {
		rec.Attempt = 1
	}
	return rec, err
}

// Release releases the lease whatever attempt asks, as attempt 1 is all
// this journal hands out.
func (j AttemptPerLease) Release(ctx context.Context, key effects.Key, _ int) error {
	return j.Journal.Release(ctx, key, j.Get(key).Attempt)
}

// AckOnNextAck wraps any [effects.Source] so that an Ack is applied only
// when the next Ack of the same ordering comes (the commit of the last
// acked offset deferred to the next poll), and Close does not flush it:
// the last acked delivery of every ordering comes back after a close, and
// is applied again by anything that does not dedup. Its contract is
// at-least-once, but an acked delivery must stay acked.
type AckOnNextAck struct {
	effects.Source
	mu      sync.Mutex
	pending map[string]effects.Delivery
}

// NewAckOnNextAck wraps s.
func NewAckOnNextAck(s effects.Source) *AckOnNextAck {
	return &AckOnNextAck{Source: s, pending: map[string]effects.Delivery{}}
}

// Ack acks the delivery d's ordering had pending, and holds d.
func (s *AckOnNextAck) Ack(ctx context.Context, d effects.Delivery) error {
	s.mu.Lock()
	prev, ok := s.pending[d.Ordering]
	s.pending[d.Ordering] = d
	s.mu.Unlock()
	if !ok {
		return nil
	}
	return s.Source.Ack(ctx, prev)
}

// AttemptFromZero stands for a broker that counts receives of each
// message across every consumer (SQS's ApproximateReceiveCount), and an
// adapter that passes the count on minus one, taking it for a count of
// redeliveries: a first delivery says Attempt 0 ("unknown"), the second
// says 1. A consumer's WithMaxAttempts then allows one attempt more than
// configured. One AttemptFromZero is shared by every instance, as the
// broker is.
type AttemptFromZero struct {
	mu       sync.Mutex
	receives map[string]int
}

// NewAttemptFromZero returns the broker's count, empty.
func NewAttemptFromZero() *AttemptFromZero {
	return &AttemptFromZero{receives: map[string]int{}}
}

// Wrap returns s with every delivery's Attempt set to the receives of its
// message before this one.
func (z *AttemptFromZero) Wrap(s effects.Source) effects.Source { return receivesFromZero{s, z} }

type receivesFromZero struct {
	effects.Source
	z *AttemptFromZero
}

func (s receivesFromZero) Next(ctx context.Context) (effects.Delivery, error) {
	d, err := s.Source.Next(ctx)
	if err != nil {
		return d, err
	}
	s.z.mu.Lock()
	d.Attempt = s.z.receives[d.ID]
	s.z.receives[d.ID]++
	s.z.mu.Unlock()
	return d, nil
}
