package conformance

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"effectively.dev/effects"
)

// defaultSourceBacklog is how many messages rebalance-full-buffers
// publishes to each ordering it fills ([WithSourceBacklog]): more than a
// kafka.Source holds fetched per partition by default (256), so that its
// buffers are full and its fetching paused when the group rebalances.
const defaultSourceBacklog = 300

// WithSourceBacklog sets how many messages rebalance-full-buffers
// publishes to each ordering it fills (default 300;
// at least 1). Give more than the source fetches ahead of its handlers
// per ordering, so that its buffers are full when the group rebalances.
func WithSourceBacklog(n int) SourceOption {
	return opt(func(c *config) {
		if n < 1 {
			c.bad("WithSourceBacklog", "%d: at least 1", n)
		}
		c.sourceBacklog = n
	})
}

func (c *config) backlog() int {
	if c.sourceBacklog <= 0 {
		return defaultSourceBacklog
	}
	return c.sourceBacklog
}

// OrderingPublisher is a [SourceHarness] that can publish to one ordering
// (partition) of its choice, so that rebalance-full-buffers can fill some
// orderings while others stay idle.
type OrderingPublisher interface {
	// Orderings returns how many orderings Publish spreads messages over;
	// at least 2.
	Orderings() int
	// PublishTo appends n new messages to ordering k (0 <= k <
	// Orderings()) and returns their ids, as Delivery.ID will show them,
	// in the order they were published.
	PublishTo(ctx context.Context, k, n int) ([]string, error)
}

var capOrderingPublisher = capability{name: "conformance.OrderingPublisher",
	missing: func(h any, _ *config) (string, string) {
		if _, ok := h.(OrderingPublisher); ok {
			return "", ""
		}
		return "harness does not implement conformance.OrderingPublisher",
			"implement conformance.OrderingPublisher (Orderings() int; PublishTo(ctx, k, n): publish n messages to ordering k)"
	},
	wrong: func(h any, _ *config) string {
		if op, ok := h.(OrderingPublisher); ok && op.Orderings() < 2 {
			return fmt.Sprintf("conformance.OrderingPublisher: Orderings() is %d: the scenario needs at least 2, one to fill and one to leave idle", op.Orderings())
		}
		return ""
	}}

// checkAttempt holds a redelivery d to the Attempt the source reported
// on the id's delivery before (prev): a source that counts attempts
// (from 1) counts every redelivery, to this instance or another, moved by
// a rebalance or after a release, a close or a crash; one that does not
// know (0) knows no better on a redelivery (a count from 0 would make
// every WithMaxAttempts one attempt longer).
func (s *sscene) checkAttempt(prev int, d effects.Delivery, what string) {
	switch {
	case prev > 0:
		s.check(d.Attempt > prev,
			"%s: %q came back with Attempt %d after Attempt %d, want more (a source that counts attempts counts every redelivery)", what, d.ID, d.Attempt, prev)
	default:
		s.check(d.Attempt == 0,
			"%s: %q came back with Attempt %d after a delivery with Attempt 0: attempts count from 1, 0 means the source does not know", what, d.ID, d.Attempt)
	}
}

// publishTo publishes n messages to ordering k.
func (s *sscene) publishTo(op OrderingPublisher, k, n int) []string {
	ids, err := op.PublishTo(s.ctx, k, n)
	if err != nil {
		s.fatalf("harness PublishTo(%d, %d): %v", k, n, err)
	}
	if len(ids) != n {
		s.fatalf("harness PublishTo(%d, %d) returned %d ids", k, n, len(ids))
	}
	for _, id := range ids {
		if s.published[id] {
			s.fatalf("harness PublishTo returned the id %q twice", id)
		}
		s.published[id] = true
	}
	s.order = append(s.order, ids...)
	return ids
}

// rebalanceFullBuffers: instance A takes and acks a first round of
// messages on every ordering, so that the first ordering is idle with
// acks behind it. Then every other ordering gets a backlog larger than A
// fetches ahead, and A takes a few of each: on even orderings it acks all
// it took, on odd ones the first half, holding the rest unacked (their
// handlers not finished). Instance B joins while A's buffers are full. A
// waits for the rebalance, acks what it held (late: a source may refuse),
// and both then take and ack everything. Nothing acked before the
// rebalance may come back; every message no Ack confirmed must reach a
// later instance; every redelivery's Attempt is checked, those moved to
// another instance included. A rebalance that moves no filled ordering to
// B leaves the scenario unconfirmed.
func (s *sscene) rebalanceFullBuffers() {
	op := s.h.(OrderingPublisher)
	k := op.Orderings()
	// The first ordering stays idle: a balancer that keeps what it can
	// (cooperative-sticky) moves the last ones to a member that joins.
	const idle = 0
	confirmed := map[string]bool{}

	warm := s.publish(sourceMessages)
	a := s.open("A")
	var mine []effects.Delivery // every delivery A took before the rebalance
	for _, d := range s.collect(a, warm, 0, false, "first round, on every ordering") {
		mine = append(mine, d)
		if err := s.ack(a, d); err != nil {
			s.failf("Ack(%q) of the first round: %v", d.ID, err)
			continue
		}
		confirmed[d.ID] = true
	}

	orderingOf := map[string]int{}
	for i := 1; i < k; i++ {
		for _, id := range s.publishTo(op, i, s.cfg.backlog()) {
			orderingOf[id] = i
		}
	}
	take := max(sourceMessages/2, 2*(k-1))
	byOrdering := map[int][]effects.Delivery{}
	end := time.Now().Add(s.cfg.redeliveryWait)
	for got := 0; got < take; {
		d, err := s.next(a, end)
		if err != nil {
			s.fatalf("Next on instance A (%d of %d taken from the backlog): %v", got, take, err)
		}
		if !s.check(s.published[d.ID], "instance A delivered %q, which was never published", d.ID) {
			continue
		}
		s.same(d, "before the rebalance")
		if confirmed[d.ID] {
			s.failf("instance A delivered %q again before any rebalance, after its Ack returned nil", d.ID)
			continue
		}
		i, ok := orderingOf[d.ID]
		if !ok {
			continue
		}
		mine = append(mine, d)
		byOrdering[i] = append(byOrdering[i], d)
		got++
	}
	var held []effects.Delivery
	for i, ds := range byOrdering {
		keep := len(ds)
		if i%2 == 1 {
			keep = len(ds) / 2
		}
		for j, d := range ds {
			if j >= keep {
				held = append(held, d)
				continue
			}
			if err := s.ack(a, d); err != nil {
				s.failf("Ack(%q) before the rebalance: %v", d.ID, err)
				continue
			}
			confirmed[d.ID] = true
		}
	}
	before := maps.Clone(confirmed)
	s.notef("%d orderings: %d filled with %d messages each, ordering %d idle; instance A took %d of the backlog, held %d unacked, and its first %d acks were confirmed",
		k, k-1, s.cfg.backlog(), idle, take, len(held), len(before))

	// The rebalance: B joins while A's buffers are full.
	r := &rebalanceRun{s: s, confirmed: confirmed, before: before, pos: s.positions(), orderingOf: orderingOf}
	bctx, stopB := context.WithCancel(s.ctx)
	defer stopB()
	b := s.open("B")
	r.run(bctx, b)
	moved := r.waitMoved(a, mine)
	late, refused := 0, 0
	for _, d := range held {
		if err := s.ack(a, d); err != nil {
			refused++
			continue
		}
		late++
		r.confirm(d.ID)
	}
	actx, stopA := context.WithCancel(s.ctx)
	defer stopA()
	r.run(actx, a)
	r.waitAll(s.cfg.redeliveryWait)
	stopB()
	stopA()
	r.stopped(a, b)
	filled := r.orderings()
	s.notef("the rebalance: %s; A's late acks: %d confirmed, %d refused; after it, %d deliveries to B, of filled orderings %v, and %d to A",
		moved, late, refused, r.count["B"], filled, r.count["A"])
	if len(filled) == 0 {
		s.row.unconfirmed("the rebalance moved no filled ordering to instance B: no full fetch buffer changed hands",
			"a group whose balancer gives a joining member one of the last orderings (the first stays idle), or more orderings")
	}
	s.stop(b, false)
	s.stop(a, false)

	// What no Ack confirmed reaches a new instance; nothing confirmed
	// comes back. A few fresh messages on every ordering show that C reads
	// them all before the suite stops looking.
	var want []string
	for _, id := range s.order {
		if !r.confirmed[id] {
			want = append(want, id)
		}
	}
	fresh := s.publish(k)
	c := s.open("C")
	again := s.collect(c, append(want, fresh...), time.Second, true,
		fmt.Sprintf("the %d messages no Ack confirmed, after the rebalance and a graceful close", len(want)))
	pos := s.positions()
	var back []string
	for _, d := range again {
		if r.confirmed[d.ID] && !s.behindHole(d.ID, r.confirmed, pos) {
			back = append(back, d.ID)
		}
	}
	s.check(len(back) == 0, "%d messages whose Ack returned nil, as had every message before them in their ordering, came back after the rebalance and a graceful close: %s", len(back), firstFew(back))
}

// behindHole reports whether a message published before id in id's
// Ordering was delivered and not acked (confirmed): a source with
// ordered positions commits no further than such a hole, so id, acked or
// not, comes back to the ordering's next owner. A message without an
// Ordering is behind no hole.
func (s *sscene) behindHole(id string, confirmed map[string]bool, pos map[string]int) bool {
	o := s.first[id].Ordering
	if o == "" {
		return false
	}
	for _, y := range s.order[:pos[id]] {
		if d, ok := s.first[y]; ok && d.Ordering == o && !confirmed[y] {
			return true
		}
	}
	return false
}

// rebalanceRun is the part of rebalance-full-buffers where two instances
// take and ack deliveries at once.
type rebalanceRun struct {
	s          *sscene
	before     map[string]bool // confirmed before the rebalance
	pos        map[string]int  // publish positions
	orderingOf map[string]int

	mu        sync.Mutex
	confirmed map[string]bool
	count     map[string]int
	moved     map[int]bool // filled orderings B received deliveries of
	got       chan struct{}
	wg        sync.WaitGroup
}

func (r *rebalanceRun) confirm(id string) {
	r.mu.Lock()
	r.confirmed[id] = true
	r.mu.Unlock()
}

// run takes and acks i's deliveries until ctx ends.
func (r *rebalanceRun) run(ctx context.Context, i *sinst) {
	s := r.s
	r.mu.Lock()
	if r.got == nil {
		r.got = make(chan struct{}, 1)
		r.count = map[string]int{}
		r.moved = map[int]bool{}
	}
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer func() {
			// A hung or panicking Ack stops this loop (s.ack recorded
			// why), not the test binary.
			if v := recover(); v != nil {
				if _, ok := v.(abort); !ok {
					panic(v)
				}
			}
		}()
		for {
			d, err := i.Source.Next(ctx)
			if err != nil {
				if ctx.Err() == nil {
					s.failf("Next on instance %s after the rebalance: %v", i.name, err)
				}
				return
			}
			if !s.check(s.published[d.ID], "instance %s delivered %q, which was never published", i.name, d.ID) {
				continue
			}
			what := "after the rebalance, on instance " + i.name
			r.mu.Lock()
			s.same(d, what)
			r.count[i.name]++
			if o, ok := r.orderingOf[d.ID]; ok && i.name == "B" {
				r.moved[o] = true
			}
			back := r.before[d.ID] && !s.behindHole(d.ID, r.before, r.pos)
			r.mu.Unlock()
			s.check(!back, "instance %s delivered %q after the rebalance, though its Ack returned nil before it and every message before it in its ordering was acked: an acked message came back", i.name, d.ID)
			select {
			case r.got <- struct{}{}:
			default:
			}
			if err := s.ack(i, d); err == nil {
				r.confirm(d.ID)
			}
		}
	}()
}

// waitMoved waits until the rebalance shows: B received a delivery, or A
// reports one of its deliveries no longer its own
// ([effects.OwnershipChecker]). It says which, or that neither did in
// time.
func (r *rebalanceRun) waitMoved(a *sinst, mine []effects.Delivery) string {
	s := r.s
	oc, _ := a.Source.(effects.OwnershipChecker)
	wait := min(s.cfg.redeliveryWait, 15*time.Second)
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-r.got:
			return "instance B received a delivery"
		case <-tick.C:
			if oc != nil && slices.ContainsFunc(mine, func(d effects.Delivery) bool { return !oc.Owns(d) }) {
				return "instance A no longer owns deliveries it took"
			}
		case <-deadline.C:
			return fmt.Sprintf("no sign of it within %v (B received nothing)", wait)
		case <-s.ctx.Done():
			return "the scenario ran out of time"
		}
	}
}

// waitAll waits until every published message was confirmed, or d.
func (r *rebalanceRun) waitAll(d time.Duration) {
	s := r.s
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && s.ctx.Err() == nil {
		r.mu.Lock()
		done := true
		for _, id := range s.order {
			if !r.confirmed[id] {
				done = false
				break
			}
		}
		r.mu.Unlock()
		if done {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopped waits for the loops, whose contexts were cancelled; a Next
// that does not return is a hang.
func (r *rebalanceRun) stopped(is ...*sinst) {
	s := r.s
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.applyTimeout):
		for _, i := range is {
			i.f.Sever()
		}
		s.fatalf("hang: Next did not return within %v after its context was cancelled", s.cfg.applyTimeout)
	}
}

// orderings lists the orderings B received deliveries of.
func (r *rebalanceRun) orderings() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]int, 0, len(r.moved))
	for o := range r.moved {
		out = append(out, o)
	}
	sort.Ints(out)
	return out
}
