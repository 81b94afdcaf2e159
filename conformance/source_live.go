package conformance

import (
	"fmt"
	"time"

	"effectively.dev/effects"
)

// caughtUp is how long the published-while-running scenario lets an
// instance find nothing new before it publishes more: long enough for a
// source to have read to the end and idle.
const caughtUp = 500 * time.Millisecond

// positions maps every published id to its place in publish order.
func (s *sscene) positions() map[string]int {
	pos := make(map[string]int, len(s.order))
	for i, id := range s.order {
		pos[id] = i
	}
	return pos
}

// inOrder checks that, within every Ordering, ds came in publish order
// (later deliveries of an id already seen in ds are not judged). An
// empty Ordering promises no order and is not checked.
func (s *sscene) inOrder(ds []effects.Delivery, what string) {
	pos := s.positions()
	last := map[string]effects.Delivery{}
	seen := map[string]bool{}
	for _, d := range ds {
		if d.Ordering == "" || seen[d.ID] {
			continue
		}
		seen[d.ID] = true
		if prev, ok := last[d.Ordering]; ok && pos[d.ID] < pos[prev.ID] {
			s.failf("%s: in ordering %q, %q (published %d) was delivered after %q (published %d): a source hands out an ordering's messages in publish order",
				what, d.Ordering, d.ID, pos[d.ID]+1, prev.ID, pos[prev.ID]+1)
			return
		}
		last[d.Ordering] = d
	}
	s.row.checked()
}

// publishOrder: every delivery, first and again, comes in publish order
// within its Ordering. Instance A takes everything and acks the first
// half of each ordering; after a close, B gets the rest in order.
func (s *sscene) publishOrder() {
	a, got := s.takeAll("A")
	s.inOrder(got, "first delivery")
	byOrdering := map[string][]effects.Delivery{}
	for _, d := range got {
		byOrdering[d.Ordering] = append(byOrdering[d.Ordering], d)
	}
	var rest []string
	for _, ds := range byOrdering {
		for j, d := range ds {
			if j < len(ds)/2 {
				if err := s.ack(a, d); err != nil {
					s.failf("Ack(%q): %v", d.ID, err)
				}
				continue
			}
			rest = append(rest, d.ID)
		}
	}
	s.notef("%d orderings; %d deliveries acked (the first half of each), %d left", len(byOrdering), len(got)-len(rest), len(rest))
	s.stop(a, false)
	again := s.collect(s.open("B"), rest, 0, true, fmt.Sprintf("the %d unacked deliveries after a graceful close", len(rest)))
	s.inOrder(again, "redelivery")
}

// livePublish: an instance that has read everything and idled for a
// while must still get what is published next. A source that fixes its
// end offsets when it starts (or stops once it caught up) passes every
// scenario that publishes before it opens.
func (s *sscene) livePublish() {
	before := s.publish(sourceMessages / 2)
	a := s.open("A")
	s.collect(a, before, caughtUp, true, "messages published before the instance started")
	after := s.publish(sourceMessages - len(before))
	got := s.collect(a, after, 0, true, fmt.Sprintf("messages published while the instance ran, after it idled %v", caughtUp))
	s.inOrder(got, "messages published while the instance ran")
}

// closeWithPrefetched: instance A is handed a quarter of the messages and
// acks them, while the rest are published and may sit fetched in its
// buffers; a graceful close must commit no further than what was handed
// out and acked, so a new instance gets every other message.
func (s *sscene) closeWithPrefetched() {
	ids := s.publish(sourceMessages)
	a := s.open("A")
	take := max(len(ids)/4, 1)
	handed := map[string]bool{}
	end := time.Now().Add(s.cfg.redeliveryWait)
	for len(handed) < take {
		d, err := s.next(a, end)
		if err != nil {
			s.fatalf("Next on instance A (%d of %d taken): %v", len(handed), take, err)
		}
		if !s.check(s.published[d.ID], "instance A delivered %q, which was never published", d.ID) {
			continue
		}
		s.same(d, "first delivery")
		handed[d.ID] = true
		if err := s.ack(a, d); err != nil {
			s.failf("Ack(%q): %v", d.ID, err)
		}
	}
	s.stop(a, false)
	var rest []string
	for _, id := range ids {
		if !handed[id] {
			rest = append(rest, id)
		}
	}
	s.collect(s.open("B"), rest, 0, true, fmt.Sprintf("the %d messages never handed out, after instance A took and acked %d and closed", len(rest), len(handed)))
}
