package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/effects"
)

// memLog is an in-memory partitioned log with one consumer group: the
// reference Source the source suite is proven on. Members get partitions
// round robin; a join or a leave rebalances, committing the revoked
// partitions' contiguous acked prefix and forgetting the rest. An Ack
// commits its partition's contiguous acked prefix at once.
type memLog struct {
	// skipHoles is the bug the out-of-order scenario exists for: an Ack
	// commits past itself even when an earlier delivery is unacked.
	skipHoles bool
	// revokeCommitsAll is the bug the revocation scenario exists for: a
	// revoked partition is committed up to everything delivered, acked or
	// not.
	revokeCommitsAll bool

	mu        sync.Mutex
	parts     [][]string
	committed []int // next offset the group consumes, per partition
	members   []*memSource
	published int
}

var errMemRevoked = errors.New("memlog: partition revoked")

func newMemLog(partitions int) *memLog {
	return &memLog{parts: make([][]string, partitions), committed: make([]int, partitions)}
}

// memSource is one member of memLog's group.
type memSource struct {
	log      *memLog
	assigned map[int]*memPart
	epoch    int
	closed   bool
	rr       int
}

type memPart struct {
	epoch   int
	pos     int // next offset to hand out
	pending []*memDelivery
	retry   []*memDelivery // released, to hand out again before pos
}

type memDelivery struct {
	part, off, epoch int
	acked            bool
}

func (l *memLog) Publish(_ context.Context, n int) ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]string, n)
	for i := range ids {
		l.published++
		ids[i] = fmt.Sprintf("msg-%d", l.published)
		p := l.published % len(l.parts)
		l.parts[p] = append(l.parts[p], ids[i])
	}
	return ids, nil
}

// Orderings and PublishTo make the log a conformance.OrderingPublisher.
func (l *memLog) Orderings() int { return len(l.parts) }

func (l *memLog) PublishTo(_ context.Context, k, n int) ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]string, n)
	for i := range ids {
		l.published++
		ids[i] = fmt.Sprintf("msg-%d", l.published)
		l.parts[k] = append(l.parts[k], ids[i])
	}
	return ids, nil
}

func (l *memLog) Open(context.Context, *conformance.Faults) (conformance.SourceInstance, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := &memSource{log: l, assigned: map[int]*memPart{}}
	l.members = append(l.members, m)
	l.rebalanceLocked()
	leave := func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if m.closed {
			return
		}
		m.closed = true
		for i, o := range l.members {
			if o == m {
				l.members = append(l.members[:i], l.members[i+1:]...)
				break
			}
		}
		m.assigned = map[int]*memPart{}
		l.rebalanceLocked()
	}
	// Acks commit at once, so a crash loses nothing a close would have
	// committed: both leave the group.
	return conformance.SourceInstance{Source: m, Close: leave, Crash: leave}, nil
}

// rebalanceLocked assigns partition p to member p mod len(members).
func (l *memLog) rebalanceLocked() {
	for p := range l.parts {
		var owner *memSource
		if len(l.members) > 0 {
			owner = l.members[p%len(l.members)]
		}
		for _, m := range l.members {
			if m != owner && m.assigned[p] != nil {
				if l.revokeCommitsAll {
					l.committed[p] = max(l.committed[p], m.assigned[p].pos)
				}
				l.commitLocked(p, m.assigned[p])
				delete(m.assigned, p)
				m.epoch++
			}
		}
		if owner != nil && owner.assigned[p] == nil {
			owner.epoch++
			owner.assigned[p] = &memPart{epoch: owner.epoch, pos: l.committed[p]}
		}
	}
}

// commitLocked commits the contiguous acked prefix of mp.
func (l *memLog) commitLocked(p int, mp *memPart) {
	for len(mp.pending) > 0 && mp.pending[0].acked {
		l.committed[p] = max(l.committed[p], mp.pending[0].off+1)
		mp.pending = mp.pending[1:]
	}
}

func (m *memSource) Next(ctx context.Context) (effects.Delivery, error) {
	for {
		m.log.mu.Lock()
		if m.closed {
			m.log.mu.Unlock()
			return effects.Delivery{}, errors.New("memlog: closed")
		}
		for range len(m.log.parts) {
			p := m.rr % len(m.log.parts)
			m.rr++
			mp := m.assigned[p]
			if mp == nil || (len(mp.retry) == 0 && mp.pos >= len(m.log.parts[p])) {
				continue
			}
			var d *memDelivery
			if len(mp.retry) > 0 {
				d, mp.retry = mp.retry[0], mp.retry[1:]
			} else {
				d = &memDelivery{part: p, off: mp.pos, epoch: mp.epoch}
				mp.pending = append(mp.pending, d)
				mp.pos++
			}
			id := m.log.parts[p][d.off]
			m.log.mu.Unlock()
			return effects.Delivery{ID: id, Ordering: fmt.Sprintf("p%d", p), Token: d}, nil
		}
		m.log.mu.Unlock()
		select {
		case <-ctx.Done():
			return effects.Delivery{}, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func (m *memSource) Ack(_ context.Context, d effects.Delivery) error {
	md := d.Token.(*memDelivery)
	m.log.mu.Lock()
	defer m.log.mu.Unlock()
	mp := m.assigned[md.part]
	if mp == nil || mp.epoch != md.epoch {
		return errMemRevoked
	}
	md.acked = true
	if m.log.skipHoles {
		m.log.committed[md.part] = max(m.log.committed[md.part], md.off+1)
		return nil
	}
	m.log.commitLocked(md.part, mp)
	return nil
}

// Release hands d out again (before anything new from its partition),
// unacked.
func (m *memSource) Release(_ context.Context, d effects.Delivery) error {
	md := d.Token.(*memDelivery)
	m.log.mu.Lock()
	defer m.log.mu.Unlock()
	mp := m.assigned[md.part]
	switch {
	case mp == nil || mp.epoch != md.epoch:
		return errMemRevoked
	case md.acked:
		return errors.New("memlog: released after its ack")
	}
	mp.retry = append(mp.retry, md)
	return nil
}
