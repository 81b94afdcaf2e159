package counterexamples

import (
	"context"
	"sync"
	"time"

	"effectively.dev/effects"
)

// Sources that break the [effects.Source] contract where the first
// source scenarios never looked: order, messages published while an
// instance runs, and a close with messages fetched but not handed out.

// fetchBatch does what a client's poll does: it waits for one delivery,
// then takes whatever else comes within a few milliseconds (up to 256).
func fetchBatch(ctx context.Context, src effects.Source) ([]effects.Delivery, error) {
	d, err := src.Next(ctx)
	if err != nil {
		return nil, err
	}
	out := []effects.Delivery{d}
	for len(out) < 256 {
		pctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		d, err := src.Next(pctx)
		cancel()
		if err != nil {
			break
		}
		out = append(out, d)
	}
	return out, nil
}

// prefetch is the buffer of fetched deliveries not yet handed out.
type prefetch struct {
	mu  sync.Mutex
	buf []effects.Delivery
}

// next hands out a buffered delivery, the newest when newest is set,
// fetching a batch from src when the buffer is empty.
func (p *prefetch) next(ctx context.Context, src effects.Source, newest bool) (effects.Delivery, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.buf) == 0 {
		ds, err := fetchBatch(ctx, src)
		if err != nil {
			return effects.Delivery{}, err
		}
		p.buf = ds
	}
	var d effects.Delivery
	if newest {
		d, p.buf = p.buf[len(p.buf)-1], p.buf[:len(p.buf)-1]
	} else {
		d, p.buf = p.buf[0], p.buf[1:]
	}
	return d, nil
}

// NewestFirst wraps any [effects.Source] so that it hands out each fetched
// batch newest first (a stack where a queue was meant): within an
// Ordering, messages are handled out of publish order, on first delivery
// and on redelivery. Caught by publish-order.
type NewestFirst struct {
	effects.Source
	p *prefetch
}

// NewNewestFirst wraps s.
func NewNewestFirst(s effects.Source) NewestFirst { return NewestFirst{Source: s, p: &prefetch{}} }

// Next hands out the newest delivery fetched and not yet handed out.
func (s NewestFirst) Next(ctx context.Context) (effects.Delivery, error) {
	return s.p.next(ctx, s.Source, true)
}

// StopsWhenCaughtUp wraps any [effects.Source] so that it reads until it
// first finds nothing new for 200 ms and then hands out nothing more: a
// consumer that takes the end offsets it saw as the end of its work, as
// one that snapshots them at start-up does. Everything published before
// it started reaches it; nothing published after it caught up does.
// Caught by published-while-running.
type StopsWhenCaughtUp struct {
	effects.Source
	mu   *sync.Mutex
	done *bool
}

// NewStopsWhenCaughtUp wraps s.
func NewStopsWhenCaughtUp(s effects.Source) StopsWhenCaughtUp {
	return StopsWhenCaughtUp{Source: s, mu: &sync.Mutex{}, done: new(bool)}
}

// Next hands out deliveries until the source first idles, then waits for
// ctx.
func (s StopsWhenCaughtUp) Next(ctx context.Context) (effects.Delivery, error) {
	s.mu.Lock()
	done := *s.done
	s.mu.Unlock()
	if !done {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		d, err := s.Source.Next(pctx)
		cancel()
		if err == nil || ctx.Err() != nil || pctx.Err() == nil {
			return d, err
		}
		s.mu.Lock()
		*s.done = true
		s.mu.Unlock()
	}
	<-ctx.Done()
	return effects.Delivery{}, ctx.Err()
}

// AckFetchedOnClose wraps any [effects.Source] with a client-side buffer
// and a Close that acks everything fetched, handed out or not: the
// auto-commit-on-close bug, which commits the fetch position. Messages
// fetched but never handed out are lost. Caught by close-with-prefetched.
type AckFetchedOnClose struct {
	effects.Source
	p *prefetch
}

// NewAckFetchedOnClose wraps s.
func NewAckFetchedOnClose(s effects.Source) AckFetchedOnClose {
	return AckFetchedOnClose{Source: s, p: &prefetch{}}
}

// Next hands out the oldest delivery fetched and not yet handed out.
func (s AckFetchedOnClose) Next(ctx context.Context) (effects.Delivery, error) {
	return s.p.next(ctx, s.Source, false)
}

// Close acks every delivery fetched and not handed out, as a commit of
// the fetch position would. The instance's own close runs after it.
func (s AckFetchedOnClose) Close(ctx context.Context) error {
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	for _, d := range s.p.buf {
		if err := s.Source.Ack(ctx, d); err != nil {
			return err
		}
	}
	s.p.buf = nil
	return nil
}
