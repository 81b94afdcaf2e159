package journal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
	"effectively.dev/internal/ratelog"
)

// Defaults of a [Journaled], used when the matching option is not given.
const (
	// defaultLease is how long one attempt of a journaled effect holds its
	// key ([WithLease]), unless the options given with the adapter's
	// journal say otherwise.
	defaultLease = time.Minute
	// defaultRecordTimeout bounds the journal writes that follow the
	// effect, Complete (retried) and Release, which run on a context
	// detached from the caller's ([WithRecordTimeout]).
	defaultRecordTimeout = 10 * time.Second
)

// completeBackoff paces Complete's retries. Its ceiling is short: a
// handler retrying its record holds its delivery (and the partition's
// later ones) until the record commits, so after an outage (a database
// failover) it should commit within a tenth of a second of the journal
// coming back. Each try is one statement, or one failed connection
// attempt while the journal is down.
var completeBackoff = retry.Backoff{Min: 10 * time.Millisecond, Max: 100 * time.Millisecond}

// Journaled is the journaled-effect protocol, written once for every
// adapter whose owner cannot hold the key for as long as messages can come
// back (email, a Kafka producer across sessions, Stripe past its 24 h):
//
//	Begin → replay a done record, or take the lease
//	      → do the effect (the adapter's call, given to [Journaled.Apply])
//	      → Complete on a detached context
//	      → or Release after a failure that certainly applied nothing.
//
// An adapter supplies only its call and the classification of its errors
// ([WithNotApplied]); the policy below is the same for all of them, as
// database/sql owns the retry policy over driver.ErrBadConn.
//
// # Policy
//
//   - A journal error from Begin other than [effects.ErrInFlight] and
//     [effects.ErrKeyReused] (a lost reply, a refused connection, a cancelled
//     context, an error the journal did not classify) is [effects.ErrTransient]:
//     the effect was not attempted, so the same key may be retried, and
//     [effects.ClassOf] says [effects.Retryable]. The journal's own error
//     stays reachable with errors.As, but not its kind: an ambiguous Begin
//     is not an ambiguous effect.
//   - A done record is replayed ([effects.Replayed], the stored Ref) without
//     calling the owner. A key begun with another fingerprint is
//     [effects.ErrKeyReused]. A key whose lease another attempt holds is
//     [effects.ErrInFlight], unless the owner dedups on the key itself
//     ([WithOwnerIdempotency], Stripe's Idempotency-effects.Key): then the call
//     goes ahead without the lease, the owner answers in-flight or
//     replays, and a success is recorded.
//   - When the owner dedups on the key and the journal is a
//     [DoneJournal], no lease is taken at all: Lookup (a read) replays a
//     done record or refuses a reused key, the call goes ahead, and a
//     success is recorded with MarkDone. One journal write per effect
//     instead of two, and the same duplicate window: a success whose
//     record did not commit is redone only by a redelivery past the
//     owner's own horizon, as after a lease that expired.
//   - The call runs under a deadline at nine tenths of the lease, so an
//     attempt that takes the key over after the lease expired never
//     overlaps this one. A caller's context that ended between Begin and
//     the call releases the lease and is [effects.ErrTransient].
//   - After a success, Complete runs on a context detached from the
//     caller's, bounded by the record timeout ([WithRecordTimeout]), and
//     is retried with backoff while its error is in class
//     [effects.Retryable]. If the record still does not commit, Apply
//     returns the owner's success anyway and logs the failure: the owner
//     confirmed the effect, so the truth is effects.Applied.
//     An error would make the caller retry into effects.ErrInFlight and, once the
//     lease expired, do the effect again; success lets it ack, and only a
//     redelivery after the lease can duplicate (the window the adapters
//     declare: after the owner's confirmation, before the record commits).
//   - After a failure the adapter classifies as certainly not applied
//     ([WithNotApplied]; by default [effects.ErrTransient], [effects.ErrKeyReused],
//     [effects.ErrInFlight], [effects.ErrInvalidKey] and [effects.ErrInvalidConfig]), the lease is
//     released once, on a detached context, so the retry need not wait for
//     it; a failed Release is logged and the lease expires on its own.
//     Any other failure leaves the record pending: the lease decides
//     (effects.ErrInFlight within it, a new attempt after it).
//   - One lease for every adapter, one minute, unless the options given
//     with the adapter's journal say otherwise ([WithLease]).
//
// With a nil Journal, Apply only validates the key and runs the call: for
// adapters whose journal is optional.
//
// A Journaled is safe for concurrent use.
type Journaled struct {
	op          string
	journal     Journal
	lease       time.Duration
	record      time.Duration
	notApplied  func(error) bool
	ownerKeyed  bool
	rep         ratelog.Reporter
	callTimeout time.Duration
}

// Option configures a [Journaled]; see [NewJournaled].
type Option interface{ apply(*config) }

type option func(*config)

func (f option) apply(c *config) { f(c) }

type config struct {
	lease      time.Duration
	record     time.Duration
	notApplied func(error) bool
	ownerKeyed bool
	logger     *slog.Logger
	loggerSet  bool
	observer   effects.Observer
}

// WithLease sets how long one attempt holds its key (default one
// minute). Within the lease, other attempts get [effects.ErrInFlight];
// after it, an attempt whose outcome stayed unknown is done again. Keep it
// well above the time the effect takes. d must be positive.
func WithLease(d time.Duration) Option {
	return option(func(c *config) { c.lease = d })
}

// WithRecordTimeout bounds the journal writes after the effect, Complete
// with its retries and Release (default 10 s). They run
// even when the caller's context has ended: the owner already has the
// effect (or certainly has not), and recording that is what keeps the next
// attempt honest. d must be positive.
func WithRecordTimeout(d time.Duration) Option {
	return option(func(c *config) { c.record = d })
}

// WithNotApplied sets the adapter's classification of a failed call:
// notApplied(err) reports whether the owner certainly did not apply the
// effect (it refused the request, or the request never reached it), so the
// lease is released. It is consulted in addition to the default, which
// holds for every adapter: [effects.ErrTransient], [effects.ErrKeyReused], [effects.ErrInFlight],
// [effects.ErrInvalidKey] and [effects.ErrInvalidConfig]. Return false when unsure: a
// release after an applied effect lets the next attempt do it again.
func WithNotApplied(notApplied func(err error) bool) Option {
	return option(func(c *config) { c.notApplied = notApplied })
}

// WithOwnerIdempotency declares that the owner dedups on the key itself
// within its own horizon (Stripe's Idempotency-effects.Key): an attempt that finds
// the lease held by another calls the owner anyway instead of returning
// [effects.ErrInFlight], since the owner answers in-flight or replays, and records
// what it replays. A lost reply then costs one retry, not a lease expiry.
func WithOwnerIdempotency() Option {
	return option(func(c *config) { c.ownerKeyed = true })
}

// WithObserver reports to o what Apply handles without returning it, as
// events with Component "journal", the key and the error:
// [effects.EventFailed] for a success whose journal record did not commit
// (Apply still returns the success; a redelivery after the lease will do
// the effect again) and for a lease it could not release after a failure
// (the next attempt waits for the lease to expire), and
// [effects.EventInFlight] when another attempt holds the key's lease
// (Apply returns [effects.ErrInFlight]). Without an observer (or with a
// nil o) the failures are logged to the logger ([WithLogger]),
// rate-limited, and lease waits are only returned.
func WithObserver(o effects.Observer) Option {
	return option(func(c *config) { c.observer = o })
}

// WithLogger sets the logger Apply writes to when it has no observer
// ([WithObserver]): a success the journal did not record (Error), a lease
// it could not release (Warn), a key done again after an earlier attempt
// recorded nothing (Debug). The default is slog.Default() at the time of
// each line. Lines are rate-limited (a burst of 10, then about one a
// second, with a count of those held back). l must not be nil.
func WithLogger(l *slog.Logger) Option {
	return option(func(c *config) { c.logger, c.loggerSet = l, true })
}

// NewJournaled returns the protocol for the effect named op (e.g.
// "email.Send", used in errors and logs) over j, which may be nil for an
// adapter whose journal is optional. It returns a *[effects.ConfigError] for an
// empty op or an option with an invalid value.
func NewJournaled(op string, j Journal, opts ...Option) (*Journaled, error) {
	cfg := config{lease: defaultLease, record: defaultRecordTimeout}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	switch {
	case op == "":
		return nil, effects.ConfigErrorf("journal.NewJournaled", "op", "empty; name the effect, e.g. \"email.Send\"")
	case cfg.lease <= 0:
		return nil, effects.ConfigErrorf("journal.NewJournaled", "WithLease", "lease %v is not positive", cfg.lease)
	case cfg.record <= 0:
		return nil, effects.ConfigErrorf("journal.NewJournaled", "WithRecordTimeout", "timeout %v is not positive", cfg.record)
	case cfg.loggerSet && cfg.logger == nil:
		return nil, effects.ConfigErrorf("journal.NewJournaled", "WithLogger", "nil logger")
	}
	return &Journaled{
		op:          op,
		journal:     j,
		lease:       cfg.lease,
		record:      cfg.record,
		notApplied:  cfg.notApplied,
		ownerKeyed:  cfg.ownerKeyed,
		rep:         ratelog.Reporter{Observer: cfg.observer, Limiter: ratelog.Limiter{Logger: cfg.logger}},
		callTimeout: cfg.lease - cfg.lease/10,
	}, nil
}

// Journal returns the journal, nil if there is none.
func (j *Journaled) Journal() Journal { return j.journal }

// Lease returns the lease an attempt takes.
func (j *Journaled) Lease() time.Duration { return j.lease }

// Attempt is one attempt of [Journaled.Apply], as its call sees it.
type Attempt struct {
	j      *Journaled
	ctx    context.Context
	key    effects.Key
	number int
	leased bool
	// unleased is the journal that records a success with MarkDone, on
	// the path without a lease; nil on the others.
	unleased    DoneJournal
	fingerprint []byte
}

// Number is the journal's attempt number ([Record].Attempt): 1 for the
// first attempt at a key, more after a release or an expired lease. It is
// 0 when the attempt holds no lease (no journal, or [WithOwnerIdempotency]
// found the lease held).
func (a *Attempt) Number() int { return a.number }

// Leased reports whether this attempt holds the key's lease.
func (a *Attempt) Leased() bool { return a.leased }

// Late records a success that the owner confirmed after the call had
// returned (it stopped waiting and returned [effects.ErrAmbiguous]; a Kafka record
// still in flight was acked later): the record is completed with ref, with
// the same detached context, retries and logging as an ordinary success,
// so the retry replays it instead of doing the effect again. It blocks for
// at most the record timeout and does nothing without a journal.
func (a *Attempt) Late(ref string) {
	if a.j.journal != nil {
		a.j.complete(a, ref)
	}
}

// Apply runs the protocol for key: fingerprint identifies the payload
// (see [Journal].Begin; unused without a journal) and call does the
// effect once, for one attempt. It validates key before any I/O. See
// [Journaled] for what each outcome returns.
//
// call's ctx is the caller's, bounded by the attempt's deadline when it
// holds a lease. On success call returns the owner's reference in an
// [effects.Result] with Status [effects.Applied], or [effects.Replayed]
// when the owner itself reports a replay (Stripe's Idempotent-Replayed).
// On failure it returns an error already classified with this package's
// kinds ([effects.ErrAmbiguous] when the owner may have the effect,
// [effects.ErrTransient] when it certainly has not, ...), which Apply
// returns as it is.
func (j *Journaled) Apply(ctx context.Context, key effects.Key, fingerprint []byte, call func(ctx context.Context, a *Attempt) (effects.Result, error)) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	a := &Attempt{j: j, ctx: ctx, key: key}
	if j.journal == nil {
		if err := ctx.Err(); err != nil {
			return effects.Result{}, effects.Transient(j.op, key, fmt.Errorf("not attempted: %w", err))
		}
		return call(ctx, a)
	}
	if dj, ok := j.journal.(DoneJournal); ok && j.ownerKeyed {
		return j.applyUnleased(ctx, dj, a, fingerprint, call)
	}
	rec, err := j.journal.Begin(ctx, key, fingerprint, j.lease)
	switch {
	case err == nil && rec.Done:
		return effects.Result{Status: effects.Replayed, Ref: rec.Ref}, nil
	case err == nil:
		a.number, a.leased = rec.Attempt, true
	case errors.Is(err, effects.ErrKeyReused):
		return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Op: j.op, Key: key, Err: err}
	case errors.Is(err, effects.ErrInFlight) && j.ownerKeyed:
		// The owner's key guards the call: go ahead without the lease.
	case errors.Is(err, effects.ErrInFlight):
		e := &effects.Error{Kind: effects.ErrInFlight, Op: j.op, Key: key, Err: err}
		if _, ok := effects.RetryAfter(err); !ok {
			e.RetryAfter = j.lease // the other attempt's lease ends within one lease
		}
		if o := j.rep.Observer; o != nil {
			o.Observe(ctx, effects.Event{Kind: effects.EventInFlight, Component: component, Key: key, Err: e})
		}
		return effects.Result{}, e
	default:
		return effects.Result{}, effects.Transient(j.op, key, &journalError{err: err})
	}
	if a.number > 1 {
		j.rep.Limiter.Log(ctx, slog.LevelDebug, j.op+": doing a key again whose earlier attempt recorded no success "+
			"(released after a failure, or its lease expired after an unknown outcome: then this may be the declared duplicate)",
			slog.String("key", string(key)), slog.Int("attempt", a.number))
	}

	if err := ctx.Err(); err != nil {
		if a.leased {
			j.release(a)
		}
		return effects.Result{}, effects.Transient(j.op, key, fmt.Errorf("not attempted: %w", err))
	}
	cctx, cancel := context.WithTimeout(ctx, j.callTimeout)
	defer cancel()
	res, err := call(cctx, a)
	if err != nil {
		if a.leased && j.certainlyNotApplied(err) {
			j.release(a)
		}
		return effects.Result{}, err
	}
	j.complete(a, res.Ref)
	return res, nil
}

// applyUnleased runs the protocol without a lease, for an owner that
// dedups on the key and a journal that can look a key up and mark it done
// (see [DoneJournal]): Lookup, the call, MarkDone.
func (j *Journaled) applyUnleased(ctx context.Context, dj DoneJournal, a *Attempt, fingerprint []byte, call func(context.Context, *Attempt) (effects.Result, error)) (effects.Result, error) {
	key := a.key
	a.unleased, a.fingerprint = dj, fingerprint
	rec, err := dj.Lookup(ctx, key, fingerprint)
	switch {
	case err == nil && rec.Done:
		return effects.Result{Status: effects.Replayed, Ref: rec.Ref}, nil
	case errors.Is(err, effects.ErrKeyReused):
		return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Op: j.op, Key: key, Err: err}
	case err != nil:
		return effects.Result{}, effects.Transient(j.op, key, &journalError{err: err})
	}
	if err := ctx.Err(); err != nil {
		return effects.Result{}, effects.Transient(j.op, key, fmt.Errorf("not attempted: %w", err))
	}
	cctx, cancel := context.WithTimeout(ctx, j.callTimeout)
	defer cancel()
	res, err := call(cctx, a)
	if err != nil {
		return effects.Result{}, err
	}
	j.complete(a, res.Ref)
	return res, nil
}

// certainlyNotApplied is the policy's classification of a failed call.
func (j *Journaled) certainlyNotApplied(err error) bool {
	switch {
	case errors.Is(err, effects.ErrAmbiguous):
		return false
	case errors.Is(err, effects.ErrTransient), errors.Is(err, effects.ErrKeyReused), errors.Is(err, effects.ErrInFlight),
		errors.Is(err, effects.ErrInvalidKey), errors.Is(err, effects.ErrInvalidConfig):
		return true
	}
	return j.notApplied != nil && j.notApplied(err)
}

// complete records ref for a's key on a detached context (Complete, or
// MarkDone on the path without a lease), retrying while the error is
// retryable, and logs a record that did not commit.
func (j *Journaled) complete(a *Attempt, ref string) {
	ctx, key := a.ctx, a.key
	dctx, cancel := retry.Detached(ctx, j.record)
	defer cancel()
	var err error
	for attempt := 1; ; attempt++ {
		if a.unleased != nil {
			err = a.unleased.MarkDone(dctx, key, a.fingerprint, ref)
		} else {
			err = j.journal.Complete(dctx, key, ref)
		}
		if err == nil || effects.ClassOf(err) != effects.Retryable {
			break
		}
		if retry.Sleep(dctx, completeBackoff.Delay(attempt)) != nil {
			break
		}
	}
	if err != nil {
		j.unrecorded(a, ref, err)
	}
}

// unrecorded reports a success whose record did not commit.
func (j *Journaled) unrecorded(a *Attempt, ref string, err error) {
	redo := "a redelivery after the lease"
	if a.unleased != nil {
		redo = "a redelivery past the owner's own key horizon"
	}
	msg := j.op + ": the owner confirmed the effect but its journal record did not commit; " +
		"reporting success (the truth), but " + redo + " will do the effect again"
	j.rep.Report(a.ctx, effects.Event{Kind: effects.EventFailed, Component: component, Key: a.key,
		Err: fmt.Errorf("%s (ref %s): %w", msg, ref, err)},
		slog.LevelError, msg, slog.String("ref", ref), slog.Duration("lease", j.lease))
}

// component is the Component of a Journaled's events.
const component = "journal"

// release gives up a's lease on a detached context. If it fails, the lease
// expires on its own and the next attempt only waits longer.
func (j *Journaled) release(a *Attempt) {
	dctx, cancel := retry.Detached(a.ctx, j.record)
	defer cancel()
	if err := j.journal.Release(dctx, a.key, a.number); err != nil {
		msg := j.op + ": could not release the lease after a failure that applied nothing; " +
			"the next attempt waits for it to expire"
		j.rep.Report(a.ctx, effects.Event{Kind: effects.EventFailed, Component: component, Key: a.key,
			Attempt: a.number, Err: fmt.Errorf("%s: %w", msg, err)},
			slog.LevelWarn, msg, slog.Int("attempt", a.number), slog.Duration("lease", j.lease))
	}
}

// journalError carries a failed Begin under an effects.ErrTransient: it keeps the
// journal's cause reachable with errors.As and errors.Is (a
// *pgconn.PgError, context.Canceled) but not the journal's own kind, which
// described the journal call, not the effect.
type journalError struct{ err error }

func (e *journalError) Error() string { return "journal: " + e.err.Error() }

func (e *journalError) Unwrap() error {
	var je *effects.Error
	if errors.As(e.err, &je) {
		return je.Err
	}
	return e.err
}
