// Package sched is the scheduler under consume.Consumer: it holds the
// deliveries a consumer took from its source, hands them to workers one at
// a time or in batches, keeps each Ordering's deliveries in order with one
// run of them out at a time, and arms the retries the consumer asks for.
//
// It decides nothing about errors. After an attempt, the consumer's policy
// tells it, per delivery, whether the delivery is finished (acked, given up
// for good, dropped or left unacked for redelivery: its slot is freed), to
// be retried after a pause, or to wait behind a retried delivery of its
// Ordering (see [Scheduler.Settle]).
package sched

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"effectively.dev/effects"
)

// Task is one delivery the scheduler holds, from [Scheduler.Add] until it
// is finished.
type Task struct {
	// Delivery is the delivery itself.
	Delivery effects.Delivery

	// The consumer's bookkeeping; the scheduler neither reads nor writes
	// these fields.

	// Attempt counts the attempts made (from the source's count, if any).
	Attempt int
	// InFlightSince is when an attempt first answered effects.ErrInFlight;
	// zero before that.
	InFlightSince time.Time
	// InFlightWaits counts the waits for another attempt's lease.
	InFlightWaits int
	// Waiting: the pending retry is a wait for another attempt's lease,
	// not a retry after a failure.
	Waiting bool
	// Parked: given up on and held unacked.
	Parked bool

	lane *lane // its Ordering's lane; nil without an Ordering
	done bool  // finished: to be dropped from its lane
}

// Ordered reports whether t has an Ordering, and so a lane: its retries
// keep its turn, holding back the deliveries behind it.
func (t *Task) Ordered() bool { return t.lane != nil }

// Outcome is what the consumer decided for one delivery of an attempt.
type Outcome int

const (
	// Finished: acked, given up on for good, dropped, or left unacked for
	// redelivery. Its slot is freed and its lane goes on.
	Finished Outcome = iota
	// Retry: attempted again after the pause; it keeps its lane's turn.
	Retry
	// Wait: behind a retried delivery of its Ordering; attempted again
	// once that one is finished, in a later run. Only for a delivery
	// whose Decide call was told it is behind one.
	Wait
)

// Config sets up a [Scheduler].
type Config struct {
	// MaxPending bounds the deliveries held, from Reserve until finished.
	MaxPending int
	// BatchSize and Linger shape the batches of [Scheduler.Collect].
	BatchSize int
	Linger    time.Duration
	// Resume takes a delivery up again when its retry's pause is over, on
	// the timer's goroutine, unless shutdown began first. It must hand the
	// delivery back with Ready, Settle or Forget.
	Resume func(t *Task)
}

// Scheduler holds the deliveries of one consumer run.
//
// Every delivery held takes a slot from Reserve until it is finished, and
// is in exactly one place: the ready channel, a batch being collected, a
// worker, a retry timer, or waiting in its Ordering's lane behind the run
// that is out. Hence ready, whose capacity is the number of slots, never
// blocks a sender.
type Scheduler struct {
	ctx context.Context // done: shutting down
	cfg Config

	ready chan *Task    // heads of lanes, and deliveries without Ordering, whose turn it is
	slots chan struct{} // one per delivery held

	// fetchBlocked: Reserve waits for a slot, so no delivery can arrive
	// until one finishes.
	fetchBlocked atomic.Bool

	mu         sync.Mutex
	lanes      map[string]*lane
	timers     map[*Task]*time.Timer   // armed retries
	collecting map[*collector]struct{} // batches that linger

	timersLive sync.WaitGroup // retry timers that may still run Resume
}

// New returns a scheduler that shuts down when ctx is done: it then
// dispatches nothing, arms no retry and hands out nothing.
func New(ctx context.Context, cfg Config) *Scheduler {
	return &Scheduler{
		ctx:        ctx,
		cfg:        cfg,
		ready:      make(chan *Task, cfg.MaxPending),
		slots:      make(chan struct{}, cfg.MaxPending),
		lanes:      map[string]*lane{},
		timers:     map[*Task]*time.Timer{},
		collecting: map[*collector]struct{}{},
	}
}

// lane holds the unfinished deliveries of one Ordering, in order. Only a
// run at its front is ever dispatched: q[:out] are ready, collected into a
// batch, running, or (q[0] alone) waiting for a retry; the others wait.
type lane struct {
	key string
	q   []*Task
	out int
	col *collector // the batch collecting q[:out], while it collects
}

// collector is a batch being collected.
type collector struct {
	size  int
	tasks []*Task       // guarded by Scheduler.mu
	lanes []*lane       // whose run is in tasks
	wake  chan struct{} // a delivery joined, or none can join any more (capacity 1)
}

func (col *collector) signal() {
	select {
	case col.wake <- struct{}{}:
	default:
	}
}

// Reserve takes a slot for the next delivery, waiting while every slot is
// taken. It reports false when shutdown began.
func (s *Scheduler) Reserve() bool {
	select {
	case s.slots <- struct{}{}:
		return true
	case <-s.ctx.Done():
		return false
	default:
	}
	s.blockFetch(true)
	defer s.blockFetch(false)
	select {
	case s.slots <- struct{}{}:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// Unreserve gives back the slot Reserve took, when no delivery came.
func (s *Scheduler) Unreserve() { <-s.slots }

// blockFetch records whether Reserve waits for a slot; when it starts
// waiting, lingering batches stop: nothing can join them.
func (s *Scheduler) blockFetch(blocked bool) {
	s.fetchBlocked.Store(blocked)
	if !blocked {
		return
	}
	s.mu.Lock()
	for col := range s.collecting {
		col.signal()
	}
	s.mu.Unlock()
}

// Add takes a new delivery, under the slot Reserve took: it makes it
// ready, queues it in its Ordering's lane, or adds it to the batch that is
// collecting the run just before it.
func (s *Scheduler) Add(t *Task) {
	if t.Delivery.Ordering == "" {
		s.ready <- t
		return
	}
	s.mu.Lock()
	l := s.lanes[t.Delivery.Ordering]
	if l == nil {
		l = &lane{key: t.Delivery.Ordering}
		s.lanes[l.key] = l
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
	s.mu.Unlock()
	if send {
		s.ready <- t
	}
}

// Take waits for a delivery whose turn it is; nil once shutdown began.
func (s *Scheduler) Take() *Task {
	select {
	case <-s.ctx.Done():
		return nil
	case t := <-s.ready:
		return t
	}
}

// Ready makes t, whose turn it is, ready again: after its retry's pause,
// or the delivery Settle returned to a caller that does not run it.
func (s *Scheduler) Ready(t *Task) { s.ready <- t }

// Forget frees the slot of t, a delivery without an Ordering that left
// the scheduler after its retry's pause (released to its source). An
// ordered delivery is finished with Settle instead: its lane must go on.
func (s *Scheduler) Forget(*Task) { <-s.slots }

// Collect builds a batch from first: first's lane run, what else is
// ready, and, while the batch lingers, what joins it. It lingers only
// while a delivery can still arrive (Reserve is not waiting for a slot).
func (s *Scheduler) Collect(first *Task) []*Task {
	size, linger := s.cfg.BatchSize, s.cfg.Linger
	col := &collector{size: size, wake: make(chan struct{}, 1)}
	s.mu.Lock()
	s.takeLocked(col, first)
	s.mu.Unlock()
	full := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(col.tasks) >= size
	}
	takeReady := func() {
		for !full() {
			select {
			case t := <-s.ready:
				s.mu.Lock()
				s.takeLocked(col, t)
				s.mu.Unlock()
				continue
			default:
			}
			return
		}
	}
	takeReady()
	if linger > 0 && !full() && !s.fetchBlocked.Load() {
		s.mu.Lock()
		s.collecting[col] = struct{}{}
		s.mu.Unlock()
		tm := time.NewTimer(linger)
	wait:
		for !full() && !s.fetchBlocked.Load() {
			select {
			case t := <-s.ready:
				s.mu.Lock()
				s.takeLocked(col, t)
				s.mu.Unlock()
			case <-col.wake:
			case <-tm.C:
				break wait
			case <-s.ctx.Done():
				break wait
			}
		}
		tm.Stop()
		// What became ready while the wait ended (the fetch loop's last
		// delivery, sent just before it blocked) joins too.
		takeReady()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.collecting, col)
	for _, l := range col.lanes {
		l.col = nil
	}
	return col.tasks
}

// takeLocked adds t to col, with as much of the run behind t in its lane
// as fits. t is a lane's head (or has no Ordering).
func (s *Scheduler) takeLocked(col *collector, t *Task) {
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

// Decide is the consumer's decision for tasks[i] of a settled attempt.
// behind reports that an earlier delivery of its Ordering in the same
// attempt is to be retried: then only Finished or Wait keep the order.
type Decide func(i int, behind bool) (Outcome, time.Duration)

// Settle ends the attempt of tasks (one, or a batch): it asks decide about
// each, in order, then drops the finished deliveries from their lanes,
// arms the retries and puts each lane's next run in line.
//
// It returns the next delivery of the lane it settled when that is the
// only one to go on and no other delivery waits for a worker, instead of
// putting it in line, so that a worker goes on with it without a handoff
// to another goroutine (the loop a hand-written consumer runs per
// partition). It returns nil when it put everything in line.
func (s *Scheduler) Settle(tasks []*Task, decide Decide) *Task {
	var outs1 [1]Outcome
	var delays1 [1]time.Duration
	outs, delays := outs1[:], delays1[:]
	if len(tasks) > 1 {
		outs, delays = make([]Outcome, len(tasks)), make([]time.Duration, len(tasks))
	}
	var blocked map[*lane]bool // lanes whose run has a delivery to retry
	for i, t := range tasks {
		behind := t.lane != nil && blocked[t.lane]
		outs[i], delays[i] = decide(i, behind)
		if outs[i] == Retry && t.lane != nil && !behind {
			if blocked == nil {
				blocked = map[*lane]bool{}
			}
			blocked[t.lane] = true
		}
	}

	// The lanes: drop the finished deliveries, then put each lane's next
	// run in line (or leave the head to its retry timer).
	var next []*Task
	s.mu.Lock()
	for i, t := range tasks {
		t.done = outs[i] == Finished
	}
	for i, t := range tasks {
		l := t.lane
		if l == nil || slices.ContainsFunc(tasks[:i], func(u *Task) bool { return u.lane == l }) {
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
			delete(s.lanes, l.key)
		case s.ctx.Err() != nil:
			l.out = 0 // shutting down: dispatch nothing
		default:
			l.out = 1
			next = append(next, l.q[0])
		}
	}
	s.mu.Unlock()

	for i, t := range tasks {
		switch outs[i] {
		case Finished:
			<-s.slots
		case Retry:
			s.retryAfter(t, delays[i])
		}
	}
	var keep *Task
	if len(next) == 1 && len(s.ready) == 0 {
		keep, next = next[0], nil
	}
	for _, t := range next {
		s.ready <- t
	}
	return keep
}

// dropDone removes the n finished tasks from a lane's queue. They are
// usually its head (the run just settled): that costs a reslice, not a
// copy of everything queued behind them, and the scan stops once all n are
// gone.
func dropDone(q []*Task, n int) []*Task {
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

// retryAfter hands t to Resume after delay, unless shutdown begins first.
func (s *Scheduler) retryAfter(t *Task, delay time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return // left unacked, delivered again
	}
	s.timersLive.Add(1)
	s.timers[t] = time.AfterFunc(delay, func() {
		defer s.timersLive.Done()
		s.mu.Lock()
		delete(s.timers, t)
		s.mu.Unlock()
		if s.ctx.Err() == nil {
			s.cfg.Resume(t)
		}
	})
}

// Stop disarms the pending retries and waits for the Resume calls that
// already started. Call it once shutdown began and the workers ended.
func (s *Scheduler) Stop() {
	s.mu.Lock()
	for t, tm := range s.timers {
		if tm.Stop() {
			s.timersLive.Done()
		}
		delete(s.timers, t)
	}
	s.mu.Unlock()
	s.timersLive.Wait()
}
