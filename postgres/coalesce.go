package postgres

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
)

// maxCoalesced bounds how many calls one coalesced statement carries.
const maxCoalesced = 256

// coalescer is group commit for one kind of journal call: a call that
// arrives while limit statements of its kind are in flight waits, and when
// one of them returns, every call that waited runs as one statement. A
// call that finds a free slot runs at once, alone, so a lone caller waits
// for nothing; under load, N concurrent calls cost one round trip and one
// commit instead of N.
//
// Calls with the same key never share a statement (an INSERT ... ON
// CONFLICT DO UPDATE cannot touch one row twice): a second call waits for
// the next one. Each caller waits only as long as its own context: a
// caller whose context ends while queued leaves the queue; one whose
// statement is in flight returns at once, and the statement is cancelled
// when every caller in it has gone. Queued calls run on a goroutine that
// exits when the queue is empty.
type coalescer[Req, Res any] struct {
	key  func(Req) string
	exec func(ctx context.Context, reqs []Req) []Res // one statement; a Res per Req, in order

	limit int // statements in flight at most; 0 means 1
	size  int // calls per statement at most; 0 means maxCoalesced

	mu       sync.Mutex
	inFlight int
	queue    []*coalescedCall[Req, Res]

	statements atomic.Int64 // statements run, for tests
}

type coalescedCall[Req, Res any] struct {
	ctx    context.Context
	req    Req
	queued bool          // still in the queue; guarded by the coalescer's mu
	done   chan struct{} // closed once res is set
	res    Res
}

// What became of a call whose caller's context ended first.
type callEnd int

const (
	callDone     callEnd = iota // the result is there
	callNotSent                 // it left the queue: nothing was sent for it
	callInFlight                // it left while its statement ran: the statement may have done it
)

// do runs req, alone or with others, and returns its result, or how it
// ended if ctx ended before the result was known.
func (c *coalescer[Req, Res]) do(ctx context.Context, req Req) (res Res, end callEnd) {
	call := &coalescedCall[Req, Res]{ctx: ctx, req: req, done: make(chan struct{})}
	c.mu.Lock()
	if c.inFlight < max(c.limit, 1) {
		// A statement slot is free: run at once, on this goroutine. A
		// statement of one call is cancelled with the call's context.
		c.inFlight++
		c.mu.Unlock()
		c.run([]*coalescedCall[Req, Res]{call})
		if next := c.take(); next != nil {
			go c.flush(next)
		}
		return call.res, callDone
	}
	call.queued = true
	c.queue = append(c.queue, call)
	c.mu.Unlock()

	select {
	case <-call.done:
		return call.res, callDone
	case <-ctx.Done():
	}
	c.mu.Lock()
	if call.queued {
		c.queue = slices.DeleteFunc(c.queue, func(q *coalescedCall[Req, Res]) bool { return q == call })
		c.mu.Unlock()
		return res, callNotSent
	}
	c.mu.Unlock()
	select {
	case <-call.done: // finished meanwhile
		return call.res, callDone
	default:
		return res, callInFlight
	}
}

// flush runs batch, then whatever queued meanwhile, until the queue is
// empty.
func (c *coalescer[Req, Res]) flush(batch []*coalescedCall[Req, Res]) {
	for ; batch != nil; batch = c.take() {
		c.run(batch)
	}
}

// run runs batch as one statement and delivers every result.
func (c *coalescer[Req, Res]) run(batch []*coalescedCall[Req, Res]) {
	c.statements.Add(1)
	if len(batch) == 1 {
		// Alone: on the caller's own context, as if there were no
		// coalescer (its deadline and its error stay the caller's).
		batch[0].res = c.exec(batch[0].ctx, []Req{batch[0].req})[0]
		close(batch[0].done)
		return
	}
	// The statement runs while any of its callers still waits for it.
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	var gone atomic.Int64
	stops := make([]func() bool, len(batch))
	for i, b := range batch {
		stops[i] = context.AfterFunc(b.ctx, func() {
			if gone.Add(1) == int64(len(batch)) {
				cancel()
			}
		})
	}
	reqs := make([]Req, len(batch))
	for i, b := range batch {
		reqs[i] = b.req
	}
	out := c.exec(ctx, reqs)
	for _, stop := range stops {
		stop()
	}
	cancel()
	for i, b := range batch {
		b.res = out[i]
		close(b.done)
	}
}

// take takes the next statement's calls from the queue (distinct keys, at
// most size), or returns nil and marks that nothing is in flight.
func (c *coalescer[Req, Res]) take() []*coalescedCall[Req, Res] {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		c.inFlight--
		return nil
	}
	var next []*coalescedCall[Req, Res]
	seen := make(map[string]bool)
	size := c.size
	if size <= 0 {
		size = maxCoalesced
	}
	rest := c.queue[:0]
	for _, q := range c.queue {
		k := c.key(q.req)
		if seen[k] || len(next) == size {
			rest = append(rest, q)
			continue
		}
		seen[k] = true
		q.queued = false
		next = append(next, q)
	}
	clear(c.queue[len(rest):])
	c.queue = rest
	return next
}
