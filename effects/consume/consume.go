package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/consume/internal/sched"
	"effectively.dev/effects/retry"
	"effectively.dev/internal/ratelog"
)

// Handler handles one delivery: it does the delivery's side effects, each
// idempotent under a key derived from the delivery's event id (an
// [effects.Plan], an [effects.Effect]), and returns nil once they are
// done, that is committed by their owners. The [Consumer] acks the
// delivery only after that; an error means "not done, do not ack", and its
// class ([effects.ClassOf]) decides what happens next (see the package
// documentation).
//
// ctx carries the attempt's time limit ([WithAttemptTimeout]) and is
// cancelled when the consumer's shutdown grace period expires (see
// [WithShutdownGrace]), not when shutdown starts, so a handler that is
// running when shutdown begins can finish its work. A handler may be
// called again for the same delivery (a retry, a redelivery after a crash)
// and must therefore be idempotent; that is what package effects is for. A
// panic in it is recovered as a *[effects.PanicError].
type Handler func(ctx context.Context, d effects.Delivery) error

// Consumer errors.
var (
	// ErrBatchResults is the error every delivery of a batch gets when the
	// batch handler ([WithBatch]) returned a slice whose length differs
	// from the batch's.
	ErrBatchResults = errors.New("batch handler returned the wrong number of results")

	// ErrRunning is returned by [Consumer.Run] while another Run
	// of the same Consumer is in progress.
	ErrRunning = errors.New("consumer is already running")

	// ErrAttemptTimeout wraps the error of an attempt that ran past its
	// time limit ([WithAttemptTimeout]). It adds no class: the attempt's
	// own error (usually context.DeadlineExceeded, retryable) decides.
	ErrAttemptTimeout = errors.New("attempt ran past its time limit")

	// ErrAttemptOverrun is the error of the [effects.EventFailed] a
	// consumer reports for an attempt still running well past its time
	// limit ([WithAttemptTimeout]): a handler that ignores its context,
	// holding its Ordering and a worker (see [Stats].Overran).
	ErrAttemptOverrun = errors.New("attempt still running past its time limit: the handler ignores its context")

	// ErrShutdownWait is the error of the [effects.EventFailed] a consumer
	// reports half a second after its shutdown grace ([WithShutdownGrace])
	// ended, for each delivery whose handler is still running (a Warn line
	// naming it, without an observer): Run waits for it.
	ErrShutdownWait = errors.New("shutdown grace over; Run still waits for this delivery's handler")
)

// Defaults of a [Consumer], used when the matching option is not given.
const (
	// defaultConcurrency is how many handlers run at once.
	defaultConcurrency = 8
	// defaultMaxAttempts is how many attempts precede the dead-letter hook
	// for an error that is not permanent.
	defaultMaxAttempts = 10
	// defaultMinBackoff is the first pause between attempts.
	defaultMinBackoff = 100 * time.Millisecond
	// defaultMaxBackoff is the longest pause between attempts.
	defaultMaxBackoff = 30 * time.Second
	// defaultShutdownGrace is how long running handlers may finish after
	// Run's context is cancelled.
	defaultShutdownGrace = 10 * time.Second
	// defaultMaxPending bounds the deliveries taken and not yet finished.
	defaultMaxPending = 1024
	// defaultAttemptTimeout is each attempt's time limit: one
	// journal lease (journal.WithLease's default), the longest a journaled step's lease lets one
	// attempt at a key run (see [WithAttemptTimeout]).
	defaultAttemptTimeout = time.Minute
	// defaultInFlightWait is how long a delivery may wait in all for other
	// attempts that hold its keys before [effects.ErrInFlight] counts as a
	// failed attempt: five default leases (see [WithInFlightWait]).
	defaultInFlightWait = 5 * time.Minute
)

// Option configures a [Consumer]; see [New].
type Option interface{ apply(*config) }

type option func(*config)

func (f option) apply(c *config) { f(c) }

type config struct {
	concurrency            int
	maxAttempts            int
	minBackoff, maxBackoff time.Duration
	deadLetter             func(ctx context.Context, d effects.Delivery, err error) error
	deadLetterSet          bool
	noDeadLetter           bool
	observer               effects.Observer
	logger                 *slog.Logger
	loggerSet              bool
	grace                  time.Duration
	maxPending             int
	maxPendingSet          bool
	attemptTimeout         time.Duration
	inFlightWait           time.Duration

	batchSet    bool
	batchSize   int
	batchLinger time.Duration
	batch       func(context.Context, []effects.Delivery) []error
}

// WithConcurrency sets how many handlers run at the same time (default 8).
// With [WithBatch], it is how many batches run at the same time. Deliveries
// with the same Ordering never run concurrently whatever n is, so a Kafka
// topic with p partitions keeps at most p handlers busy. n must be at least
// 1.
func WithConcurrency(n int) Option {
	return option(func(c *config) { c.concurrency = n })
}

// WithMaxAttempts sets how many times the handler is tried for one delivery
// whose error is retryable or unclassified before the delivery goes to the
// dead-letter hook (default 10). Permanent errors go to the hook at the
// first attempt whatever n is; waits for another attempt's lease
// ([WithInFlightWait]) do not count. 0 retries forever. n must not be
// negative.
func WithMaxAttempts(n int) Option {
	return option(func(c *config) { c.maxAttempts = n })
}

// WithBackoff sets the pause between attempts: it starts at min and doubles
// per attempt up to max, and each pause is drawn at random between half and
// all of that ceiling, so deliveries that failed together do not retry in
// lockstep. Defaults: 100 ms and 30 s; with the default 10 attempts a
// delivery whose errors are retryable is dead-lettered after about 25 to 50
// seconds of failures. An error that carries a longer [effects.RetryAfter]
// (a provider's Retry-After on a 429) is waited out instead, up to 5
// minutes, so a burst of rate limits does not use up the attempts of
// [WithMaxAttempts] (an [effects.ErrInFlight]'s RetryAfter is the rest of
// another attempt's lease, which [WithInFlightWait] governs instead). A
// parked delivery (see [WithoutDeadLetter]) is retried every max. 0 < min
// <= max.
func WithBackoff(min, max time.Duration) Option {
	return option(func(c *config) { c.minBackoff, c.maxBackoff = min, max })
}

// WithDeadLetter sets the hook that takes a delivery the consumer gives up
// on: at once when its error is permanent (class [effects.Permanent]: a
// refusal, a key reused, an invalid key, poison, a panic), or after
// [WithMaxAttempts] attempts that failed otherwise. err is the last
// attempt's error (errors.As reaches a *[effects.PanicError] and its
// stack). The hook typically writes the delivery to a dead-letter topic or
// table; it must be idempotent, because a crash between the hook and the
// ack calls it again after the redelivery. It runs under the attempt time
// limit; a panic in it is recovered as the hook's failure.
//
// If the hook returns nil, the consumer acks the delivery: it is handled,
// by the hook. If it returns a configuration error ([effects.InvalidConfig]: a
// dead-letter topic that does not exist), Run stops as for a handler's
// configuration error. Any other error parks the delivery, as
// [WithoutDeadLetter] does, and each retry calls the hook again.
//
// [New] requires WithDeadLetter or [WithoutDeadLetter]: where poison goes
// is a decision.
func WithDeadLetter(f func(ctx context.Context, d effects.Delivery, err error) error) Option {
	return option(func(c *config) { c.deadLetter, c.deadLetterSet = f, true })
}

// WithoutDeadLetter declares that there is no dead-letter hook: a delivery
// the consumer gives up on is parked, never dropped. A parked delivery
// stays unacked and holds its Ordering (a Kafka partition stops behind
// it, and its source commits nothing past it) while other Orderings go on;
// the consumer retries it every max backoff ([WithBackoff]), so a delivery
// given up on during an outage resumes by itself when the outage ends, and
// a poison one until an operator fixes the code or moves it aside.
//
// Parking is reported once per delivery: [effects.EventFailed] at each
// round to an observer, and without one a single Warn line when the
// delivery is parked (the later rounds log at Debug); [Stats].Parked says
// how many deliveries are parked now, the number to alert on.
//
// Choose it when a stalled partition is better than a message moved aside:
// when events must apply in order or not at all, or in tests. Otherwise
// give a hook ([WithDeadLetter]; kafka.DeadLetterTopic writes one).
func WithoutDeadLetter() Option {
	return option(func(c *config) { c.noDeadLetter = true })
}

// WithObserver reports what happens to deliveries to o:
// [effects.EventRetried] for a failed attempt that another attempt
// follows, [effects.EventInFlight] for a wait for another attempt's lease
// (not a failed attempt), [effects.EventDeadLettered] when the dead-letter
// hook took the delivery, [effects.EventFailed] otherwise (the delivery
// stays unacked: parked, interrupted by shutdown, stopped by a
// configuration error) and when an Ack fails. Events carry DeliveryID,
// Attempt (the attempt's number, from 1), Duration (the handler's run
// time) and Err. Successful attempts are counted in [Consumer.Stats], not
// observed.
//
// When o is also an [effects.Tracer] (package effectively.dev/observe's
// Observer is), each attempt of the Handler runs in an
// [effects.SpanDelivery] span that continues the trace the delivery's
// headers carry (a traceparent written by kafka.Producer or the outbox),
// so the plan, step and effect spans under it join the producer's trace.
// Batches ([WithBatch]) get no delivery span: a batch has many parents.
//
// Without an observer (or with a nil o), the consumer logs the same events
// to its logger ([WithLogger]; slog.Default() unless set), rate-limited (a burst of 10 lines, then about one a
// second, with a count of the lines held back), one line per event with
// delivery_id, attempt, class ([effects.ClassOf]) and error: retries and
// waits at Info, dead letters, parking and failed acks at Warn, a
// configuration error at Error, and the later rounds of a parked delivery
// at Debug. A panic's line also carries its stack. To silence them, pass
// an observer that does nothing.
func WithObserver(o effects.Observer) Option {
	return option(func(c *config) { c.observer = o })
}

// WithLogger sets the logger the consumer writes its events to when it
// has no observer (see [WithObserver]); the default is slog.Default() at
// the time of each line. Lines are rate-limited either way. l must not be
// nil.
func WithLogger(l *slog.Logger) Option {
	return option(func(c *config) { c.logger, c.loggerSet = l, true })
}

// WithShutdownGrace sets how long handlers that are running when Run's
// context is cancelled may take to finish (default 10 s). Their context is
// cancelled when the grace expires. 0 cancels it at once. d must not be
// negative.
func WithShutdownGrace(d time.Duration) Option {
	return option(func(c *config) { c.grace = d })
}

// WithMaxPending bounds how many deliveries the consumer holds: taken
// from the source and not yet acked or given up, whether running, waiting
// for a worker, waiting for a retry, or queued behind an earlier delivery
// with the same Ordering. When n are held, it stops calling Next until one
// finishes. The default, 1024 (or more with
// [WithBatch]: enough for every worker to fill a batch), lets the other
// Orderings go on while some are stuck behind a failing delivery, as long
// as the source bounds what one Ordering may hold (kafka.Source does, per
// partition: kafka.WithMaxPendingPerPartition). The cost is memory: n
// deliveries' bodies. n must be at least 1.
func WithMaxPending(n int) Option {
	return option(func(c *config) { c.maxPending, c.maxPendingSet = n, true })
}

// WithAttemptTimeout sets each attempt's time limit (default one minute,
// one journal lease): the handler's context (a batch handler's, for
// the whole batch) gets this deadline, and so does the dead-letter hook's.
// A handler that honours its context returns when the deadline passes; the
// consumer wraps its error with [ErrAttemptTimeout] and counts it in
// [Stats].TimedOut, and the error's class decides as for any failed attempt
// (a cut call is usually retryable). 0 sets no limit. d must not be
// negative.
//
// A limit frees an Ordering held by a call stuck on a dead connection (the
// kernel would take many minutes to give up). What it leaves behind is an
// unknown outcome, which the retry resolves with the same key. With
// journal-backed steps (effects/journal): a journaled step bounds its own
// call at nine tenths of its lease (journal.WithLease, a minute), and
// keeps the lease after an outcome it cannot rule out; the retry then
// meets [effects.ErrInFlight] until the lease expires, waits it out
// without spending attempts ([WithInFlightWait]), and takes the key over:
// it replays what the owner recorded, or does the effect. So a limit below
// the lease cuts hung calls sooner at the cost of waiting for the lease;
// set it above the longest time a healthy attempt takes (the sum of a
// plan's steps), and [WithInFlightWait] above the longest lease.
func WithAttemptTimeout(d time.Duration) Option {
	return option(func(c *config) { c.attemptTimeout = d })
}

// WithInFlightWait sets how long, in all, a delivery may wait for other
// attempts that hold its keys (default five minutes, five default leases),
// counted from the first attempt that answered [effects.ErrInFlight].
// Within it, an ErrInFlight is not a failed attempt: it spends no attempt
// of [WithMaxAttempts] and is never dead-lettered; the consumer waits, with
// the backoff's growing pauses, but never past the rest of the other
// attempt's lease when the error reports it ([effects.RetryAfter]), so a
// key freed by an expired lease is taken over at once. After it,
// ErrInFlight counts as a failed attempt like any retryable error: an
// adapter that answers in flight for ever ends in the dead-letter hook (or
// parked), never loops for ever. Set it above the longest lease of the
// plan's steps. 0 counts every ErrInFlight as a failed attempt. d must not
// be negative.
func WithInFlightWait(d time.Duration) Option {
	return option(func(c *config) { c.inFlightWait = d })
}

// WithBatch makes the consumer hand deliveries to h in batches of up to
// size, instead of one by one to a [Handler] (pass a nil Handler to
// [New]): for a handler that claims all their keys and writes all their
// effects in one database transaction (in package postgres, ApplyBatch and
// BatchErrors make the body of one). h returns one error per delivery, in
// the order of ds: nil means that delivery's effects are done and it may
// be acked; a non-nil error is classified and handled exactly as a
// Handler's error would be. A slice of the wrong length fails every
// delivery of the batch with [ErrBatchResults]. A panic in h is recovered;
// the consumer then hands each delivery of the batch to h alone, in
// order, so that only the deliveries that panic on their own get the
// *[effects.PanicError] and the others go on.
//
// Order: a batch takes the deliveries whose turn it is, each with the run
// of deliveries of its Ordering waiting behind it (consecutive, in order,
// as many as fit), so a Kafka partition's records are batched together and
// in offset order. They are in their Ordering's order in ds, though not
// necessarily next to each other, so a handler that applies ds in order,
// or commits it all at once, keeps that order. Per-Ordering order holds as
// with a Handler: a delivery is in a batch only with, or after, every
// earlier delivery of its Ordering; deliveries without an Ordering batch
// freely. When a delivery fails and another of its Ordering after it in ds
// succeeded, the later one's effects are done and it is acked; if the
// order of effects matters even then, fail the rest of the run too: those
// deliveries are tried again after the failed one, and these attempts do
// not count against their budget.
//
// Linger: when fewer than size deliveries are waiting, a batch waits at
// most linger for more (0: it takes only what is waiting), for deliveries
// that become ready and for new deliveries of the Orderings it holds. It
// does not wait when nothing can arrive: while every slot of
// [WithMaxPending] is taken, the consumer takes nothing from the source,
// and the batch starts at once.
//
// Each delivery keeps its own attempt count and backoff; a failed delivery
// joins a later batch when its backoff expires, and is acked or
// dead-lettered on its own. size must be at least 1, linger not negative.
func WithBatch(size int, linger time.Duration, h func(ctx context.Context, ds []effects.Delivery) []error) Option {
	return option(func(c *config) {
		c.batchSet, c.batchSize, c.batchLinger, c.batch = true, size, linger, h
	})
}

// Stats counts what a [Consumer] did, over all its runs, and how many
// deliveries are parked now.
type Stats struct {
	// Delivered counts deliveries taken from the source.
	Delivered int64
	// Acked counts successful Acks: after the handler returned nil, or
	// after the dead-letter hook took the delivery.
	Acked int64
	// Retried counts failed attempts that were followed by another attempt
	// within the attempt budget ([effects.EventRetried]).
	Retried int64
	// InFlight counts waits for another attempt's lease
	// ([effects.EventInFlight]): attempts that answered
	// [effects.ErrInFlight] within [WithInFlightWait], not counted as
	// attempts.
	InFlight int64
	// TimedOut counts handler calls (a batch counts once) that ran past
	// their time limit ([WithAttemptTimeout]): cut by it, or returning
	// after it.
	TimedOut int64
	// Overran counts handler calls (a batch counts once) still running
	// well past their time limit (a tenth of it, from 50 ms to 1 s): a
	// handler that ignores its context. Each is also reported as an
	// [effects.EventFailed] with [ErrAttemptOverrun] (a rate-limited Warn
	// line naming the delivery, without an observer).
	Overran int64
	// DeadLettered counts deliveries the dead-letter hook took
	// ([effects.EventDeadLettered]).
	DeadLettered int64
	// Failed counts [effects.EventFailed]: failed attempts after which the
	// delivery stayed unacked (parked, interrupted by shutdown, stopped by
	// a configuration error), and failed Acks.
	Failed int64
	// Released counts deliveries handed back to a [effects.Releaser]
	// source for redelivery instead of retried in place: retries within the
	// attempt budget (also counted in Retried), and parked deliveries
	// (also counted in Failed).
	Released int64
	// Dropped counts deliveries the consumer let go unhandled because the
	// source no longer owned them ([effects.OwnershipChecker]): a revoked
	// partition, an expired acquisition lock. Their new owner handles them.
	Dropped int64
	// Parked is how many deliveries are parked now: given up on, held
	// unacked and retried every max backoff, because there is no
	// dead-letter hook ([WithoutDeadLetter]) or the hook failed. Not a
	// count: it goes down when they succeed, are dead-lettered, dropped or
	// released, and to 0 when Run returns. The number to alert on.
	Parked int64
}

// Consumer takes deliveries from an [effects.Source], hands each to a
// [Handler] (or batches to a [WithBatch] handler), and acks it only after the
// handler returned nil: side effect first, then ack. A failed delivery is
// never acked by the handler's path; what happens to it depends on its
// error's class, as the package documentation describes: retried in place
// with backoff, waited for, dead-lettered, parked, or stopping Run.
//
// Concurrency is bounded ([WithConcurrency]); deliveries with the same
// non-empty Ordering are handled one at a time in the order Next returned
// them, a retried delivery holding back those behind it; deliveries with
// different or empty Orderings run concurrently. The consumer holds at most
// [WithMaxPending] deliveries taken from the source and not yet finished.
//
// What it never does: ack a delivery whose handler failed or was
// interrupted, ack a delivery twice, or drop one the source still owns (a
// source that is an [effects.OwnershipChecker] may say a delivery is no
// longer its own, a revoked partition: the consumer then drops it before
// its next attempt, counted in [Stats].Dropped, and the new owner handles
// it).
//
// An Ack that fails is reported as [effects.EventFailed] and not retried:
// the source delivers the message again and the idempotent handler replays
// it. With package kafka this happens to deliveries of a partition revoked
// while they were queued or running (kafka.ErrRevoked): the partition's
// new owner handles them too.
//
// Attempts are counted from [effects.Delivery].Attempt when the source
// knows it (a share group's delivery count), so the budget holds across
// processes. With an [effects.Releaser] source, a delivery without an
// Ordering that is to be retried after a failure is released back to the
// broker after its backoff instead of retried in place (counted in
// [Stats].Released); if the release fails it is retried in place. A wait
// for another attempt's lease is not a failure and is not released.
//
// A Consumer is safe for concurrent use; Run runs one at a time.
type Consumer struct {
	src effects.Source
	h   Handler
	cfg config

	running                                       atomic.Bool
	delivered, acked, retried, deadLettered, fail atomic.Int64
	inFlight, timedOut, released, dropped, parked atomic.Int64
	overran                                       atomic.Int64
	log                                           ratelog.Limiter // without an observer
}

// New returns a consumer of src that hands every delivery to h
// (or, with [WithBatch], batches to the batch handler; then h must be nil).
//
// It requires a decision about dead letters: [WithDeadLetter] or
// [WithoutDeadLetter]. A consumer cannot drop a delivery it gives up on,
// so without a hook it holds it, and its Ordering stalls behind it; that
// should be chosen in code, not met in production.
//
// It returns a *[effects.ConfigError] for a nil source, a missing or
// doubled handler, no dead-letter decision (or both), or an invalid
// option. Nil options are ignored.
//
// Defaults: 8 concurrent handlers, 10 attempts, backoff from 100 ms to
// 30 s, a one-minute limit per attempt, five minutes of waiting for other
// attempts' leases, failures logged to slog.Default() (no observer), 10 s
// shutdown grace, 1024 pending deliveries.
func New(src effects.Source, h Handler, opts ...Option) (*Consumer, error) {
	cfg := config{
		concurrency:    defaultConcurrency,
		maxAttempts:    defaultMaxAttempts,
		minBackoff:     defaultMinBackoff,
		maxBackoff:     defaultMaxBackoff,
		grace:          defaultShutdownGrace,
		attemptTimeout: defaultAttemptTimeout,
		inFlightWait:   defaultInFlightWait,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := cfg.check(src, h); err != nil {
		return nil, err
	}
	cfg.setMaxPending()
	c := &Consumer{src: src, h: h, cfg: cfg}
	c.log.Logger = cfg.logger
	return c, nil
}

const ctor = "consume.New"

// check validates the configuration with New's arguments.
func (cfg *config) check(src effects.Source, h Handler) error {
	switch {
	case src == nil:
		return effects.ConfigErrorf(ctor, "source", "nil source")
	case cfg.batchSet && cfg.batch == nil:
		return effects.ConfigErrorf(ctor, "WithBatch", "nil batch handler")
	case cfg.batchSet && h != nil:
		return effects.ConfigErrorf(ctor, "handler", "both a Handler and a WithBatch handler; pass a nil Handler with WithBatch")
	case !cfg.batchSet && h == nil:
		return effects.ConfigErrorf(ctor, "handler", "nil handler (pass one, or use WithBatch)")
	case cfg.loggerSet && cfg.logger == nil:
		return effects.ConfigErrorf(ctor, "WithLogger", "nil logger")
	}
	if err := cfg.checkPacing(); err != nil {
		return err
	}
	return cfg.checkDeadLetter()
}

// checkPacing validates the options that bound concurrency, retries,
// time and batches.
func (cfg *config) checkPacing() error {
	switch {
	case cfg.concurrency < 1:
		return effects.ConfigErrorf(ctor, "WithConcurrency", "%d handlers; need at least 1", cfg.concurrency)
	case cfg.maxAttempts < 0:
		return effects.ConfigErrorf(ctor, "WithMaxAttempts", "%d attempts; need 0 (retry forever) or more", cfg.maxAttempts)
	case cfg.minBackoff <= 0:
		return effects.ConfigErrorf(ctor, "WithBackoff", "min %v; need a positive pause", cfg.minBackoff)
	case cfg.maxBackoff < cfg.minBackoff:
		return effects.ConfigErrorf(ctor, "WithBackoff", "max %v is below min %v", cfg.maxBackoff, cfg.minBackoff)
	case cfg.grace < 0:
		return effects.ConfigErrorf(ctor, "WithShutdownGrace", "negative grace %v", cfg.grace)
	case cfg.attemptTimeout < 0:
		return effects.ConfigErrorf(ctor, "WithAttemptTimeout", "negative limit %v (0 sets none)", cfg.attemptTimeout)
	case cfg.inFlightWait < 0:
		return effects.ConfigErrorf(ctor, "WithInFlightWait", "negative wait %v", cfg.inFlightWait)
	case cfg.maxPendingSet && cfg.maxPending < 1:
		return effects.ConfigErrorf(ctor, "WithMaxPending", "%d deliveries; need at least 1", cfg.maxPending)
	case cfg.batchSet && cfg.batchSize < 1:
		return effects.ConfigErrorf(ctor, "WithBatch", "batch size %d; need at least 1", cfg.batchSize)
	case cfg.batchSet && cfg.batchLinger < 0:
		return effects.ConfigErrorf(ctor, "WithBatch", "negative linger %v", cfg.batchLinger)
	}
	return nil
}

// checkDeadLetter requires exactly one dead-letter decision.
func (cfg *config) checkDeadLetter() error {
	switch {
	case cfg.deadLetterSet && cfg.deadLetter == nil:
		return effects.ConfigErrorf(ctor, "WithDeadLetter", "nil hook (to go without one, say WithoutDeadLetter())")
	case cfg.deadLetterSet && cfg.noDeadLetter:
		return effects.ConfigErrorf(ctor, "WithoutDeadLetter", "given with WithDeadLetter; choose one")
	case !cfg.deadLetterSet && !cfg.noDeadLetter:
		return effects.ConfigErrorf(ctor, "WithDeadLetter", "no dead-letter decision: pass WithDeadLetter(hook) to move the deliveries "+
			"the consumer gives up on aside, or WithoutDeadLetter() to park them unacked, stalling their Ordering")
	}
	return nil
}

// setMaxPending sets the default bound on pending deliveries when
// [WithMaxPending] was not given: room for every handler's batch.
func (cfg *config) setMaxPending() {
	if !cfg.maxPendingSet {
		cfg.maxPending = defaultMaxPending
		if cfg.batchSet {
			cfg.maxPending = max(defaultMaxPending, (cfg.concurrency+1)*cfg.batchSize)
		}
	}
}

// Stats returns the consumer's counters.
func (c *Consumer) Stats() Stats {
	return Stats{
		Delivered:    c.delivered.Load(),
		Acked:        c.acked.Load(),
		Retried:      c.retried.Load(),
		InFlight:     c.inFlight.Load(),
		TimedOut:     c.timedOut.Load(),
		Overran:      c.overran.Load(),
		DeadLettered: c.deadLettered.Load(),
		Failed:       c.fail.Load(),
		Released:     c.released.Load(),
		Dropped:      c.dropped.Load(),
		Parked:       c.parked.Load(),
	}
}

// Run consumes until ctx is done, the source fails, or a handler (or the
// dead-letter hook) returns a configuration error, and then shuts down
// gracefully: it stops calling Next, starts no new attempt and no retry,
// and waits for the handlers (and dead-letter hooks) that are running;
// their context is cancelled when the shutdown grace expires. It acks
// those that succeed, never one that failed or was interrupted; deliveries
// it took but did not finish stay unacked, and the source delivers them
// again (to this consumer's next Run, or after a restart). Run returns
// only after every goroutine it started has ended, so a handler that
// ignores its context delays it.
//
// Run returns nil after a shutdown caused by ctx alone. When Next fails
// while ctx is not done, it returns that error, wrapped (errors.Is and
// errors.As see it): the consumer does not retry a failing source. After
// a configuration error it returns an error that wraps it, so
// errors.Is(err, [effects.ErrInvalidConfig]) holds and errors.As reaches
// the *[effects.ConfigError] that names the setting; the delivery that met
// it is neither acked nor dead-lettered, and nothing after it in its
// Ordering runs: fix the configuration and restart, and the redelivery
// replays the steps that were done. It returns [ErrRunning] if another Run
// is in progress.
//
// The consumer does not close the source; do it after Run returned (a Kafka
// source commits its acked offsets when closed).
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer c.running.Store(false)

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	// Handlers, hooks and acks get a context that keeps ctx's values but not
	// its cancellation, and is cancelled when the grace period expires.
	hctx, expire := context.WithCancel(context.WithoutCancel(ctx))
	defer expire()

	r := &run{c: c, ctx: runCtx, stop: stop, hctx: hctx, slots: make([]slot, c.cfg.concurrency)}
	r.s = sched.New(runCtx, sched.Config{
		MaxPending: c.cfg.maxPending,
		BatchSize:  c.cfg.batchSize,
		Linger:     c.cfg.batchLinger,
		Resume:     r.resume,
	})
	for i := range c.cfg.concurrency {
		r.workers.Add(1)
		if c.cfg.batchSet {
			go r.batchWorker(&r.slots[i])
		} else {
			go r.worker(&r.slots[i])
		}
	}
	watchDone := make(chan struct{})
	watching := r.watchOverruns(watchDone)
	defer func() {
		close(watchDone)
		<-watching
	}()

	if err := r.fetch(); err != nil {
		r.halt(err)
	}

	// Shut down: stop taking work, give the running handlers the grace.
	stop()
	grace := time.AfterFunc(c.cfg.grace, expire)
	defer grace.Stop()
	name := time.AfterFunc(c.cfg.grace+nameAfter, r.nameRunning)
	defer name.Stop()
	r.workers.Wait()
	r.s.Stop()
	c.parked.Store(0) // what was parked stays unacked: delivered again
	return r.fatal
}

// run is the state of one Consumer.Run.
type run struct {
	c    *Consumer
	ctx  context.Context // done: shutting down
	stop context.CancelFunc
	hctx context.Context // for handlers, hooks and acks; done when the grace expires
	s    *sched.Scheduler

	workers sync.WaitGroup
	slots   []slot // per worker, the attempt its handler runs

	haltOnce sync.Once
	fatal    error // what stopped Run, set once, before stop
}

// halt stops the run for err (the first such error wins): Run shuts down
// and returns it.
func (r *run) halt(err error) {
	r.haltOnce.Do(func() {
		r.fatal = err
		r.stop()
	})
}

// fetch takes deliveries from the source until the run's context is done
// (it returns nil) or Next fails (it returns the error).
func (r *run) fetch() error {
	for {
		if !r.s.Reserve() {
			return nil
		}
		d, err := r.c.src.Next(r.ctx)
		if err != nil {
			r.s.Unreserve()
			if r.ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("consume.Consumer: source failed, consumer stopped: %w", err)
		}
		r.c.delivered.Add(1)
		if r.ctx.Err() != nil {
			return nil // shutting down: left unacked, delivered again
		}
		t := &sched.Task{Delivery: d}
		if d.Attempt > 1 {
			t.Attempt = d.Attempt - 1 // the source's earlier attempts count
		}
		r.s.Add(t)
	}
}

// errNotOwned settles a delivery the source no longer owns: dropped.
var errNotOwned = errors.New("effects: delivery no longer owned by this source")

// owns reports whether the source still owns t's delivery (true for a
// source that does not say).
func (r *run) owns(t *sched.Task) bool {
	oc, ok := r.c.src.(effects.OwnershipChecker)
	return !ok || oc.Owns(t.Delivery)
}

// attempt is one attempt's results, for [sched.Scheduler.Settle].
type attempt struct {
	r     *run
	tasks []*sched.Task
	errs  []error
	took  time.Duration
	end   func(effects.Event) // the delivery span's end, if any (one Handler attempt)
}

// decide decides about delivery i, and ends its span with the outcome
// decided, so span and metric outcomes agree.
func (a *attempt) decide(i int, behind bool) (sched.Outcome, time.Duration) {
	t := a.tasks[i]
	attempt := t.Attempt // decide may take a wait's attempt back
	out, delay, kind := a.r.decide(t, a.errs[i], a.took, behind)
	if a.end != nil {
		ev := effects.Event{Kind: kind, DeliveryID: t.Delivery.ID, Attempt: attempt, Duration: a.took, Err: a.errs[i]}
		if kind == effects.EventApplied {
			ev.Err = nil
		}
		a.end(ev)
		a.end = nil
	}
	return out, delay
}

// worker hands ready deliveries to the Handler one at a time; running
// holds the attempt that runs.
func (r *run) worker(running *slot) {
	defer r.workers.Done()
	a := &attempt{r: r, tasks: make([]*sched.Task, 1), errs: make([]error, 1)}
	decide := a.decide
	var next *sched.Task // the settled delivery's successor in its lane, kept
	for {
		t := next
		if t == nil {
			if t = r.s.Take(); t == nil {
				return
			}
		}
		if r.ctx.Err() != nil {
			return // not started: left unacked
		}
		a.tasks[0], a.errs[0], a.took, a.end = t, errNotOwned, 0, nil
		if r.owns(t) {
			t.Attempt++
			start := time.Now()
			running.set(t, t.Attempt, start)
			a.end, a.errs[0] = r.handle(t.Delivery, t.Attempt)
			running.clear()
			a.took = time.Since(start)
		}
		next = r.s.Settle(a.tasks, decide)
	}
}

// handle runs the Handler for attempt number attempt at d, inside a
// delivery span when the observer is an effects.Tracer; it returns the
// span's end (nil without a span), which the decision calls with its
// outcome.
func (r *run) handle(d effects.Delivery, attempt int) (end func(effects.Event), err error) {
	ctx, cancel := r.attemptContext()
	defer cancel()
	if t, ok := r.c.cfg.observer.(effects.Tracer); ok {
		ctx, end = t.Start(ctx, effects.SpanDelivery,
			effects.Event{DeliveryID: d.ID, Attempt: attempt, Headers: d.Headers})
	}
	defer func() { err = r.cut(ctx, err) }()
	defer effects.Recover("consume.Handler", &err)
	return end, r.c.h(ctx, d)
}

// batchWorker collects batches for the batch handler: ready deliveries, each
// with the run of its lane behind it; running holds the batch's first
// delivery while the batch runs.
func (r *run) batchWorker(running *slot) {
	defer r.workers.Done()
	for {
		first := r.s.Take()
		if first == nil {
			return
		}
		batch := r.s.Collect(first)
		if r.ctx.Err() != nil {
			return // not started: left unacked
		}
		a := &attempt{r: r, tasks: batch, errs: make([]error, len(batch))}
		ds := make([]effects.Delivery, 0, len(batch))
		var owned []int // batch indexes of ds
		for i, t := range batch {
			if !r.owns(t) {
				a.errs[i] = errNotOwned
				continue
			}
			t.Attempt++
			ds = append(ds, t.Delivery)
			owned = append(owned, i)
		}
		if len(ds) > 0 {
			start := time.Now()
			running.set(batch[owned[0]], batch[owned[0]].Attempt, start)
			res := r.handleBatch(ds)
			running.clear()
			a.took = time.Since(start)
			for j, i := range owned {
				a.errs[i] = res[j]
			}
		}
		if keep := r.s.Settle(batch, a.decide); keep != nil {
			r.s.Ready(keep)
		}
	}
}

// handleBatch runs the batch handler for one attempt at ds and returns one
// error per delivery. After a panic it runs each delivery alone, so that
// only those that panic by themselves fail with it.
func (r *run) handleBatch(ds []effects.Delivery) []error {
	res, panicked := r.callBatch(ds)
	if panicked == nil || len(ds) == 1 {
		return res
	}
	res = make([]error, len(ds))
	for i := range ds {
		one, _ := r.callBatch(ds[i : i+1])
		res[i] = one[0]
	}
	return res
}

// callBatch calls the batch handler once. It returns one error per
// delivery; panicked is the recovered panic, if any (then every delivery
// has it).
func (r *run) callBatch(ds []effects.Delivery) (res []error, panicked error) {
	ctx, cancel := r.attemptContext()
	defer cancel()
	func() {
		defer effects.Recover("consume batch handler", &panicked)
		res = r.c.cfg.batch(ctx, ds)
	}()
	var all error
	switch {
	case panicked != nil:
		all = panicked
	case len(res) != len(ds):
		all = fmt.Errorf("%w: %d results for %d deliveries", ErrBatchResults, len(res), len(ds))
	}
	if all != nil {
		res = make([]error, len(ds))
		for i := range res {
			res[i] = all
		}
	}
	if r.timedOut(ctx) {
		for i, err := range res {
			if err != nil {
				res[i] = r.wrapTimeout(err)
			}
		}
	}
	return res, panicked
}

// attemptContext returns the context of one attempt: the handlers'
// context with the attempt's time limit, if any.
func (r *run) attemptContext() (context.Context, context.CancelFunc) {
	if d := r.c.cfg.attemptTimeout; d > 0 {
		return context.WithTimeout(r.hctx, d)
	}
	return r.hctx, func() {}
}

// cut wraps err, an attempt's error, with ErrAttemptTimeout when the
// attempt under ctx ran past its time limit (and counts it, failed or
// not).
func (r *run) cut(ctx context.Context, err error) error {
	if !r.timedOut(ctx) || err == nil {
		return err
	}
	return r.wrapTimeout(err)
}

// overrunAfter is how long past its time limit d an attempt may still run
// before it is reported as overrunning: a tenth of d, from 50 ms to 1 s.
func overrunAfter(d time.Duration) time.Duration {
	return min(max(d/10, 50*time.Millisecond), time.Second)
}

// slot is what one worker's handler runs now, for the overrun watch and
// the shutdown report: written by the worker, read by the watch.
type slot struct {
	task     atomic.Pointer[sched.Task] // nil: none (a batch: its first)
	attempt  atomic.Int64
	start    atomic.Int64 // the attempt's start, Unix nanoseconds
	reported atomic.Int64 // the start of the attempt reported as overrunning
}

func (s *slot) set(t *sched.Task, attempt int, start time.Time) {
	s.attempt.Store(int64(attempt))
	s.start.Store(start.UnixNano())
	s.task.Store(t)
}

func (s *slot) clear() { s.task.Store(nil) }

// load returns the slot's attempt: its delivery id, number and start, and
// whether there is one.
func (s *slot) load() (id string, attempt int, start int64, ok bool) {
	t := s.task.Load()
	if t == nil {
		return "", 0, 0, false
	}
	attempt, start = int(s.attempt.Load()), s.start.Load()
	if s.task.Load() != t {
		return "", 0, 0, false // the worker moved on meanwhile
	}
	return t.Delivery.ID, attempt, start, true
}

// watchOverruns reports, until done is closed, each attempt still running
// overrunAfter past its time limit: one goroutine per Run, no cost per
// attempt beyond the slot's stores. The channel it returns is closed when
// it ended.
func (r *run) watchOverruns(done <-chan struct{}) <-chan struct{} {
	ended := make(chan struct{})
	d := r.c.cfg.attemptTimeout
	if d <= 0 {
		close(ended)
		return ended
	}
	after := overrunAfter(d)
	go func() {
		defer close(ended)
		tick := time.NewTicker(after / 2)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				r.reportOverruns(now, int64(d+after))
			}
		}
	}()
	return ended
}

// reportOverruns reports the attempts that started more than late
// nanoseconds before now, once each.
func (r *run) reportOverruns(now time.Time, late int64) {
	d := r.c.cfg.attemptTimeout
	for i := range r.slots {
		s := &r.slots[i]
		id, attempt, start, ok := s.load()
		if !ok || now.UnixNano()-start < late || s.reported.Load() == start {
			continue
		}
		s.reported.Store(start)
		r.c.overran.Add(1)
		err := fmt.Errorf("%w (limit %v, WithAttemptTimeout)", ErrAttemptOverrun, d)
		r.reportEvent(effects.Event{Kind: effects.EventFailed, DeliveryID: id, Attempt: attempt, Duration: time.Duration(now.UnixNano() - start), Err: err},
			slog.LevelWarn, "consume.Consumer: handler still running past its time limit; it ignores its context")
	}
}

// nameAfter is how long after the shutdown grace Run names the deliveries
// whose handlers still run: time for those that honour their context to
// return.
const nameAfter = 500 * time.Millisecond

// nameRunning reports the deliveries whose handlers still run after the
// shutdown grace: Run waits for them.
func (r *run) nameRunning() {
	for i := range r.slots {
		if id, attempt, _, ok := r.slots[i].load(); ok {
			r.reportEvent(effects.Event{Kind: effects.EventFailed, DeliveryID: id, Attempt: attempt, Err: ErrShutdownWait},
				slog.LevelWarn, "consume.Consumer: shutdown grace over; still waiting for a handler that ignores its context")
		}
	}
}

// timedOut reports whether the attempt under ctx ran past its time limit
// (ctx's own deadline, not the end of the grace), and counts it.
func (r *run) timedOut(ctx context.Context) bool {
	if ctx == r.hctx || !errors.Is(ctx.Err(), context.DeadlineExceeded) || r.hctx.Err() != nil {
		return false
	}
	r.c.timedOut.Add(1)
	return true
}

func (r *run) wrapTimeout(err error) error {
	return fmt.Errorf("%w (%v, WithAttemptTimeout): %w", ErrAttemptTimeout, r.c.cfg.attemptTimeout, err)
}

// resume takes t up again after its pause: drops it if the source no
// longer owns it, releases it to an [effects.Releaser] source (after a
// failure, for a delivery without an Ordering: a released delivery would
// lose its turn), or makes it ready to be attempted in place.
func (r *run) resume(t *sched.Task) {
	if !r.owns(t) {
		keep := r.s.Settle([]*sched.Task{t}, func(int, bool) (sched.Outcome, time.Duration) {
			r.c.dropped.Add(1)
			r.unpark(t)
			return sched.Finished, 0
		})
		if keep != nil {
			r.s.Ready(keep)
		}
		return
	}
	if rel, ok := r.c.src.(effects.Releaser); ok && !t.Ordered() && !t.Waiting {
		err := rel.Release(r.hctx, t.Delivery)
		if err == nil {
			r.c.released.Add(1)
			r.unpark(t)
			r.s.Forget(t)
			return
		}
		if !errors.Is(err, effects.ErrNotReleased) {
			r.failed(t, 0, fmt.Errorf("release for redelivery failed; retrying in place: %w", err))
		}
	}
	r.s.Ready(t)
}

// decide settles t's attempt that returned err: it acks, drops, retries
// after a pause, waits for another attempt's lease, dead-letters, parks,
// or stops the run. behind: an earlier delivery of t's Ordering in the
// same batch is to be retried. kind is the outcome, in the words of the
// events: applied, retried, in_flight, dead_lettered or failed.
func (r *run) decide(t *sched.Task, err error, took time.Duration, behind bool) (out sched.Outcome, delay time.Duration, kind effects.EventKind) {
	c := r.c
	wasParked := t.Parked
	t.Parked, t.Waiting = false, false
	out, kind = sched.Finished, effects.EventFailed
	switch {
	case err == nil:
		kind = effects.EventApplied
		r.ack(t)
	case err == errNotOwned:
		c.dropped.Add(1)
	case effects.ClassOf(err) == effects.InvalidConfig:
		r.failedLevel(t, took, err, slog.LevelError, "consume.Consumer: configuration error; stopping")
		r.halt(fmt.Errorf("consume.Consumer: stopped by a configuration error; delivery %q left unacked: %w", ratelog.Bound(t.Delivery.ID), err))
	case r.ctx.Err() != nil:
		if !behind {
			r.failed(t, took, fmt.Errorf("attempt %d failed during shutdown; left unacked for redelivery: %w", t.Attempt, err))
		}
	case behind:
		t.Attempt-- // not in its turn: this attempt does not count
		out = sched.Wait
	default:
		out, delay, kind = r.failure(t, err, took, wasParked)
	}
	switch {
	case wasParked && !t.Parked:
		c.parked.Add(-1)
	case !wasParked && t.Parked:
		c.parked.Add(1)
	}
	return out, delay, kind
}

// failure decides about t's attempt that failed with err, in its turn
// and before shutdown: a wait for another attempt's lease, a retry within
// the budget, or giving up.
func (r *run) failure(t *sched.Task, err error, took time.Duration, wasParked bool) (sched.Outcome, time.Duration, effects.EventKind) {
	c := r.c
	class := effects.ClassOf(err)
	if class == effects.Retryable && errors.Is(err, effects.ErrInFlight) {
		if delay, ok := r.inFlightWait(t, err); ok {
			c.inFlight.Add(1)
			r.report(effects.EventInFlight, t, took, err, slog.LevelInfo, "consume.Consumer: another attempt holds the key; waiting")
			t.Attempt-- // a wait, not a failed attempt
			t.Waiting = true
			return sched.Retry, delay, effects.EventInFlight
		}
	}
	exhausted := c.cfg.maxAttempts > 0 && t.Attempt >= c.cfg.maxAttempts
	if class != effects.Permanent && !exhausted {
		c.retried.Add(1)
		r.report(effects.EventRetried, t, took, err, slog.LevelInfo, "consume.Consumer: attempt failed; retrying")
		return sched.Retry, c.cfg.retryDelay(t.Attempt, err), effects.EventRetried
	}
	why := fmt.Sprintf("gave up after %d attempts", t.Attempt)
	if class == effects.Permanent {
		why = "permanent error"
	}
	if c.cfg.deadLetter == nil {
		err = fmt.Errorf("%s, no dead-letter hook (WithoutDeadLetter); parked, retrying every %v: %w", why, c.cfg.maxBackoff, err)
	} else {
		herr := r.deadLetter(t, err)
		switch {
		case herr == nil:
			c.deadLettered.Add(1)
			r.report(effects.EventDeadLettered, t, took, err, slog.LevelWarn, "consume.Consumer: delivery dead-lettered")
			r.ack(t)
			return sched.Finished, 0, effects.EventDeadLettered
		case effects.ClassOf(herr) == effects.InvalidConfig:
			herr = fmt.Errorf("dead-letter hook: %w", herr)
			r.failedLevel(t, took, herr, slog.LevelError, "consume.Consumer: configuration error; stopping")
			r.halt(fmt.Errorf("consume.Consumer: stopped by a configuration error; delivery %q left unacked: %w", ratelog.Bound(t.Delivery.ID), herr))
			return sched.Finished, 0, effects.EventFailed
		}
		err = fmt.Errorf("%s, and the dead-letter hook failed (%w); parked, retrying every %v: %w", why, herr, c.cfg.maxBackoff, err)
	}
	t.Parked = true
	level, msg := slog.LevelWarn, "consume.Consumer: delivery parked; its Ordering waits"
	if wasParked {
		level, msg = slog.LevelDebug, "consume.Consumer: parked delivery failed again"
	}
	r.failedLevel(t, took, err, level, msg)
	return sched.Retry, c.cfg.backoff(0), effects.EventFailed
}

// inFlightWait returns the pause before the next attempt at t, whose
// attempt answered ErrInFlight (err), and whether t may still wait for
// another attempt's lease without the attempt counting.
func (r *run) inFlightWait(t *sched.Task, err error) (time.Duration, bool) {
	limit := r.c.cfg.inFlightWait
	if limit <= 0 {
		return 0, false
	}
	now := time.Now()
	if t.InFlightSince.IsZero() {
		t.InFlightSince = now
	}
	if now.Sub(t.InFlightSince) >= limit {
		return 0, false
	}
	t.InFlightWaits++
	delay := r.c.cfg.backoff(t.InFlightWaits)
	if rest, ok := effects.RetryAfter(err); ok && rest < delay {
		delay = rest
	}
	return delay, true
}

// deadLetter hands t to the dead-letter hook, under the attempt's time
// limit, recovering a panic as the hook's failure. The delivery the hook
// gets carries the attempts made, counted as WithMaxAttempts counts them
// (the source's earlier ones included), so that the hook can record them.
func (r *run) deadLetter(t *sched.Task, cause error) (err error) {
	ctx, cancel := r.attemptContext()
	defer cancel()
	defer effects.Recover("consume dead-letter hook", &err)
	d := t.Delivery
	if t.Attempt > d.Attempt {
		d.Attempt = t.Attempt
	}
	return r.c.cfg.deadLetter(ctx, d, cause)
}

// unpark counts t, which leaves the run without a decision, out of the
// parked deliveries.
func (r *run) unpark(t *sched.Task) {
	if t.Parked {
		t.Parked = false
		r.c.parked.Add(-1)
	}
}

// ack acks t's delivery. A failed Ack is reported, not retried: the
// delivery will be delivered again and its idempotent handler replays.
func (r *run) ack(t *sched.Task) {
	if err := r.c.src.Ack(r.hctx, t.Delivery); err != nil {
		r.failed(t, 0, fmt.Errorf("ack after success failed; the source will deliver again and the handler must replay: %w", err))
		return
	}
	r.c.acked.Add(1)
}

func (r *run) failed(t *sched.Task, took time.Duration, err error) {
	r.failedLevel(t, took, err, slog.LevelWarn, "consume.Consumer: delivery failed; kept unacked")
}

func (r *run) failedLevel(t *sched.Task, took time.Duration, err error, level slog.Level, msg string) {
	r.c.fail.Add(1)
	r.report(effects.EventFailed, t, took, err, level, msg)
}

// report reports an event to the observer, or, without one, logs it to
// slog.Default() (rate-limited) at level with msg.
func (r *run) report(kind effects.EventKind, t *sched.Task, took time.Duration, err error, level slog.Level, msg string) {
	r.reportEvent(effects.Event{Kind: kind, DeliveryID: t.Delivery.ID, Attempt: t.Attempt, Duration: took, Err: err}, level, msg)
}

// reportEvent reports ev to the observer, or, without one, logs it
// (rate-limited) at level with msg: the delivery id bounded
// (ratelog.Bound), the class in the words of the dead-letter header
// (ratelog.Class).
func (r *run) reportEvent(ev effects.Event, level slog.Level, msg string) {
	err := ev.Err
	if o := r.c.cfg.observer; o != nil {
		o.Observe(r.hctx, ev)
		return
	}
	attrs := []slog.Attr{
		slog.String("delivery_id", ratelog.Bound(ev.DeliveryID)),
		slog.Int("attempt", ev.Attempt),
		slog.String("class", ratelog.Class(err)),
		slog.Any("error", err),
	}
	var pe *effects.PanicError
	if level >= slog.LevelWarn && errors.As(err, &pe) {
		attrs = append(attrs, slog.String("stack", string(pe.Stack)))
	}
	r.c.log.Log(r.hctx, level, msg, attrs...)
}

// maxRetryAfter caps the pause an error's [effects.RetryAfter] asks for
// (see [WithBackoff]).
const maxRetryAfter = 5 * time.Minute

// retryDelay returns the pause after failed attempt number attempt, whose
// error was err: the backoff, or longer when err asks to wait longer
// (capped by maxRetryAfter).
func (c *config) retryDelay(attempt int, err error) time.Duration {
	delay := c.backoff(attempt)
	if wait, ok := effects.RetryAfter(err); ok && !errors.Is(err, effects.ErrInFlight) {
		delay = max(delay, min(wait, maxRetryAfter))
	}
	return delay
}

// backoff returns the pause after failed attempt number attempt (from 1);
// attempt 0 means the longest pause. See [WithBackoff].
func (c *config) backoff(attempt int) time.Duration {
	return retry.Backoff{Min: c.minBackoff, Max: c.maxBackoff}.Delay(attempt)
}
