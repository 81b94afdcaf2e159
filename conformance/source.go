package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
)

// SourceHarness connects the source suite ([RunSource]) to one
// [effects.Source] implementation and its backend: a topic and a consumer
// group, a queue and its subscription.
type SourceHarness interface {
	// Publish appends n new messages to the backend and returns their ids,
	// as Delivery.ID will show them, in the order they were published.
	// Spread them over the backend's orderings (partitions) as production
	// traffic would be.
	Publish(ctx context.Context, n int) ([]string, error)
	// Open starts a new consumer instance, as a process would at start-up,
	// joining the same group (subscription) as every other instance of
	// this harness, with every connection through f.
	Open(ctx context.Context, f *Faults) (SourceInstance, error)
}

// SourceInstance is one running consumer made by a [SourceHarness].
type SourceInstance struct {
	// Source is the instance under test.
	Source effects.Source
	// Close stops the instance gracefully, as a process does on shutdown
	// (committing what it acked, leaving its group). Required.
	Close func()
	// Crash stops the instance as a killed process would: nothing more is
	// committed or acknowledged. Nil means the suite crashes it by severing
	// every connection made through the instance's Faults ([Faults.Sever])
	// and then calling Close, which must then return promptly.
	Crash func()
}

func sourceTable() []scenario[SourceHarness] {
	type s = sscene
	src := func(name, doc string, verifies, proofs []string, fn func(*s)) scenario[SourceHarness] {
		return rec(suiteSource, name, doc, nil, verifies, nil, proofs, source(fn))
	}
	delivery, acks := list(FieldDelivery), list(FieldAcks)
	return []scenario[SourceHarness]{
		src(SourceAckedStayAcked, "acked deliveries are not delivered again after a graceful close",
			acks, list("AckOnNextAck"), (*s).ackedStayAcked),
		src(SourceUnackedAfterClose, "unacked deliveries come back, the same message, after a graceful close",
			delivery, list("AckOnNext", "AttemptAlwaysOne", "StampedRedelivery", "AttemptFromZero"), func(s *s) { s.unacked(false) }),
		src(SourceUnackedAfterCrash, "unacked deliveries come back, the same message, after a crash",
			delivery, list("AckOnNext", "AttemptAlwaysOne", "StampedRedelivery"), func(s *s) { s.unacked(true) }),
		src(SourceOutOfOrderAcks, "acks out of order never commit past an unacked delivery",
			delivery, list("AckOnNext"), (*s).outOfOrder),
		src(SourceNeverAcked, "a delivery never acked is never committed",
			delivery, list("AckOnNext"), (*s).neverAcked),
		src(SourceRevocation, "a second instance joins (a rebalance): nothing unacked is lost",
			delivery, list("AckOnNext"), (*s).revocation),
		src(SourceReleased, "for an effects.Releaser: a released delivery comes back and is never taken for acked",
			delivery, list("ReleaseAcks"), (*s).released),
		src(SourcePublishOrder, "each Ordering's messages come in publish order, first and again",
			list(FieldOrder), list("NewestFirst"), (*s).publishOrder),
		src(SourceLivePublish, "messages published while an instance runs reach it",
			delivery, list("StopsWhenCaughtUp"), (*s).livePublish),
		src(SourceCloseWithPrefetched, "a graceful close commits nothing fetched but not handed out",
			delivery, list("AckFetchedOnClose"), (*s).closeWithPrefetched),
		rec(suiteSource, SourceRebalanceFullBuffers,
			"a second instance joins while the first holds full fetch buffers, unacked deliveries and an idle ordering: nothing unacked is lost, nothing acked comes back, every redelivery's Attempt counts it",
			[]capability{capOrderingPublisher}, list(FieldDelivery, FieldAcks), list("WithSourceBacklog"),
			list("ResumeAtFetchPosition", "CommitFetchedWhenIdle", "StalledIdleCommit", "AttemptsLostOnRevoke"), source((*s).rebalanceFullBuffers)),
	}
}

// RunSource runs the source suite against the source that mk's harness
// opens: every published message is delivered; an acked one is not
// delivered again after a graceful close; an unacked one comes back after
// a close and after a crash; acks out of order never skip a message; a
// message never acked is never committed; and when a second instance
// joins (a rebalance, a revocation), no message that was not acked is
// lost; and a source that hands deliveries back ([effects.Releaser])
// redelivers what it released and never takes a release for an ack; every
// Ordering's messages come in publish order, first and again; what is
// published while an instance runs reaches it; a graceful close commits
// nothing fetched but not handed out; and a rebalance while an instance
// holds full fetch buffers and an idle ordering loses nothing and brings
// back nothing acked (for an [OrderingPublisher]). Every redelivery's
// Attempt must count it. Each scenario is a subtest of t; every failed
// check fails t.
// mk returns a fresh harness (a fresh topic and group) for each
// scenario, cleaning up with t.Cleanup.
func RunSource(t *testing.T, name string, mk func(t testing.TB) SourceHarness, opts ...SourceOption) Report {
	t.Helper()
	return runSuite(t, suiteSource, name, sourceTable(), mk, configure("conformance.RunSource", opts, SourceOption.sourceOption))
}

func source(fn func(s *sscene)) func(c *checker, h SourceHarness) {
	return func(c *checker, h SourceHarness) {
		fn(&sscene{checker: c, h: h, published: map[string]bool{}, first: map[string]effects.Delivery{}, attempt: map[string]int{}})
	}
}

// sscene is one source scenario's run.
type sscene struct {
	*checker
	h         SourceHarness
	published map[string]bool
	order     []string
	first     map[string]effects.Delivery // each id's first delivery, for same
	attempt   map[string]int              // each id's Attempt at its latest delivery, for same
}

// same checks that a delivery of an id delivered before carries the same
// message: the same body, headers and ordering (a redelivery is the
// message again, not a new one made from it), and an Attempt that counts
// it ([sscene.checkAttempt]).
func (s *sscene) same(d effects.Delivery, what string) {
	prev, ok := s.first[d.ID]
	last := s.attempt[d.ID]
	s.attempt[d.ID] = d.Attempt
	if !ok {
		s.first[d.ID] = d
		return
	}
	s.check(bytes.Equal(prev.Body, d.Body), "%s: %q delivered again with another body (%d bytes, first %d)", what, d.ID, len(d.Body), len(prev.Body))
	s.check(maps.Equal(prev.Headers, d.Headers), "%s: %q delivered again with other headers (%v, first %v)", what, d.ID, d.Headers, prev.Headers)
	s.check(prev.Ordering == d.Ordering, "%s: %q delivered again in ordering %q, first in %q", what, d.ID, d.Ordering, prev.Ordering)
	s.checkAttempt(last, d, what)
}

// sinst is one consumer instance.
type sinst struct {
	SourceInstance
	f       *Faults
	name    string
	stopped bool
}

func (s *sscene) open(name string) *sinst {
	f := new(Faults)
	si, err := s.h.Open(s.ctx, f)
	if err != nil {
		s.t.Fatalf("conformance: harness Open: %v", err)
	}
	if si.Source == nil || si.Close == nil {
		s.t.Fatalf("conformance: harness Open returned no Source or no Close")
	}
	i := &sinst{SourceInstance: si, f: f, name: name}
	s.t.Cleanup(func() { s.stop(i, false) })
	return i
}

// stop closes (or crashes) an instance once, bounded by the apply timeout.
func (s *sscene) stop(i *sinst, crash bool) {
	if i.stopped {
		return
	}
	i.stopped = true
	how := "Close"
	fn := i.Close
	if crash {
		how = "a crash"
		fn = i.Crash
		if fn == nil {
			fn = func() { i.f.Sever(); i.Close() }
		}
	}
	done := make(chan struct{})
	go func() { fn(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.applyTimeout):
		i.f.Sever()
		select {
		case <-done:
		case <-time.After(hangGrace):
		}
		s.failf("hang: %s of instance %s did not return within %v", how, i.name, s.cfg.applyTimeout)
	}
}

func (s *sscene) publish(n int) []string {
	ids, err := s.h.Publish(s.ctx, n)
	if err != nil {
		s.fatalf("harness Publish(%d): %v", n, err)
	}
	if len(ids) != n {
		s.fatalf("harness Publish(%d) returned %d ids", n, len(ids))
	}
	for _, id := range ids {
		if s.published[id] {
			s.fatalf("harness Publish returned the id %q twice", id)
		}
		s.published[id] = true
	}
	s.order = append(s.order, ids...)
	return ids
}

func (s *sscene) ack(i *sinst, d effects.Delivery) error {
	_, err := timed(s.checker, i.f, 0, fmt.Sprintf("Ack(%q) on instance %s", d.ID, i.name), func(ctx context.Context) (struct{}, error) {
		return struct{}{}, i.Source.Ack(ctx, d)
	})
	return err
}

// collect calls Next on i until every id in want was delivered (then
// lingers for linger more), or until the redelivery wait ends. Each
// delivery is acked when ackAll is set. It returns the deliveries in the
// order they came.
func (s *sscene) collect(i *sinst, want []string, linger time.Duration, ackAll bool, what string) []effects.Delivery {
	missing := map[string]bool{}
	for _, id := range want {
		missing[id] = true
	}
	var got []effects.Delivery
	deadline := time.Now().Add(s.cfg.redeliveryWait)
	var lingerEnd time.Time
	for {
		end := deadline
		if len(missing) == 0 {
			if lingerEnd.IsZero() {
				lingerEnd = time.Now().Add(linger)
			}
			end = lingerEnd
		}
		if !time.Now().Before(end) {
			break
		}
		d, err := s.next(i, end)
		if err != nil {
			if s.ctx.Err() != nil {
				s.fatalf("%s: the scenario ran out of time: %v", what, s.ctx.Err())
			}
			if !time.Now().Before(end) {
				continue // the wait ended
			}
			s.fatalf("%s: Next on instance %s: %v", what, i.name, err)
		}
		if !s.check(s.published[d.ID], "%s: instance %s delivered %q, which was never published", what, i.name, d.ID) {
			continue
		}
		s.same(d, what)
		got = append(got, d)
		delete(missing, d.ID)
		if ackAll {
			if err := s.ack(i, d); err != nil {
				s.failf("%s: Ack(%q) on instance %s: %v", what, d.ID, i.name, err)
			}
		}
	}
	if len(missing) > 0 {
		ids := make([]string, 0, len(missing))
		for id := range missing {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		s.failf("%s: %d of %d messages were not delivered to instance %s within %v: %s", what, len(ids), len(want), i.name, s.cfg.redeliveryWait, firstFew(ids))
	}
	return got
}

// next calls Next on i with a context that ends at end. A Next that has
// not returned the apply timeout after its context ended is a hang.
func (s *sscene) next(i *sinst, end time.Time) (effects.Delivery, error) {
	ctx, cancel := context.WithDeadline(s.ctx, end)
	defer cancel()
	type result struct {
		d   effects.Delivery
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := i.Source.Next(ctx)
		done <- result{d, err}
	}()
	timer := time.NewTimer(time.Until(end) + s.cfg.applyTimeout)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.d, r.err
	case <-timer.C:
		i.f.Sever()
		s.fatalf("hang: Next on instance %s did not return within %v after its context ended", i.name, s.cfg.applyTimeout)
		return effects.Delivery{}, nil // not reached
	}
}

// takeAll publishes n messages and has a new instance take every one,
// acking none; it fails the scenario if any is missing or delivered twice.
func (s *sscene) takeAll(name string) (*sinst, []effects.Delivery) {
	ids := s.publish(sourceMessages)
	a := s.open(name)
	got := s.collect(a, ids, 0, false, "first delivery")
	seen := map[string]bool{}
	var twice []string
	for _, d := range got {
		if seen[d.ID] {
			twice = append(twice, d.ID)
		}
		seen[d.ID] = true
	}
	s.check(len(twice) == 0, "first delivery: %d messages delivered twice to one instance before any ack or failure: %s", len(twice), firstFew(twice))
	if len(seen) < len(ids) {
		panic(abort{})
	}
	return a, got
}

// idsOf returns the deliveries' ids.
func idsOf(ds []effects.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

// ackedStayAcked: everything acked, a graceful close; a new instance gets
// the new messages and none of the acked ones.
func (s *sscene) ackedStayAcked() {
	a, got := s.takeAll("A")
	for _, d := range got {
		if err := s.ack(a, d); err != nil {
			s.failf("Ack(%q): %v", d.ID, err)
		}
	}
	s.stop(a, false)
	old := map[string]bool{}
	for _, d := range got {
		old[d.ID] = true
	}
	fresh := s.publish(sourceMessages / 2)
	b := s.open("B")
	again := s.collect(b, fresh, time.Second, true, "after every delivery was acked and the instance closed")
	var back []string
	for _, d := range again {
		if old[d.ID] {
			back = append(back, d.ID)
		}
	}
	s.check(len(back) == 0, "%d acked messages were delivered again after a graceful close: %s: the source did not record their acks", len(back), firstFew(back))
}

// unacked: the first half of the deliveries acked, then a close or a
// crash; every unacked one must come back to a new instance.
func (s *sscene) unacked(crash bool) {
	a, got := s.takeAll("A")
	half := len(got) / 2
	for _, d := range got[:half] {
		if err := s.ack(a, d); err != nil {
			s.failf("Ack(%q): %v", d.ID, err)
		}
	}
	how := "a graceful close"
	if crash {
		how = "a crash"
	}
	s.stop(a, crash)
	b := s.open("B")
	want := idsOf(got[half:])
	what := fmt.Sprintf("the %d unacked deliveries after %s", len(want), how)
	// collect holds each redelivery's Attempt to the first's (same): a
	// Consumer's WithMaxAttempts holds across processes only through it.
	s.collect(b, want, 0, true, what)
}

// outOfOrder: in every ordering, the first delivery and one in the middle
// stay unacked (holes); the others are acked in reverse order. After a
// close every hole must come back.
func (s *sscene) outOfOrder() {
	a, got := s.takeAll("A")
	byOrdering := map[string][]effects.Delivery{}
	for _, d := range got {
		byOrdering[d.Ordering] = append(byOrdering[d.Ordering], d)
	}
	var holes []string
	var acks []effects.Delivery
	for _, ds := range byOrdering {
		for j, d := range ds {
			if j == 0 || j == len(ds)/2 {
				holes = append(holes, d.ID)
				continue
			}
			acks = append(acks, d)
		}
	}
	slices.Reverse(acks)
	for _, d := range acks {
		if err := s.ack(a, d); err != nil {
			s.failf("Ack(%q): %v", d.ID, err)
		}
	}
	s.notef("%d orderings; %d holes left unacked, %d acked in reverse order", len(byOrdering), len(holes), len(acks))
	s.stop(a, false)
	s.collect(s.open("B"), holes, 0, true, fmt.Sprintf("the %d holes left by acks out of order", len(holes)))
}

// neverAcked: nothing acked, a graceful close: everything comes back.
func (s *sscene) neverAcked() {
	a, got := s.takeAll("A")
	s.stop(a, false)
	s.collect(s.open("B"), idsOf(got), 0, true, "deliveries never acked, after a graceful close")
}

// revocation: instance A holds every delivery, half acked; instance B
// joins (the group rebalances); A acks the rest late. Whatever no Ack
// confirmed must reach a later instance: a revocation loses nothing.
func (s *sscene) revocation() {
	a, got := s.takeAll("A")
	confirmed := map[string]bool{}
	for j, d := range got {
		if j%2 == 0 {
			if err := s.ack(a, d); err != nil {
				s.failf("Ack(%q) before the rebalance: %v", d.ID, err)
				continue
			}
			confirmed[d.ID] = true
		}
	}
	b := s.open("B")
	var (
		mu     sync.Mutex
		toB    []string
		bErr   error
		wg     sync.WaitGroup
		gotOne = make(chan struct{}, 1)
	)
	bctx, stopB := context.WithCancel(s.ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			d, err := b.Source.Next(bctx)
			if err != nil {
				if bctx.Err() == nil {
					mu.Lock()
					bErr = err
					mu.Unlock()
				}
				return
			}
			mu.Lock()
			toB = append(toB, d.ID)
			if s.published[d.ID] {
				s.same(d, "instance B, after it joined")
			}
			mu.Unlock()
			select {
			case gotOne <- struct{}{}:
			default:
			}
		}
	}()
	wait := min(s.cfg.redeliveryWait, 15*time.Second)
	select {
	case <-gotOne:
	case <-time.After(wait):
	case <-s.ctx.Done():
	}
	late, refused := 0, 0
	for j, d := range got {
		if j%2 == 1 {
			if err := s.ack(a, d); err != nil {
				refused++
				continue
			}
			late++
			confirmed[d.ID] = true
		}
	}
	stopB()
	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(s.cfg.applyTimeout):
		b.f.Sever()
		s.fatalf("hang: Next on instance B did not return within %v after its context was cancelled", s.cfg.applyTimeout)
	}
	if bErr != nil {
		s.failf("Next on instance B: %v", bErr)
	}
	for _, id := range toB {
		s.check(s.published[id], "instance B delivered %q, which was never published", id)
	}
	s.notef("instance B received %d deliveries after joining; A's late acks: %d confirmed, %d refused", len(toB), late, refused)
	if len(toB) == 0 {
		s.notef("instance B received nothing within %v: no rebalance moved work to it", wait)
	}
	s.stop(b, false)
	s.stop(a, false)
	var want []string
	for _, d := range got {
		if !confirmed[d.ID] {
			want = append(want, d.ID)
		}
	}
	s.collect(s.open("C"), want, 0, true, fmt.Sprintf("the %d deliveries no Ack confirmed, after the rebalance", len(want)))
}

// released: for a source that hands deliveries back ([effects.Releaser]),
// instance A releases half of what it holds and acks the rest. Every
// delivery it released must come back to it (it is the only member), and,
// never acked, come back again to a new instance after A closes: a
// Release is no ack. A release the source declines ([effects.ErrNotReleased])
// is not checked.
func (s *sscene) released() {
	a, got := s.takeAll("A")
	rel, ok := a.Source.(effects.Releaser)
	if !ok {
		s.inapplicable("the source does not implement effects.Releaser")
	}
	var released []effects.Delivery
	declined := 0
	for j, d := range got {
		if j%2 == 0 {
			if err := s.ack(a, d); err != nil {
				s.failf("Ack(%q): %v", d.ID, err)
			}
			continue
		}
		_, err := timed(s.checker, a.f, 0, fmt.Sprintf("Release(%q) on instance A", d.ID), func(ctx context.Context) (struct{}, error) {
			return struct{}{}, rel.Release(ctx, d)
		})
		switch {
		case errors.Is(err, effects.ErrNotReleased):
			declined++
		case err != nil:
			s.failf("Release(%q): %v", d.ID, err)
		default:
			released = append(released, d)
		}
	}
	s.notef("%d deliveries released, %d acked, %d releases declined", len(released), len(got)-len(got)/2, declined)
	if len(released) == 0 {
		s.inapplicable("the source declined every Release (effects.ErrNotReleased)")
	}
	ids := idsOf(released)
	s.collect(a, ids, 0, false, fmt.Sprintf("the %d released deliveries, on the instance that released them", len(ids)))
	s.stop(a, false)
	s.collect(s.open("B"), ids, 0, true, fmt.Sprintf("the %d released deliveries, never acked, after a graceful close", len(ids)))
}
