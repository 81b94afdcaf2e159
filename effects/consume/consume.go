package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
	"effectively.dev/internal/ratelog"
)

// Handler handles one delivery: it does the delivery's side effects, each
// idempotent under a key derived from effects.Delivery.ID (a [Plan], an [Effect]),
// and returns nil once they are done, that is committed by their owners.
// The [Consumer] acks the delivery only after that; an error means "not
// done, do not ack".
//
// ctx is cancelled only when the consumer's shutdown grace period expires
// (see [WithShutdownGrace]), not when shutdown starts, so a handler that is
// running when shutdown begins can finish its work. A handler may be called
// again for the same delivery (a retry, a redelivery after a crash) and must
// therefore be idempotent; that is what package effects is for.
type Handler func(ctx context.Context, d effects.Delivery) error

// BatchHandler handles several deliveries at once (see [WithBatch]), for
// example by claiming all their keys and writing all their effects in one
// database transaction. It returns one error per delivery, in the order of
// ds: nil means that delivery's effects are done and it may be acked; a
// non-nil error is classified and retried exactly as a [Handler]'s error
// would be. A slice of the wrong length fails every delivery of the batch
// with [ErrBatchResults].
//
// ds may hold a run of consecutive deliveries with the same non-empty
// Ordering (all of a Kafka partition's records that are waiting, up to the
// batch size); they are in their Ordering's order in ds, though not
// necessarily next to each other, so a handler that applies ds in order, or
// commits it all at once, keeps that order. In package postgres, ApplyBatch
// (one transaction claims and writes the whole batch, in order) and
// BatchErrors make the body of one. When a delivery fails and another of
// its Ordering after it in ds succeeded, the later one's effects are done
// and it is acked; if the order of effects matters even then, fail the
// rest of the run too: those deliveries are tried again after the failed
// one, and these attempts do not count against their budget.
type BatchHandler func(ctx context.Context, ds []effects.Delivery) []error

// Consumer errors.
var (
	// ErrBatchResults is the error every delivery of a batch gets when a
	// [BatchHandler] returned a slice whose length differs from the batch's.
	ErrBatchResults = errors.New("batch handler returned the wrong number of results")

	// ErrRunning is returned by [Consumer.Run] while another Run
	// of the same Consumer is in progress.
	ErrRunning = errors.New("consumer is already running")
)

// Defaults of a [Consumer], used when the matching option is not given.
const (
	// DefaultConcurrency is how many handlers run at once.
	DefaultConcurrency = 8
	// DefaultMaxAttempts is how many attempts precede the dead-letter hook.
	DefaultMaxAttempts = 10
	// DefaultMinBackoff is the first pause between attempts.
	DefaultMinBackoff = 100 * time.Millisecond
	// DefaultMaxBackoff is the longest pause between attempts.
	DefaultMaxBackoff = 30 * time.Second
	// DefaultShutdownGrace is how long running handlers may finish after
	// Run's context is cancelled.
	DefaultShutdownGrace = 10 * time.Second
	// DefaultMaxPending bounds the deliveries taken and not yet finished.
	DefaultMaxPending = 1024
)

// Option configures a [Consumer]; see [New].
type Option func(*config)

type config struct {
	concurrency            int
	maxAttempts            int
	minBackoff, maxBackoff time.Duration
	deadLetter             func(ctx context.Context, d effects.Delivery, err error) error
	observer               effects.Observer
	grace                  time.Duration
	maxPending             int
	maxPendingSet          bool

	batchSet    bool
	batchSize   int
	batchLinger time.Duration
	batch       BatchHandler
}

// WithConcurrency sets how many handlers run at the same time (default
// [DefaultConcurrency], 8). With [WithBatch], it is how many batches run at
// the same time. Deliveries with the same Ordering never run concurrently
// whatever n is, so a Kafka topic with p partitions keeps at most p handlers
// busy. n must be at least 1.
func WithConcurrency(n int) Option {
	return func(c *config) { c.concurrency = n }
}

// WithMaxAttempts sets how many times the handler is tried for one
// delivery before the delivery goes to the dead-letter hook (default
// [DefaultMaxAttempts], 10). 0 retries forever (errors marked permanent
// still go to the hook at once). n must not be negative.
func WithMaxAttempts(n int) Option {
	return func(c *config) { c.maxAttempts = n }
}

// WithBackoff sets the pause between attempts: it starts at min and doubles
// per attempt up to max, and each pause is drawn at random between half and
// all of that ceiling, so deliveries that failed together do not retry in
// lockstep. Defaults: [DefaultMinBackoff] (100 ms) and [DefaultMaxBackoff]
// (30 s); with the default 10 attempts a delivery is dead-lettered after
// about 25 to 50 seconds of failures. A delivery that can neither succeed
// nor be dead-lettered is retried every max. 0 < min <= max.
func WithBackoff(min, max time.Duration) Option {
	return func(c *config) { c.minBackoff, c.maxBackoff = min, max }
}

// WithDeadLetter sets the hook that takes a delivery the consumer gives up
// on: after [WithMaxAttempts] failed attempts, or at once when the error is
// permanent ([effects.ErrKeyReused], [effects.ErrInvalidKey], [effects.ErrPoison]). err is the last
// attempt's error. The hook typically writes the delivery to a dead-letter
// topic or table; it must be idempotent, because a crash between the hook
// and the ack calls it again after the redelivery.
//
// If the hook returns nil, the consumer acks the delivery: it is handled,
// by the hook. If it returns an error, the delivery is not acked and the
// consumer keeps it, retrying the handler (and, on failure, the hook) every
// max backoff, reporting each round as [effects.EventFailed].
//
// Without a hook, nothing is ever dropped: a delivery the consumer gives
// up on stays unacked and is retried every max backoff, as above, and the
// deliveries behind it with the same Ordering wait. See [Consumer] for why.
func WithDeadLetter(f func(ctx context.Context, d effects.Delivery, err error) error) Option {
	return func(c *config) { c.deadLetter = f }
}

// WithObserver reports every failed attempt to o: [effects.EventRetried] when
// another attempt follows, [effects.EventDeadLettered] when the dead-letter hook
// took the delivery, [effects.EventFailed] otherwise (the delivery stays unacked),
// and effects.EventFailed when an Ack fails. Events carry DeliveryID, Attempt (the
// failed attempt's number, from 1), Duration (the handler's run time) and
// Err. Successful attempts are counted in [Consumer.Stats], not observed.
//
// Without an observer (or with a nil o), the consumer logs the same events
// to slog.Default(), rate-limited (a burst of 10 lines, then about one a
// second, with a count of the lines held back): retries at level Info,
// failures and dead letters at Warn, each with delivery_id, attempt and
// error. To silence them, pass an observer that does nothing.
func WithObserver(o effects.Observer) Option {
	return func(c *config) { c.observer = o }
}

// WithShutdownGrace sets how long handlers that are running when Run's
// context is cancelled may take to finish (default
// [DefaultShutdownGrace], 10 s). Their context is cancelled when the grace
// expires. 0 cancels it at once. d must not be negative.
func WithShutdownGrace(d time.Duration) Option {
	return func(c *config) { c.grace = d }
}

// WithMaxPending bounds how many deliveries the consumer holds: taken
// from the source and not yet acked or given up, whether running, waiting
// for a worker, waiting for a retry, or queued behind an earlier delivery
// with the same Ordering. When n are held, it stops calling Next until one
// finishes. The default, [DefaultMaxPending] (1024, or more with
// [WithBatch]: enough for every worker to fill a batch), lets the other
// Orderings go on while some are stuck behind a failing delivery, as long
// as the source bounds what one Ordering may hold (kafka.Source does, per
// partition: kafka.WithMaxPendingPerPartition). The cost is memory: n
// deliveries' bodies. n must be at least 1.
func WithMaxPending(n int) Option {
	return func(c *config) { c.maxPending, c.maxPendingSet = n, true }
}

// WithBatch makes the consumer hand deliveries to h in batches of up to
// size, instead of one by one to a [Handler] (pass a nil Handler to
// [New]).
//
// Order: a batch takes the deliveries whose turn it is, each with the run
// of deliveries of its Ordering waiting behind it (consecutive, in order,
// as many as fit), so a Kafka partition's records are batched together and
// in offset order; see [BatchHandler] for what the handler must keep.
// Per-Ordering order holds as with a Handler: a delivery is in a batch only
// with, or after, every earlier delivery of its Ordering; deliveries
// without an Ordering batch freely.
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
func WithBatch(size int, linger time.Duration, h BatchHandler) Option {
	return func(c *config) {
		c.batchSet, c.batchSize, c.batchLinger, c.batch = true, size, linger, h
	}
}

// Stats counts what a [Consumer] did, over all its runs.
type Stats struct {
	// Delivered counts deliveries taken from the source.
	Delivered int64
	// Acked counts successful Acks: after the handler returned nil, or
	// after the dead-letter hook took the delivery.
	Acked int64
	// Retried counts failed attempts that were followed by another attempt
	// within the attempt budget ([effects.EventRetried]).
	Retried int64
	// DeadLettered counts deliveries the dead-letter hook took
	// ([effects.EventDeadLettered]).
	DeadLettered int64
	// Failed counts [effects.EventFailed]: failed attempts after which the delivery
	// stayed unacked (no dead-letter hook, or the hook failed, or shutdown
	// had begun), and failed Acks. It is the number to alert on.
	Failed int64
	// Released counts deliveries handed back to a [effects.Releaser] source for
	// redelivery instead of retried in place: retries within the attempt
	// budget (also counted in Retried), and deliveries given up on and
	// kept, whose hook failed or is missing (also counted in Failed).
	Released int64
	// Dropped counts deliveries the consumer let go unhandled because the
	// source no longer owned them ([effects.OwnershipChecker]): a revoked
	// partition, an expired acquisition lock. Their new owner handles them.
	Dropped int64
}

// Consumer takes deliveries from a [effects.Source], hands each to a [Handler], and
// acks it only after the handler returned nil: side effect first, then ack.
// A delivery whose handler failed is never acked; the consumer retries it in
// place (it keeps the delivery, and its turn in its Ordering, instead of
// re-publishing it), after an exponential jittered backoff, and after
// [WithMaxAttempts] attempts (or at once, for a permanent error) hands it to
// the dead-letter hook, acking it only if the hook returns nil.
//
// Which errors are permanent: those wrapping [effects.ErrKeyReused],
// [effects.ErrInvalidKey] or [effects.ErrPoison]; retrying the same key cannot succeed.
// Every other error is retried up to the budget, including errors
// [effects.Retryable] would call permanent because no adapter classified them: a
// handler's error is often the application's own (a 503 from a downstream
// service) and may heal, and the budget bounds the cost when it does not.
//
// Concurrency is bounded ([WithConcurrency]); deliveries with the same
// non-empty Ordering are handled one at a time in the order Next returned
// them, a retried delivery holding back those behind it; deliveries with
// different or empty Orderings run concurrently. The consumer holds at most
// [WithMaxPending] deliveries taken from the source and not yet finished.
//
// What it never does: ack a delivery whose handler failed or was
// interrupted, ack a delivery twice, or drop one the source still owns (a
// source that is an [effects.OwnershipChecker] may say a delivery is no longer its
// own, a revoked partition: the consumer then drops it before its next
// attempt, counted in [Stats].Dropped, and the new owner handles
// it). When a delivery can
// neither succeed nor be dead-lettered (no hook, or the hook fails), it
// stays unacked and is retried every max backoff, each round reported as
// [effects.EventFailed] and counted in [Stats].Failed, rather than stopping
// the consumer: after N failures the cause is as often an outage (the
// database is down) as a poison message, and stopping would turn every
// outage longer than the retry budget into a crash loop that also halts
// the healthy Orderings; retrying slowly resumes by itself when the outage
// ends, and a Kafka-like source would not commit past the delivery anyway.
// Configure [WithDeadLetter] to move poison messages aside. Failures are
// visible by default: without [WithObserver], they are logged to
// slog.Default(), rate-limited.
//
// An Ack that fails is reported as effects.EventFailed and not retried: the source
// delivers the message again and the idempotent handler replays it. With
// package kafka this happens to deliveries of a partition revoked while they
// were queued or running (kafka.ErrRevoked): the partition's new owner
// handles them too.
//
// Attempts are counted from [effects.Delivery].Attempt when the source knows it (a
// share group's delivery count), so the budget holds across processes. With
// a [effects.Releaser] source, a delivery without an Ordering that is to be retried
// is released back to the broker after its backoff instead of retried in
// place (counted in [Stats].Released); if the release fails it is
// retried in place.
//
// The consumer does not recover panics: a panicking handler crashes the
// process, and its delivery, unacked, is delivered again after the restart.
//
// A Consumer is safe for concurrent use; Run runs one at a time.
type Consumer struct {
	src effects.Source
	h   Handler
	cfg config

	running                                       atomic.Bool
	delivered, acked, retried, deadLettered, fail atomic.Int64
	released, dropped                             atomic.Int64
	log                                           ratelog.Limiter // without an observer
}

// New returns a consumer of src that hands every delivery to h
// (or, with [WithBatch], batches to the batch handler; then h must be nil).
// It returns a *[effects.ConfigError] for a nil source, a missing or doubled
// handler, or an invalid option. Nil options are ignored.
//
// Defaults: 8 concurrent handlers, 10 attempts, backoff from 100 ms to 30 s,
// no dead-letter hook, failures logged to slog.Default() (no observer),
// 10 s shutdown grace, 1024 pending deliveries.
func New(src effects.Source, h Handler, opts ...Option) (*Consumer, error) {
	cfg := config{
		concurrency: DefaultConcurrency,
		maxAttempts: DefaultMaxAttempts,
		minBackoff:  DefaultMinBackoff,
		maxBackoff:  DefaultMaxBackoff,
		grace:       DefaultShutdownGrace,
	}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	bad := func(option, format string, args ...any) (*Consumer, error) {
		return nil, &effects.ConfigError{Op: "consume.New", Option: option, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case src == nil:
		return bad("source", "nil source")
	case cfg.batchSet && cfg.batch == nil:
		return bad("WithBatch", "nil batch handler")
	case cfg.batchSet && h != nil:
		return bad("handler", "both a Handler and a WithBatch handler; pass a nil Handler with WithBatch")
	case !cfg.batchSet && h == nil:
		return bad("handler", "nil handler (pass one, or use WithBatch)")
	case cfg.concurrency < 1:
		return bad("WithConcurrency", "%d handlers; need at least 1", cfg.concurrency)
	case cfg.maxAttempts < 0:
		return bad("WithMaxAttempts", "%d attempts; need 0 (retry forever) or more", cfg.maxAttempts)
	case cfg.minBackoff <= 0:
		return bad("WithBackoff", "min %v; need a positive pause", cfg.minBackoff)
	case cfg.maxBackoff < cfg.minBackoff:
		return bad("WithBackoff", "max %v is below min %v", cfg.maxBackoff, cfg.minBackoff)
	case cfg.grace < 0:
		return bad("WithShutdownGrace", "negative grace %v", cfg.grace)
	case cfg.maxPendingSet && cfg.maxPending < 1:
		return bad("WithMaxPending", "%d deliveries; need at least 1", cfg.maxPending)
	case cfg.batchSet && cfg.batchSize < 1:
		return bad("WithBatch", "batch size %d; need at least 1", cfg.batchSize)
	case cfg.batchSet && cfg.batchLinger < 0:
		return bad("WithBatch", "negative linger %v", cfg.batchLinger)
	}
	if !cfg.maxPendingSet {
		cfg.maxPending = DefaultMaxPending
		if cfg.batchSet {
			cfg.maxPending = max(DefaultMaxPending, (cfg.concurrency+1)*cfg.batchSize)
		}
	}
	return &Consumer{src: src, h: h, cfg: cfg}, nil
}

// Stats returns the consumer's counters.
func (c *Consumer) Stats() Stats {
	return Stats{
		Delivered:    c.delivered.Load(),
		Acked:        c.acked.Load(),
		Retried:      c.retried.Load(),
		DeadLettered: c.deadLettered.Load(),
		Failed:       c.fail.Load(),
		Released:     c.released.Load(),
		Dropped:      c.dropped.Load(),
	}
}

// Run consumes until ctx is done or the source fails, and then shuts down
// gracefully: it stops calling Next, starts no new attempt and no retry,
// and waits for the handlers (and dead-letter hooks) that are running; their
// context is cancelled when the shutdown grace expires. It acks those that
// succeed, never one that failed or was interrupted; deliveries it took but
// did not finish stay unacked, and the source delivers them again (to this
// consumer's next Run, or after a restart). Run returns only after every
// goroutine it started has ended, so a handler that ignores its context
// delays it.
//
// Run returns nil after a shutdown caused by ctx. When Next fails while ctx
// is not done, Run shuts down the same way and returns that error, wrapped
// (errors.Is and errors.As see it): the consumer does not retry a failing
// source. It returns [ErrRunning] if another Run is in progress.
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

	limit := c.cfg.maxPending
	r := &run{
		c:          c,
		ctx:        runCtx,
		hctx:       hctx,
		ready:      make(chan *task, limit),
		slots:      make(chan struct{}, limit),
		lanes:      map[string]*lane{},
		timers:     map[*task]*time.Timer{},
		collecting: map[*collector]struct{}{},
	}
	for range c.cfg.concurrency {
		r.workers.Add(1)
		if c.cfg.batchSet {
			go r.batchWorker()
		} else {
			go r.worker()
		}
	}

	fatal := r.fetch()

	// Shut down: stop taking work, give the running handlers the grace.
	stop()
	grace := time.AfterFunc(c.cfg.grace, expire)
	defer grace.Stop()
	r.workers.Wait()
	r.mu.Lock()
	for t, tm := range r.timers {
		if tm.Stop() {
			r.timersLive.Done()
		}
		delete(r.timers, t)
	}
	r.mu.Unlock()
	r.timersLive.Wait()
	return fatal
}

// task is one delivery being handled.
type task struct {
	d       effects.Delivery
	attempt int   // attempts counted
	lane    *lane // its Ordering's lane; nil without an Ordering
	done    bool  // finished: to be dropped from its lane
}

// lane holds the unfinished deliveries of one Ordering, in order. Only a
// run at its front is ever dispatched: q[:out] are ready, collected into a
// batch, running, or (q[0] alone) waiting for a retry; the others wait.
type lane struct {
	key string
	q   []*task
	out int
	col *collector // the batch collecting q[:out], while it collects
}

// collector is a batch being collected.
type collector struct {
	size  int
	tasks []*task       // guarded by run.mu
	lanes []*lane       // whose run is in tasks
	wake  chan struct{} // a delivery joined, or none can join any more (capacity 1)
}

func (col *collector) signal() {
	select {
	case col.wake <- struct{}{}:
	default:
	}
}

// run is the state of one Consumer.Run.
//
// Every delivery taken from the source holds a slot until it is finished
// (acked, or given up for good), and is in exactly one place: the ready
// channel, a batch being collected, a worker, a retry timer, or waiting in
// its Ordering's lane behind the run that is out. Hence ready, whose
// capacity is the number of slots, never blocks a sender.
type run struct {
	c    *Consumer
	ctx  context.Context // done: shutting down
	hctx context.Context // for handlers, hooks and acks; done when the grace expires

	ready chan *task    // heads of lanes, and deliveries without Ordering, whose turn it is
	slots chan struct{} // one per delivery taken and not finished

	// fetchBlocked: the fetch loop waits for a slot, so no delivery can
	// arrive until one finishes.
	fetchBlocked atomic.Bool

	mu         sync.Mutex
	lanes      map[string]*lane
	timers     map[*task]*time.Timer   // armed retries
	collecting map[*collector]struct{} // batches that linger

	workers    sync.WaitGroup
	timersLive sync.WaitGroup // retry timers that may still run their function
}

// fetch takes deliveries from the source until the run's context is done
// (it returns nil) or Next fails (it returns the error).
func (r *run) fetch() error {
	for {
		select {
		case r.slots <- struct{}{}:
		case <-r.ctx.Done():
			return nil
		default:
			r.blockFetch(true)
			select {
			case r.slots <- struct{}{}:
			case <-r.ctx.Done():
				return nil
			}
			r.blockFetch(false)
		}
		d, err := r.c.src.Next(r.ctx)
		if err != nil {
			<-r.slots
			if r.ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("consume.Consumer: source failed, consumer stopped: %w", err)
		}
		r.c.delivered.Add(1)
		if r.ctx.Err() != nil {
			return nil // shutting down: left unacked, delivered again
		}
		t := &task{d: d}
		if d.Attempt > 1 {
			t.attempt = d.Attempt - 1 // the source's earlier attempts count
		}
		r.dispatch(t)
	}
}

// blockFetch records whether the fetch loop waits for a slot; when it
// starts waiting, lingering batches stop: nothing can join them.
func (r *run) blockFetch(blocked bool) {
	r.fetchBlocked.Store(blocked)
	if !blocked {
		return
	}
	r.mu.Lock()
	for col := range r.collecting {
		col.signal()
	}
	r.mu.Unlock()
}

// dispatch makes a new delivery ready, queues it in its Ordering's lane,
// or adds it to the batch that is collecting the run just before it.
func (r *run) dispatch(t *task) {
	if t.d.Ordering == "" {
		r.ready <- t
		return
	}
	r.mu.Lock()
	l := r.lanes[t.d.Ordering]
	if l == nil {
		l = &lane{key: t.d.Ordering}
		r.lanes[l.key] = l
	}
	t.lane = l
	l.q = append(l.q, t)
	send := false
	switch {
	case l.out == 0:
		l.out = 1
		send = true
	case l.col != nil && l.out == len(l.q)-1 && len(l.col.tasks) < l.col.size:
		l.col.tasks = append(l.col.tasks, t)
		l.out++
		l.col.signal()
	}
	r.mu.Unlock()
	if send {
		r.ready <- t
	}
}

// retryAfter makes t ready again after delay, unless shutdown begins first.
func (r *run) retryAfter(t *task, delay time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		return // left unacked, delivered again
	}
	r.timersLive.Add(1)
	r.timers[t] = time.AfterFunc(delay, func() {
		defer r.timersLive.Done()
		r.mu.Lock()
		delete(r.timers, t)
		r.mu.Unlock()
		if r.ctx.Err() == nil {
			r.resume(t)
		}
	})
}

// resume takes t up again after its backoff: drops it if the source no
// longer owns it, releases it to a [effects.Releaser] source (deliveries without an
// Ordering only: a released delivery would lose its turn), or makes it
// ready to retry in place.
func (r *run) resume(t *task) {
	if !r.owns(t) {
		r.settle([]*task{t}, []error{errNotOwned}, 0)
		return
	}
	if rel, ok := r.c.src.(effects.Releaser); ok && t.lane == nil {
		err := rel.Release(r.hctx, t.d)
		if err == nil {
			r.c.released.Add(1)
			<-r.slots
			return
		}
		if !errors.Is(err, effects.ErrNotReleased) {
			r.failed(t, 0, fmt.Errorf("release for redelivery failed; retrying in place: %w", err))
		}
	}
	r.ready <- t
}

// errNotOwned settles a delivery the source no longer owns: dropped.
var errNotOwned = errors.New("effects: delivery no longer owned by this source")

// owns reports whether the source still owns t's delivery (true for a
// source that does not say).
func (r *run) owns(t *task) bool {
	oc, ok := r.c.src.(effects.OwnershipChecker)
	return !ok || oc.Owns(t.d)
}

// worker hands ready deliveries to the Handler one at a time.
func (r *run) worker() {
	defer r.workers.Done()
	var next *task // the settled delivery's successor in its lane, kept
	for {
		t := next
		if t == nil {
			select {
			case <-r.ctx.Done():
				return
			case t = <-r.ready:
			}
		}
		if r.ctx.Err() != nil {
			return // not started: left unacked
		}
		if !r.owns(t) {
			next = r.settleKeep([]*task{t}, []error{errNotOwned}, 0)
			continue
		}
		t.attempt++
		start := time.Now()
		err := r.c.h(r.hctx, t.d)
		next = r.settleKeep([]*task{t}, []error{err}, time.Since(start))
	}
}

// batchWorker collects batches for the BatchHandler: ready deliveries, each
// with the run of its lane behind it.
func (r *run) batchWorker() {
	defer r.workers.Done()
	for {
		var first *task
		select {
		case <-r.ctx.Done():
			return
		case first = <-r.ready:
		}
		batch := r.collect(first)
		if r.ctx.Err() != nil {
			return // not started: left unacked
		}
		errs := make([]error, len(batch))
		ds := make([]effects.Delivery, 0, len(batch))
		var owned []int // batch indexes of ds
		for i, t := range batch {
			if !r.owns(t) {
				errs[i] = errNotOwned
				continue
			}
			t.attempt++
			ds = append(ds, t.d)
			owned = append(owned, i)
		}
		var took time.Duration
		if len(ds) > 0 {
			start := time.Now()
			res := r.c.cfg.batch(r.hctx, ds)
			took = time.Since(start)
			if len(res) != len(ds) {
				err := fmt.Errorf("%w: %d results for %d deliveries", ErrBatchResults, len(res), len(ds))
				res = make([]error, len(ds))
				for i := range res {
					res[i] = err
				}
			}
			for j, i := range owned {
				errs[i] = res[j]
			}
		}
		r.settle(batch, errs, took)
	}
}

// collect builds a batch from first: first's lane run, what else is ready,
// and, while the batch lingers, what joins it. It lingers only while a
// delivery can still arrive (the fetch loop is not waiting for a slot).
func (r *run) collect(first *task) []*task {
	size, linger := r.c.cfg.batchSize, r.c.cfg.batchLinger
	col := &collector{size: size, wake: make(chan struct{}, 1)}
	r.mu.Lock()
	r.takeLocked(col, first)
	r.mu.Unlock()
	full := func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(col.tasks) >= size
	}
	takeReady := func() {
		for !full() {
			select {
			case t := <-r.ready:
				r.mu.Lock()
				r.takeLocked(col, t)
				r.mu.Unlock()
				continue
			default:
			}
			return
		}
	}
	takeReady()
	if linger > 0 && !full() && !r.fetchBlocked.Load() {
		r.mu.Lock()
		r.collecting[col] = struct{}{}
		r.mu.Unlock()
		tm := time.NewTimer(linger)
	wait:
		for !full() && !r.fetchBlocked.Load() {
			select {
			case t := <-r.ready:
				r.mu.Lock()
				r.takeLocked(col, t)
				r.mu.Unlock()
			case <-col.wake:
			case <-tm.C:
				break wait
			case <-r.ctx.Done():
				break wait
			}
		}
		tm.Stop()
		// What became ready while the wait ended (the fetch loop's last
		// delivery, sent just before it blocked) joins too.
		takeReady()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.collecting, col)
	for _, l := range col.lanes {
		l.col = nil
	}
	return col.tasks
}

// takeLocked adds t to col, with as much of the run behind t in its lane
// as fits. t is a lane's head (or has no Ordering).
func (r *run) takeLocked(col *collector, t *task) {
	col.tasks = append(col.tasks, t)
	l := t.lane
	if l == nil {
		return
	}
	l.col = col
	col.lanes = append(col.lanes, l)
	for l.out < len(l.q) && len(col.tasks) < col.size {
		col.tasks = append(col.tasks, l.q[l.out])
		l.out++
	}
}

// outcome is what settling one attempt decided.
type outcome int

const (
	outDone  outcome = iota // acked or given up for good: release
	outRetry                // the lane's head, to try again after a pause
	outWait                 // behind a failure of its Ordering: attempted again in a later run
)

// settle decides what happens to the deliveries of one attempt (one, or a
// batch) after it returned errs: acks, retries and dead letters in each
// Ordering's order, then the lanes' next runs.
//
// In a lane's run, deliveries before the first failure are acked; the first
// failure is retried (or given up on, and then the next ones are treated
// the same way); after a failure that is retried, the run's other
// deliveries that succeeded are acked (their effects are done) and those
// that failed wait, without their attempt counted, to be attempted again
// behind it.
func (r *run) settle(tasks []*task, errs []error, took time.Duration) {
	if t := r.settleKeep(tasks, errs, took); t != nil {
		r.ready <- t
	}
}

// settleKeep is settle for a worker that goes on with the next delivery
// of the lane it just settled when no other delivery waits for a worker:
// it returns that delivery instead of putting it in line, so the lane
// goes on without a handoff to another goroutine (the loop a hand-written
// consumer runs per partition). It returns nil when it put everything in
// line.
func (r *run) settleKeep(tasks []*task, errs []error, took time.Duration) *task {
	outs := make([]outcome, len(tasks))
	delays := make([]time.Duration, len(tasks))
	var blocked map[*lane]bool // lanes whose run has a delivery to retry
	for i, t := range tasks {
		err := errs[i]
		if t.lane != nil && blocked[t.lane] {
			switch {
			case err == errNotOwned:
				r.c.dropped.Add(1)
				outs[i] = outDone
			case err == nil:
				r.ack(t)
				outs[i] = outDone
			case r.ctx.Err() != nil:
				outs[i] = outDone // shutting down: left unacked
			default:
				t.attempt-- // not in its turn: this attempt does not count
				outs[i] = outWait
			}
			continue
		}
		outs[i], delays[i] = r.settleOne(t, err, took)
		if outs[i] == outRetry && t.lane != nil {
			if blocked == nil {
				blocked = map[*lane]bool{}
			}
			blocked[t.lane] = true
		}
	}

	// The lanes: drop the finished deliveries, then put each lane's next
	// run in line (or leave the head to its retry timer).
	var next []*task
	r.mu.Lock()
	for i, t := range tasks {
		t.done = outs[i] == outDone
	}
	for i, t := range tasks {
		l := t.lane
		if l == nil || slices.ContainsFunc(tasks[:i], func(u *task) bool { return u.lane == l }) {
			continue // no lane, or visited
		}
		settled := 0
		for _, u := range tasks[i:] {
			if u.lane == l && u.done {
				settled++
			}
		}
		l.q = dropDone(l.q, settled)
		switch {
		case blocked[l]:
			l.out = 1 // q[0], waiting for its retry
		case len(l.q) == 0:
			l.out = 0
			delete(r.lanes, l.key)
		case r.ctx.Err() != nil:
			l.out = 0 // shutting down: dispatch nothing
		default:
			l.out = 1
			next = append(next, l.q[0])
		}
	}
	r.mu.Unlock()

	for i, t := range tasks {
		switch outs[i] {
		case outDone:
			<-r.slots
		case outRetry:
			r.retryAfter(t, delays[i])
		}
	}
	var keep *task
	if len(next) == 1 && len(r.ready) == 0 {
		keep, next = next[0], nil
	}
	for _, t := range next {
		r.ready <- t
	}
	return keep
}

// dropDone removes the n finished tasks from a lane's queue. They are
// usually its head (the run just settled): that costs a reslice, not a
// copy of everything queued behind them, and the scan stops once all n are
// gone.
func dropDone(q []*task, n int) []*task {
	k := 0
	for k < len(q) && k < n && q[k].done {
		k++
	}
	clear(q[:k])
	q, n = q[k:], n-k
	if n == 0 {
		return q
	}
	w := 0
	for i, u := range q {
		if n > 0 && u.done {
			n--
			continue
		}
		q[w] = q[i]
		w++
	}
	clear(q[w:])
	return q[:w]
}

// settleOne settles t's attempt that returned err: ack, retry after a
// pause, or give up (dead letter, or keep it and retry every max
// backoff).
func (r *run) settleOne(t *task, err error, took time.Duration) (outcome, time.Duration) {
	c := r.c
	if err == nil {
		r.ack(t)
		return outDone, 0
	}
	if err == errNotOwned {
		c.dropped.Add(1)
		return outDone, 0
	}
	if r.ctx.Err() != nil {
		r.failed(t, took, fmt.Errorf("attempt %d failed during shutdown; left unacked for redelivery: %w", t.attempt, err))
		return outDone, 0
	}
	exhausted := c.cfg.maxAttempts > 0 && t.attempt >= c.cfg.maxAttempts
	if !effects.Permanent(err) && !exhausted {
		c.retried.Add(1)
		r.observe(effects.EventRetried, t, took, err)
		return outRetry, c.cfg.backoff(t.attempt)
	}
	why := fmt.Sprintf("gave up after %d attempts", t.attempt)
	if effects.Permanent(err) {
		why = "permanent error"
	}
	if hook := c.cfg.deadLetter; hook != nil {
		herr := hook(r.hctx, t.d, err)
		if herr == nil {
			c.deadLettered.Add(1)
			r.observe(effects.EventDeadLettered, t, took, err)
			r.ack(t)
			return outDone, 0
		}
		err = fmt.Errorf("%s, and the dead-letter hook failed (%w); kept unacked, retrying every %v: %w",
			why, herr, c.cfg.maxBackoff, err)
	} else {
		err = fmt.Errorf("%s and no dead-letter hook; kept unacked, retrying every %v: %w",
			why, c.cfg.maxBackoff, err)
	}
	r.failed(t, took, err)
	return outRetry, c.cfg.backoff(0)
}

// ack acks t's delivery. A failed Ack is reported, not retried: the
// delivery will be delivered again and its idempotent handler replays.
func (r *run) ack(t *task) {
	if err := r.c.src.Ack(r.hctx, t.d); err != nil {
		r.failed(t, 0, fmt.Errorf("ack after success failed; the source will deliver again and the handler must replay: %w", err))
		return
	}
	r.c.acked.Add(1)
}

func (r *run) failed(t *task, took time.Duration, err error) {
	r.c.fail.Add(1)
	r.observe(effects.EventFailed, t, took, err)
}

// observe reports an event to the observer, or, without one, logs it to
// slog.Default() (rate-limited).
func (r *run) observe(kind effects.EventKind, t *task, took time.Duration, err error) {
	ev := effects.Event{Kind: kind, DeliveryID: t.d.ID, Attempt: t.attempt, Duration: took, Err: err}
	if o := r.c.cfg.observer; o != nil {
		o.Observe(r.hctx, ev)
		return
	}
	r.c.logDefault(r.hctx, ev)
}

// backoff returns the pause after failed attempt number attempt (from 1);
// attempt 0 means the longest pause. See [Backoff].
func (c *config) backoff(attempt int) time.Duration {
	return retry.Backoff{Min: c.minBackoff, Max: c.maxBackoff}.Delay(attempt)
}

// logDefault logs a failure event to slog.Default(), rate-limited: what
// a Consumer without an observer does, so that failures are visible.
func (c *Consumer) logDefault(ctx context.Context, ev effects.Event) {
	level, msg := slog.LevelWarn, "consume.Consumer: delivery failed; kept unacked"
	switch ev.Kind {
	case effects.EventRetried:
		level, msg = slog.LevelInfo, "consume.Consumer: attempt failed; retrying"
	case effects.EventDeadLettered:
		msg = "consume.Consumer: delivery dead-lettered"
	}
	c.log.Log(ctx, level, msg,
		slog.String("delivery_id", ev.DeliveryID),
		slog.Int("attempt", ev.Attempt),
		slog.Any("error", ev.Err))
}
