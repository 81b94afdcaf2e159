package kafka_test

// Tests of the Source's fairness, its per-partition bound and its group
// commit, against kfake: the commit tests watch every OffsetCommit request
// on its arrival at the broker.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// produceRuns writes per records to each partition, partition after
// partition (long runs of one partition, as a fetch returns them).
func produceRuns(t *testing.T, c *kafkatest.Cluster, topic string, parts int32, per int) {
	t.Helper()
	cl := c.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var recs []*kgo.Record
	for p := range parts {
		for i := range per {
			recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Value: fmt.Appendf(nil, "p%d-%d", p, i)})
		}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func newSourceWith(t *testing.T, c *kafkatest.Cluster, group, topic string, opts ...kafka.SourceOption) *kafka.Source {
	t.Helper()
	s, err := kafka.NewSource(c.Opts(kafkatest.GroupOpts(group, topic)...), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// commitRequest is one partition of an OffsetCommit request, as the
// broker received it.
type commitRequest struct {
	member    string
	partition int32
	offset    int64
	request   int // the request's number, from 1
}

// commitWatch records the OffsetCommit requests of a group for a topic and
// runs check on each partition of each, on the broker's loop, before the
// broker handles the request. fail, if set and returning true, makes the
// broker refuse the request.
type commitWatch struct {
	mu       sync.Mutex
	requests int
	parts    []commitRequest
	check    func(commitRequest)
	fail     func() bool
}

func watchCommits(t *testing.T, fake *kfake.Cluster, group, topic string) *commitWatch {
	w := &commitWatch{}
	id := fake.TopicInfo(topic).TopicID
	fake.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		r, ok := req.(*kmsg.OffsetCommitRequest)
		if !ok || r.Group != group {
			return nil, nil, false
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.requests++
		for _, tp := range r.Topics {
			if tp.Topic != topic && tp.TopicID != id { // OffsetCommit v10 names topics by id
				continue
			}
			for _, p := range tp.Partitions {
				cr := commitRequest{member: r.MemberID, partition: p.Partition, offset: p.Offset, request: w.requests}
				w.parts = append(w.parts, cr)
				if w.check != nil {
					w.check(cr)
				}
			}
		}
		if w.fail != nil && w.fail() {
			resp := r.ResponseKind().(*kmsg.OffsetCommitResponse)
			for _, tp := range r.Topics {
				rt := kmsg.NewOffsetCommitResponseTopic()
				rt.Topic, rt.TopicID = tp.Topic, tp.TopicID
				for _, p := range tp.Partitions {
					rp := kmsg.NewOffsetCommitResponseTopicPartition()
					rp.Partition = p.Partition
					rp.ErrorCode = kerr.InvalidCommitOffsetSize.Code
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
			return resp, nil, true
		}
		return nil, nil, false // observed: the broker commits as usual
	})
	return w
}

// commitFixture is a topic filled with produceRuns, its group, and a watch
// on the group's commits.
type commitFixture struct {
	c            *kafkatest.Cluster
	topic, group string
	w            *commitWatch
}

func newCommitFixture(t *testing.T, prefix string, parts int32, per int) commitFixture {
	t.Helper()
	c := kafkatest.Start(t)
	fake := c.RequireFake(t)
	topic := c.Topic(t, prefix, parts)
	group := "g-" + topic
	produceRuns(t, c, topic, parts, per)
	return commitFixture{c: c, topic: topic, group: group, w: watchCommits(t, fake, group, topic)}
}

// set installs check and fail (see commitWatch).
func (w *commitWatch) set(check func(commitRequest), fail func() bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.check, w.fail = check, fail
}

func (w *commitWatch) snapshot() (requests int, parts []commitRequest) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.requests, slices.Clone(w.parts)
}

// TestSourceFairAcrossPartitions: a fetch returns long runs of one
// partition, but Next takes turns between the partitions.
func TestSourceFairAcrossPartitions(t *testing.T) {
	c := kafkatest.Start(t)
	const parts, per = 4, 200
	topic := c.Topic(t, "fair", parts)
	produceRuns(t, c, topic, parts, per)
	s := newSourceWith(t, c, "g-"+topic, topic)
	// The first Next starts fetching; the test then lets the background
	// poller fetch every partition (a fetch may bring them one after the
	// other) before it looks at the order Next hands them out in.
	seen := map[int32]int{partitionOf(next(t, s)): 1}
	time.Sleep(time.Second)
	var order []int32
	for range 199 {
		p := partitionOf(next(t, s))
		seen[p]++
		order = append(order, p)
	}
	for p := range int32(parts) {
		if seen[p] < 20 {
			t.Errorf("partition %d got %d of the first 200 deliveries (order %v); want turns between partitions", p, seen[p], order)
		}
	}
}

// TestSourceBoundsEachPartition: a partition whose deliveries are not
// acked gets no more than WithMaxPendingPerPartition handed out, and its
// fetching pauses, while another partition flows; acks resume it.
func TestSourceBoundsEachPartition(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "bound", 2)
	produceRuns(t, c, topic, 2, 100)
	const limit = 10
	s := newSourceWith(t, c, "g-"+topic, topic, kafka.WithMaxPendingPerPartition(limit))
	ctx := context.Background()
	var stuck []effects.Delivery // partition 0: never acked yet
	flowed := 0
	for len(stuck) < limit || flowed < 100 {
		d := next(t, s)
		if partitionOf(d) == 0 {
			stuck = append(stuck, d)
			if len(stuck) > limit {
				t.Fatalf("partition 0 handed out %d unacked deliveries, bound %d", len(stuck), limit)
			}
			continue
		}
		flowed++
		if err := s.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	paused := s.Client().PauseFetchPartitions(nil)
	if !slices.Contains(paused[topic], 0) {
		t.Errorf("paused partitions %v; want partition 0, which holds its bound", paused)
	}
	// Partition 1 is drained; nothing may come: partition 0 holds its
	// bound.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	d, err := s.Next(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next = %s, %v; want nothing while partition 0 holds its bound", d.ID, err)
	}
	// Acking half of the stuck ones lets Next hand out partition 0's next
	// records again.
	for _, d := range stuck[:limit/2] {
		if err := s.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	want := fmt.Sprintf("%s/0/%d", topic, limit)
	if d := next(t, s); d.ID != want {
		t.Errorf("after the acks got %s, want %s", d.ID, want)
	}
	// Draining partition 0 brings it under half its bound: it is resumed.
	for _, d := range stuck[limit/2:] {
		if err := s.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for range 100 - limit - 1 {
		if err := s.Ack(ctx, next(t, s)); err != nil {
			t.Fatal(err)
		}
	}
	if paused := s.Client().PauseFetchPartitions(nil); slices.Contains(paused[topic], 0) {
		t.Errorf("partition 0 still paused with nothing left pending: %v", paused)
	}
}

// TestSourceGroupCommit: acks do not each send an OffsetCommit: one
// request carries every advanced partition, at most one per commit
// interval, and the committed offsets reach the end.
func TestSourceGroupCommit(t *testing.T) {
	const parts, per = 4, 250
	f := newCommitFixture(t, "group-commit", parts, per)
	c, topic, group, w := f.c, f.topic, f.group, f.w
	s := newSourceWith(t, c, group, topic, kafka.WithCommitInterval(20*time.Millisecond))
	ctx := context.Background()
	for range parts * per {
		if err := s.Ack(ctx, next(t, s)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the group commit of every partition", func() bool {
		for p := range int32(parts) {
			if committed(t, c, group, topic, p) != per {
				return false
			}
		}
		return true
	})
	requests, ps := w.snapshot()
	if requests == 0 || requests > parts*per/10 {
		t.Errorf("%d OffsetCommit requests for %d acks; want a few, each carrying many acks", requests, parts*per)
	}
	perRequest := map[int]int{}
	for _, cr := range ps {
		perRequest[cr.request]++
	}
	most := 0
	for _, n := range perRequest {
		most = max(most, n)
	}
	if most < 2 {
		t.Errorf("no request carried two partitions: %v", ps)
	}
	t.Logf("%d acks, %d OffsetCommit requests", parts*per, requests)
}

// TestSourceGroupCommitNeverPastUnacked: records are acked in a random
// order with one record that is never acked; every partition of every
// OffsetCommit request is checked, on its arrival, against the acks made
// so far: none may pass an unacked record. The partition with the
// record that "fails forever" stays behind it while the others reach the
// end, also through Close.
func TestSourceGroupCommitNeverPastUnacked(t *testing.T) {
	const parts, per = 3, 200
	f := newCommitFixture(t, "never-past", parts, per)
	c, topic, group, w := f.c, f.topic, f.group, f.w
	const stuckPart, stuckOffset = 1, 57

	var mu sync.Mutex
	acked := map[int32]map[int64]bool{}
	for p := range int32(parts) {
		acked[p] = map[int64]bool{}
	}
	var violations []string
	w.set(func(cr commitRequest) {
		mu.Lock()
		defer mu.Unlock()
		for o := range cr.offset {
			if !acked[cr.partition][o] {
				violations = append(violations, fmt.Sprintf("partition %d committed at %d with offset %d unacked", cr.partition, cr.offset, o))
				return
			}
		}
	}, nil)

	s := newSourceWith(t, c, group, topic, kafka.WithCommitInterval(time.Millisecond), kafka.WithMaxPendingPerPartition(per))
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	var held []effects.Delivery
	ack := func(d effects.Delivery) {
		p, o := partitionOf(d), offsetOf(t, d)
		if p == stuckPart && o == stuckOffset {
			return // its handler fails forever
		}
		mu.Lock()
		acked[p][o] = true // before the Ack: a commit may follow at once
		mu.Unlock()
		if err := s.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for range parts * per {
		held = append(held, next(t, s))
		// Ack a random held delivery now and then: out of order.
		for len(held) > 0 && rng.IntN(3) > 0 {
			i := rng.IntN(len(held))
			ack(held[i])
			held = slices.Delete(held, i, i+1)
		}
	}
	for _, d := range held {
		ack(d)
	}
	waitFor(t, 10*time.Second, "the other partitions' group commits", func() bool {
		return committed(t, c, group, topic, 0) == per && committed(t, c, group, topic, 2) == per
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, c, group, topic, stuckPart); got != stuckOffset {
		t.Errorf("partition %d committed at %d; want %d, held back by the record that was never acked", stuckPart, got, stuckOffset)
	}
	requests, _ := w.snapshot()
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Errorf("%d commits past unacked records, first: %s", len(violations), violations[0])
	}
	t.Logf("%d OffsetCommit requests checked", requests)
}

// TestSourceRevokedAcksAreDropped: after a revocation, the acks of the
// revoked partition's deliveries get ErrRevoked and are never committed by
// this member, not by a later group commit nor by Close; the new owner
// starts at the first record the old one had not acked at the revocation.
func TestSourceRevokedAcksAreDropped(t *testing.T) {
	f := newCommitFixture(t, "revoked-acks", 2, 6)
	c, topic, group, w := f.c, f.topic, f.group, f.w
	ctx := context.Background()

	a := newSourceWith(t, c, group, topic, kafka.WithCommitInterval(time.Millisecond))
	byPart := map[int32][]effects.Delivery{}
	for range 12 {
		d := next(t, a)
		byPart[partitionOf(d)] = append(byPart[partitionOf(d)], d)
	}
	for _, ds := range byPart {
		for _, d := range ds[:2] { // each partition's mark: 2
			if err := a.Ack(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
	}
	aMember, _ := a.Client().GroupMetadata()

	d := rebalanceTo(t, a, newSourceWith(t, c, group, topic))
	moved := partitionOf(d)
	if want := fmt.Sprintf("%s/%d/2", topic, moved); d.ID != want {
		t.Fatalf("new owner starts at %s, want %s", d.ID, want)
	}
	// The old owner's remaining acks of the moved partition are dropped.
	for _, d := range byPart[moved][2:] {
		if err := a.Ack(ctx, d); !errors.Is(err, kafka.ErrRevoked) {
			t.Errorf("ack of %s after the revocation: %v, want ErrRevoked", d.ID, err)
		}
	}
	kept := 1 - moved
	for _, d := range byPart[kept][2:] {
		if err := a.Ack(ctx, d); err != nil {
			t.Fatalf("ack of %s, a partition a kept: %v", d.ID, err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	_, ps := w.snapshot()
	for _, cr := range ps {
		if cr.member == aMember && cr.partition == moved && cr.offset > 2 {
			t.Errorf("the old owner committed the revoked partition %d at %d, past its mark at the revocation", moved, cr.offset)
		}
	}
	if got := committed(t, c, group, topic, moved); got != 2 {
		t.Errorf("revoked partition committed at %d, want 2 (the new owner acked nothing)", got)
	}
	if got := committed(t, c, group, topic, kept); got != 6 {
		t.Errorf("kept partition committed at %d, want 6", got)
	}
}

// TestSourceRetriesFailedCommits: a group commit the broker refuses is
// reported to the observer (a failed event of kafka.Source) and retried, and Flush returns the
// broker's error while it refuses.
func TestSourceRetriesFailedCommits(t *testing.T) {
	f := newCommitFixture(t, "commit-errors", 1, 5)
	c, topic, group, w := f.c, f.topic, f.group, f.w
	var mu sync.Mutex
	refuse := true
	w.set(nil, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return refuse
	})
	reported := make(chan error, 100)
	s := newSourceWith(t, c, group, topic, kafka.WithCommitInterval(time.Millisecond),
		kafka.WithObserver(effects.ObserverFunc(func(_ context.Context, ev effects.Event) {
			if ev.Kind != effects.EventFailed || ev.Component != "kafka.Source" {
				t.Errorf("observed %v of %q, want failed of kafka.Source", ev.Kind, ev.Component)
			}
			select {
			case reported <- ev.Err:
			default:
			}
		})))
	ctx := context.Background()
	for range 5 {
		if err := s.Ack(ctx, next(t, s)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-reported:
		if !errors.Is(err, kerr.InvalidCommitOffsetSize) {
			t.Errorf("reported %v, want the broker's refusal", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a refused group commit was not reported")
	}
	if err := s.Flush(ctx); err == nil || !strings.Contains(err.Error(), "INVALID_COMMIT_OFFSET_SIZE") {
		t.Errorf("Flush while the broker refuses = %v, want its error", err)
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	waitFor(t, 20*time.Second, "the retried group commit", func() bool { return committed(t, c, group, topic, 0) == 5 })
}

// offsetOf parses the offset out of a Delivery.ID topic/partition/offset.
func offsetOf(t *testing.T, d effects.Delivery) int64 {
	t.Helper()
	var o int64
	if _, err := fmt.Sscanf(d.ID[strings.LastIndexByte(d.ID, '/')+1:], "%d", &o); err != nil {
		t.Fatalf("delivery id %q: %v", d.ID, err)
	}
	return o
}
