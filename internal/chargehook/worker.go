package chargehook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/internal/payment"
	"effectively.dev/kafka"
)

// Hops a delivery to the worker can come from. The first three are the
// record's origin (the pods stamp it); the others are deliveries of a
// record the worker had already been given.
const (
	hopRedelivery = "redelivery"     // after a crash between commit and ack
	hopFailover   = "after-failover" // after an attempt the failover broke
	hopRetry      = "retry"          // after any other failed attempt (a concurrent duplicate held the key)
)

// hops lists every hop in report order.
var hops = []string{hopFirst, hopSender, hopSib, hopRedelivery, hopFailover, hopRetry}

// errCrash is what the worker's handler returns when the schedule crashes
// it: the effects are committed, and the ack never happens.
var errCrash = errors.New("chargehook: worker crashed after the effects committed, before the ack")

// worker is the consumer side of one handler's run: an consume.Consumer
// over a kafka.Source, whose handler classifies each delivery, runs the
// handler, and injects the scheduled crash.
type worker struct {
	h        handler
	faults   map[string]Faults
	failover *failoverWindow
	// onDone is called once per event, when a delivery of it first
	// succeeds (or is dead-lettered).
	onDone func(eventID string)

	mu           sync.Mutex
	deliveries   map[string]int    // per hop
	absorbed     map[string]int    // per hop: deliveries that found everything done
	lastFailure  map[string]string // record id -> hop its next delivery counts under
	records      map[string]bool   // record ids handled (acked or dead-lettered)
	events       map[string]bool   // event ids finished
	crashed      map[string]bool   // events whose crash was injected
	deadLettered map[string]error
	errors       map[string]int // failed attempts, by a short cause
	handled      atomic.Int64   // records handled
}

func newWorker(h handler, faults map[string]Faults, fw *failoverWindow, onDone func(string)) *worker {
	return &worker{
		h: h, faults: faults, failover: fw, onDone: onDone,
		deliveries: map[string]int{}, absorbed: map[string]int{}, lastFailure: map[string]string{},
		records: map[string]bool{}, events: map[string]bool{}, crashed: map[string]bool{},
		deadLettered: map[string]error{}, errors: map[string]int{},
	}
}

// handle is the consume.Handler.
func (w *worker) handle(ctx context.Context, d effects.Delivery) error {
	rid := d.Headers[recID]
	w.mu.Lock()
	hop, again := w.lastFailure[rid]
	if !again {
		hop = d.Headers[recHop]
	}
	w.deliveries[hop]++
	w.mu.Unlock()

	ev, err := payment.Decode(d.Body) // poison: dead-lettered at once
	if err != nil {
		return err
	}
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	applied, err := w.h.handle(hctx, ev)
	cancel()
	if err != nil {
		w.failed(rid, err)
		return err
	}

	w.mu.Lock()
	if !applied {
		w.absorbed[hop]++
	}
	first := !w.events[ev.ID]
	w.events[ev.ID] = true
	crash := w.faults[ev.ID].Crash && !w.crashed[ev.ID]
	if crash {
		w.crashed[ev.ID] = true
		w.lastFailure[rid] = hopRedelivery
	} else {
		w.records[rid] = true
		w.handled.Add(1)
	}
	w.mu.Unlock()
	if first {
		w.onDone(ev.ID)
	}
	if crash {
		return errCrash
	}
	return nil
}

// failed notes why an attempt failed, for the hop its retry counts under.
func (w *worker) failed(rid string, err error) {
	cause := "other"
	switch {
	case errors.Is(err, effects.ErrInFlight):
		cause = "in flight"
	case errors.Is(err, effects.ErrAmbiguous):
		cause = "ambiguous"
	case errors.Is(err, effects.ErrTransient):
		cause = "transient"
	}
	hop := hopRetry
	if w.failover.open() {
		hop = hopFailover
	}
	w.mu.Lock()
	w.lastFailure[rid] = hop
	w.errors[cause]++
	w.mu.Unlock()
}

// deadLetter takes a delivery the consumer gave up on: it is counted, and
// acked (an event whose every copy was dead-lettered may be lost).
func (w *worker) deadLetter(_ context.Context, d effects.Delivery, err error) error {
	rid := d.Headers[recID]
	w.mu.Lock()
	w.deadLettered[rid] = err
	first := !w.records[rid]
	w.records[rid] = true
	evDone := w.events[d.ID]
	w.events[d.ID] = true
	w.mu.Unlock()
	if first {
		w.handled.Add(1)
	}
	if !evDone {
		w.onDone(d.ID)
	}
	return nil
}

// finished returns how many events the worker has finished.
func (w *worker) finished() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.events)
}

// consume runs an consume.Consumer over the topic until stop says so.
// stop is polled; it gets the number of records handled.
func (w *worker) consume(ctx context.Context, brokers []kgo.Opt, group, topic string, workers int, obs effects.Observer, stop func(handled int64) bool) (consume.Stats, error) {
	opts := append(append([]kgo.Opt(nil), brokers...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.FetchMaxWait(50*time.Millisecond),
	)
	src, err := kafka.NewSource(opts)
	if err != nil {
		return consume.Stats{}, err
	}
	defer src.Close()
	if obs == nil {
		// The demo counts failures itself (the injected crashes are
		// failures too): no log lines from the consumer's default.
		obs = effects.ObserverFunc(func(context.Context, effects.Event) {})
	}
	c, err := consume.New(src, w.handle,
		consume.WithConcurrency(workers),
		// A failover takes a second or two; a lease a few more. Retry
		// quickly, long enough to outlast both.
		consume.WithBackoff(10*time.Millisecond, 400*time.Millisecond),
		consume.WithMaxAttempts(80),
		consume.WithDeadLetter(w.deadLetter),
		consume.WithObserver(obs),
		consume.WithShutdownGrace(5*time.Second),
	)
	if err != nil {
		return consume.Stats{}, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-errc:
			if err == nil {
				err = ctx.Err()
			}
			return c.Stats(), fmt.Errorf("consumer stopped early: %w", err)
		case <-tick.C:
			if stop(w.handled.Load()) {
				cancel()
				err := <-errc
				return c.Stats(), err
			}
		}
	}
}

// failoverWindow tells the worker whether a failure falls into the
// failover: from the kill of the primary until a second after the standby
// accepted writes (pools find the new primary within that).
type failoverWindow struct {
	mu          sync.Mutex
	start, end  time.Time
	began, done bool
}

func (f *failoverWindow) open() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.began && (!f.done || time.Now().Before(f.end))
}

func (f *failoverWindow) begin() {
	f.mu.Lock()
	f.began, f.start = true, time.Now()
	f.mu.Unlock()
}

func (f *failoverWindow) promoted() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.done, f.end = true, time.Now().Add(time.Second)
	return time.Since(f.start)
}

// countingHandler is a slog.Handler that counts error records and drops
// everything: the email adapter reports a send whose sent-record did not
// commit (the failover can cause that) as an error log, not as an error.
type countingHandler struct{ n *atomic.Int64 }

func (h countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h countingHandler) Handle(context.Context, slog.Record) error {
	h.n.Add(1)
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }
