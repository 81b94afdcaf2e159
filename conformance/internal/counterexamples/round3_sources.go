package counterexamples

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"effectively.dev/effects"
)

// Sources of round 3: a partitioned log with one consumer group
// ([FetchLog]) whose members fetch ahead of their handlers, as a Kafka
// client does, and rebalance eagerly (a join or a leave revokes every
// partition from every member, then assigns partition p to member p mod
// n). The log keeps each record's delivery count (Delivery.Attempt, from
// 1) in the group's offset-commit metadata, updated as members hand
// records out. Members commit their marks (the contiguous acked prefix)
// at every poll, in the revoke callback and on Close; a crash commits
// nothing. Honest as opened by [HonestFetchLog]; each liar is one
// plausible bug in the rebalance path, where the first source scenarios,
// which rebalance with empty fetch buffers, never looked:
//
//   - [ResumeAtFetchPosition]: after a rebalance, fetches a partition it
//     gets back from its own fetch position instead of the committed
//     offset, having dropped its buffer: what it had fetched and not yet
//     handed out, or handed out and not acked, is skipped, and its next
//     ack commits past it.
//   - [CommitFetchedWhenIdle]: the revoke callback commits a partition's
//     fetch position when every delivery handed out was acked, taking
//     "nothing in flight" for "everything fetched was handled": the
//     fetched records not handed out are lost.
//   - [StalledIdleCommit]: the poll's commit and the revoke callback's
//     commit only the partitions whose last fetch returned records: an
//     idle partition's last acks are never committed before a
//     rebalance, and its acked records come back to the next owner.
//   - [AttemptsLostOnRevoke]: the revoke callback commits the offsets
//     with empty metadata, erasing the delivery counts: the partition's
//     next owner reports Attempt 1 for records already delivered.
//
// Each is caught by rebalance-full-buffers.
type SourceLiar struct {
	Name string
	bug  sourceBug
}

type sourceBug int

const (
	sourceHonest sourceBug = iota
	bugResumeAtFetchPosition
	bugCommitFetchedWhenIdle
	bugStalledIdleCommit
	bugAttemptsLostOnRevoke
)

// The honest fetch log and the liars of round 3's sources.
var (
	HonestFetchLog        = SourceLiar{Name: "honest-fetch-log"}
	ResumeAtFetchPosition = SourceLiar{Name: "resume-at-fetch-position", bug: bugResumeAtFetchPosition}
	CommitFetchedWhenIdle = SourceLiar{Name: "commit-fetched-when-idle", bug: bugCommitFetchedWhenIdle}
	StalledIdleCommit     = SourceLiar{Name: "stalled-idle-commit", bug: bugStalledIdleCommit}
	AttemptsLostOnRevoke  = SourceLiar{Name: "attempts-lost-on-revoke", bug: bugAttemptsLostOnRevoke}

	// SourceLiars lists the liars.
	SourceLiars = []SourceLiar{ResumeAtFetchPosition, CommitFetchedWhenIdle, StalledIdleCommit, AttemptsLostOnRevoke}
)

// FetchAhead is how many records a [FetchLog] member fetches ahead of its
// handlers per partition.
const FetchAhead = 64

// ErrFetchRevoked is what a [FetchMember]'s Ack returns for a delivery
// whose partition was revoked since it was handed out: the partition's
// next owner delivers the record again.
var ErrFetchRevoked = errors.New("fetchlog: partition revoked before the ack")

// FetchLog is an in-memory partitioned log with one consumer group; see
// [SourceLiar] for how its members behave.
type FetchLog struct {
	bug sourceBug

	mu        sync.Mutex
	parts     [][]string
	committed []int
	counts    []map[int]int // per partition: delivery counts by offset (the commit metadata)
	members   []*FetchMember
	published int
}

// NewLog returns an empty log of n partitions whose members behave as l.
func (l SourceLiar) NewLog(n int) *FetchLog {
	g := &FetchLog{bug: l.bug, parts: make([][]string, n), committed: make([]int, n), counts: make([]map[int]int, n)}
	for p := range g.counts {
		g.counts[p] = map[int]int{}
	}
	return g
}

// Partitions returns the log's number of partitions.
func (g *FetchLog) Partitions() int { return len(g.parts) }

// Publish appends n records round robin over the partitions and returns
// their ids.
func (g *FetchLog) Publish(n int) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = g.appendLocked(g.published % len(g.parts))
	}
	return ids
}

// PublishTo appends n records to partition p and returns their ids.
func (g *FetchLog) PublishTo(p, n int) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = g.appendLocked(p)
	}
	return ids
}

func (g *FetchLog) appendLocked(p int) string {
	g.published++
	id := fmt.Sprintf("rec-%d", g.published)
	g.parts[p] = append(g.parts[p], id)
	return id
}

// FetchMember is one member of a [FetchLog]'s group: an [effects.Source].
type FetchMember struct {
	g         *FetchLog
	parts     map[int]*fetchPart
	epoch     int
	left      bool
	rr        int
	lastFetch map[int]int  // ResumeAtFetchPosition: the fetch position of each partition at its revocation
	active    map[int]bool // StalledIdleCommit: partitions whose last fetch returned records
}

type fetchPart struct {
	epoch    int
	fetchPos int   // next offset to fetch
	buf      []int // offsets fetched, not handed out
	pending  []*fetchDelivery
	mark     int // offset after the contiguous acked prefix
}

type fetchDelivery struct {
	part, off, epoch int
	acked            bool
}

// Join adds a member to the group, which rebalances.
func (g *FetchLog) Join() *FetchMember {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := &FetchMember{g: g, parts: map[int]*fetchPart{}, lastFetch: map[int]int{}, active: map[int]bool{}}
	g.members = append(g.members, m)
	g.rebalanceLocked()
	return m
}

// rebalanceLocked revokes every partition from every member (each
// member's revoke callback commits), then assigns partition p to member
// p mod n.
func (g *FetchLog) rebalanceLocked() {
	for _, m := range g.members {
		for p, fp := range m.parts {
			m.revokeLocked(p, fp)
		}
		m.parts = map[int]*fetchPart{}
		m.epoch++
	}
	if len(g.members) == 0 {
		return
	}
	for p := range g.parts {
		m := g.members[p%len(g.members)]
		pos := g.committed[p]
		if last, ok := m.lastFetch[p]; ok && g.bug == bugResumeAtFetchPosition {
			pos = max(pos, last) // the client's position, kept across the rebalance
		}
		m.parts[p] = &fetchPart{epoch: m.epoch, fetchPos: pos, mark: g.committed[p]}
	}
}

// revokeLocked is the member's revoke callback for partition p.
func (m *FetchMember) revokeLocked(p int, fp *fetchPart) {
	g := m.g
	m.lastFetch[p] = fp.fetchPos
	inFlight := false
	for _, d := range fp.pending {
		inFlight = inFlight || !d.acked
	}
	switch {
	case g.bug == bugCommitFetchedWhenIdle && !inFlight:
		g.commitLocked(p, fp.fetchPos)
	case g.bug == bugStalledIdleCommit && !m.active[p]:
	default:
		g.commitLocked(p, fp.mark)
	}
	if g.bug == bugAttemptsLostOnRevoke {
		g.counts[p] = map[int]int{} // committed with empty metadata
	}
}

func (g *FetchLog) commitLocked(p, off int) {
	g.committed[p] = max(g.committed[p], off)
}

// pollLocked commits the marks and fetches up to FetchAhead records per
// partition.
func (m *FetchMember) pollLocked() {
	g := m.g
	for p, fp := range m.parts {
		if g.bug != bugStalledIdleCommit || m.active[p] {
			g.commitLocked(p, fp.mark)
		}
	}
	for p, fp := range m.parts {
		n := 0
		for len(fp.buf) < FetchAhead && fp.fetchPos < len(g.parts[p]) {
			fp.buf = append(fp.buf, fp.fetchPos)
			fp.fetchPos++
			n++
		}
		m.active[p] = n > 0
	}
}

// Next hands out the next fetched record, the partitions taking turns.
func (m *FetchMember) Next(ctx context.Context) (effects.Delivery, error) {
	g := m.g
	for {
		g.mu.Lock()
		if m.left {
			g.mu.Unlock()
			return effects.Delivery{}, errors.New("fetchlog: member left the group")
		}
		m.pollLocked()
		for range len(g.parts) {
			p := m.rr % len(g.parts)
			m.rr++
			fp := m.parts[p]
			if fp == nil || len(fp.buf) == 0 {
				continue
			}
			off := fp.buf[0]
			fp.buf = fp.buf[1:]
			d := &fetchDelivery{part: p, off: off, epoch: fp.epoch}
			fp.pending = append(fp.pending, d)
			g.counts[p][off]++
			out := effects.Delivery{ID: g.parts[p][off], Ordering: fmt.Sprintf("p%d", p), Body: []byte(g.parts[p][off]),
				Attempt: g.counts[p][off], Token: d}
			g.mu.Unlock()
			return out, nil
		}
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return effects.Delivery{}, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Ack marks d handled and advances its partition's mark; the next poll,
// revocation or Close commits it.
func (m *FetchMember) Ack(_ context.Context, d effects.Delivery) error {
	fd, ok := d.Token.(*fetchDelivery)
	if !ok {
		return errors.New("fetchlog: delivery not handed out by this member")
	}
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	fp := m.parts[fd.part]
	if m.left || fp == nil || fp.epoch != fd.epoch {
		return ErrFetchRevoked
	}
	fd.acked = true
	for len(fp.pending) > 0 && fp.pending[0].acked {
		fp.mark = fp.pending[0].off + 1
		fp.pending = fp.pending[1:]
	}
	return nil
}

// Close commits every mark and leaves the group, which rebalances.
func (m *FetchMember) Close() {
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	if m.left {
		return
	}
	for p, fp := range m.parts {
		m.g.commitLocked(p, fp.mark)
	}
	m.leaveLocked()
}

// Crash leaves the group without committing anything.
func (m *FetchMember) Crash() {
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	if !m.left {
		m.leaveLocked()
	}
}

func (m *FetchMember) leaveLocked() {
	g := m.g
	m.left = true
	m.parts = map[int]*fetchPart{}
	for i, o := range g.members {
		if o == m {
			g.members = append(g.members[:i], g.members[i+1:]...)
			break
		}
	}
	g.rebalanceLocked()
}
