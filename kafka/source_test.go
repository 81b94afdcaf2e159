package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// produceN writes n records to partition 0..parts-1 of topic (round
// robin), with values "v<i>", and a key header on the even ones.
func produceN(t *testing.T, c *kafkatest.Cluster, topic string, n int, parts int32) {
	t.Helper()
	cl := c.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		r := &kgo.Record{Topic: topic, Partition: int32(i) % parts, Value: []byte(fmt.Sprintf("v%d", i))}
		if i%2 == 0 {
			r.Headers = []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte(fmt.Sprintf("id-%d", i))}}
		}
		recs = append(recs, r)
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func newSource(t *testing.T, c *kafkatest.Cluster, group, topic string) *kafka.Source {
	t.Helper()
	s, err := kafka.NewSource(c.Opts(kafkatest.GroupOpts(group, topic)...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// committed returns the group's committed offset of topic/partition, -1
// if none.
func committed(t *testing.T, c *kafkatest.Cluster, group, topic string, p int32) int64 {
	t.Helper()
	offs, err := kadm.NewClient(c.Client(t)).FetchOffsets(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := offs.Lookup(topic, p)
	if !ok {
		return -1
	}
	return o.At
}

func next(t *testing.T, s *kafka.Source) effects.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return d
}

func TestSourceDelivery(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "src", 1)
	produceN(t, c, topic, 2, 1)
	s := newSource(t, c, "g-"+topic, topic)
	d0, d1 := next(t, s), next(t, s)
	if d0.ID != "id-0" {
		t.Errorf("ID %q, want the key header id-0", d0.ID)
	}
	if want := topic + "/0/1"; d1.ID != want {
		t.Errorf("ID %q, want topic/partition/offset %q", d1.ID, want)
	}
	if want := topic + "/0"; d0.Ordering != want || d1.Ordering != want {
		t.Errorf("Ordering %q, %q, want %q", d0.Ordering, d1.Ordering, want)
	}
	if string(d0.Body) != "v0" || d0.Headers[kafka.KeyHeader] != "id-0" {
		t.Errorf("body %q headers %v", d0.Body, d0.Headers)
	}
	if err := s.Ack(context.Background(), effects.Delivery{ID: "forged"}); err == nil {
		t.Error("Ack of a delivery the source did not hand out succeeded")
	}
}

// TestSourceCommitsContiguousPrefix: acking out of order advances the
// committed offset only over the acked prefix (Flush commits the mark at
// once, instead of the next group commit).
func TestSourceCommitsContiguousPrefix(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "prefix", 1)
	group := "g-" + topic
	produceN(t, c, topic, 5, 1)
	s := newSource(t, c, group, topic)
	var ds []effects.Delivery
	for i := 0; i < 5; i++ {
		ds = append(ds, next(t, s))
	}
	ctx := context.Background()
	steps := []struct {
		ack  int
		want int64 // committed offset after the ack; -1 none
	}{
		{2, -1}, // offsets 0 and 1 unacked
		{1, -1},
		{0, 3}, // 0,1,2 acked: commit 3
		{4, 3}, // 3 unacked
		{4, 3}, // acking twice does nothing
		{3, 5},
	}
	for _, st := range steps {
		if err := s.Ack(ctx, ds[st.ack]); err != nil {
			t.Fatalf("Ack offset %d: %v", st.ack, err)
		}
		if err := s.Flush(ctx); err != nil {
			t.Fatalf("Flush: %v", err)
		}
		if got := committed(t, c, group, topic, 0); got != st.want {
			t.Fatalf("after acking offset %d: committed %d, want %d", st.ack, got, st.want)
		}
	}
}

// TestSourceRedeliversUnacked: a handler error (no ack) commits nothing
// past the failed record, and a restarted consumer gets it again.
func TestSourceRedeliversUnacked(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "redeliver", 1)
	group := "g-" + topic
	produceN(t, c, topic, 3, 1)
	ctx := context.Background()

	s := newSource(t, c, group, topic)
	handled := map[string]int{}
	for i := 0; i < 3; i++ {
		d := next(t, s)
		handled[string(d.Body)]++
		if string(d.Body) == "v1" {
			continue // the handler failed: no ack
		}
		if err := s.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, c, group, topic, 0); got != 1 {
		t.Fatalf("committed %d after a failed offset 1, want 1", got)
	}

	s2 := newSource(t, c, group, topic) // the restarted process
	d := next(t, s2)
	if string(d.Body) != "v1" {
		t.Fatalf("restarted consumer got %q first, want the unacked v1", d.Body)
	}
	if err := s2.Ack(ctx, d); err != nil {
		t.Fatal(err)
	}
	d = next(t, s2) // v2 again: acked before, but behind the hole
	if string(d.Body) != "v2" {
		t.Fatalf("got %q, want v2", d.Body)
	}
	if err := s2.Ack(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := s2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, c, group, topic, 0); got != 3 {
		t.Fatalf("committed %d, want 3", got)
	}
}

// TestSourceRevocation: when a second member joins and takes a partition,
// the first commits the acked prefix of the revoked partition, forgets its
// unacked deliveries (their acks report ErrRevoked), and the new owner
// starts at the first unacked record.
func TestSourceRevocation(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "revoke", 2)
	group := "g-" + topic
	produceN(t, c, topic, 8, 2) // 4 records per partition
	ctx := context.Background()

	a := newSource(t, c, group, topic)
	byPart := map[int32][]effects.Delivery{}
	for i := 0; i < 8; i++ {
		d := next(t, a)
		p := partitionOf(d)
		byPart[p] = append(byPart[p], d)
	}
	// In each partition, ack offsets 0 and 2 but not 1: the prefix is 1.
	for _, ds := range byPart {
		for _, i := range []int{0, 2} {
			if err := a.Ack(ctx, ds[i]); err != nil {
				t.Fatal(err)
			}
		}
	}

	d := rebalanceTo(t, a, newSource(t, c, group, topic))
	moved := partitionOf(d)
	if string(d.Body) != string(byPart[moved][1].Body) {
		t.Fatalf("new owner starts at %q, want the first unacked record %q", d.Body, byPart[moved][1].Body)
	}
	if got := committed(t, c, group, topic, moved); got != 1 {
		t.Fatalf("revoked partition committed at %d, want the acked prefix 1", got)
	}
	if err := a.Ack(ctx, byPart[moved][1]); !errors.Is(err, kafka.ErrRevoked) {
		t.Fatalf("ack after revocation: %v, want ErrRevoked", err)
	}
}

// rebalanceTo returns the first delivery of b, a member that joined a's
// group: a keeps polling meanwhile, so that the rebalance reaches it. The
// delivery's partition is one that moved from a to b.
func rebalanceTo(t *testing.T, a, b *kafka.Source) effects.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			if _, err := a.Next(ctx); err != nil {
				return
			}
		}
	}()
	defer func() { cancel(); <-polled }()
	d, err := b.Next(ctx)
	if err != nil {
		t.Fatalf("second member got nothing: %v", err)
	}
	return d
}

func partitionOf(d effects.Delivery) int32 {
	var p int32
	fmt.Sscanf(d.Ordering[len(d.Ordering)-1:], "%d", &p)
	return p
}
