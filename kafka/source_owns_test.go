package kafka_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/kafka/kafkatest"
)

// TestSourceOwnsDropsRevokedDeliveries: a member whose Consumer holds a
// queue of deliveries loses half its partitions to a member that joins;
// the Consumer drops the queued deliveries of the moved partitions
// (Source.Owns is false) instead of running their handlers, and still
// handles those of the partitions it kept.
func TestSourceOwnsDropsRevokedDeliveries(t *testing.T) {
	const parts, per = 4, 40
	c := kafkatest.Start(t)
	topic := c.Topic(t, "owns", parts)
	group := "g-" + topic
	produceRuns(t, c, topic, parts, per)
	a := newSource(t, c, group, topic)

	var (
		mu      sync.Mutex
		after   = map[int32]int{} // handler runs per partition after the rebalance
		release = make(chan struct{})
		blocked = make(chan struct{}, 1)
	)
	h := func(_ context.Context, d effects.Delivery) error {
		select {
		case blocked <- struct{}{}:
			<-release // the first delivery holds the only worker
			return nil
		default:
		}
		mu.Lock()
		after[partitionOf(d)]++
		mu.Unlock()
		return nil
	}
	cons, err := consume.New(a, h, consume.WithConcurrency(1), consume.WithoutDeadLetter())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- cons.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()
	waitFor(t, 30*time.Second, "the first member to take every record", func() bool { return cons.Stats().Delivered == parts*per })

	// A second member joins; the first keeps polling in the background, so
	// the rebalance reaches it. Its first delivery means the first member
	// revoked the partitions it took.
	b := newSource(t, c, group, topic)
	moved := map[int32]bool{}
	var bmu sync.Mutex
	bctx, bcancel := context.WithCancel(context.Background())
	bdone := make(chan struct{})
	first := make(chan struct{})
	go func() {
		defer close(bdone)
		for n := 0; ; n++ {
			d, err := b.Next(bctx)
			if err != nil {
				return
			}
			bmu.Lock()
			moved[partitionOf(d)] = true
			bmu.Unlock()
			if n == 0 {
				close(first)
			}
		}
	}()
	defer func() { bcancel(); <-bdone }()
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the second member got nothing")
	}
	close(release)
	waitFor(t, 30*time.Second, "the first member to account for every delivery", func() bool {
		s := cons.Stats()
		return s.Acked+s.Dropped+s.Failed >= s.Delivered
	})

	st := cons.Stats()
	bmu.Lock()
	defer bmu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if len(moved) == 0 || len(moved) == parts {
		t.Fatalf("moved partitions %v; want some but not all", moved)
	}
	for p, n := range after {
		if moved[p] {
			t.Errorf("the first member ran %d handlers of partition %d after it moved", n, p)
		}
	}
	kept := int64(parts-len(moved)) * per
	if st.Dropped < int64(len(moved))*per-1 {
		t.Errorf("Dropped %d, want the %d queued deliveries of the moved partitions %v (less the one running)", st.Dropped, int64(len(moved))*per-1, moved)
	}
	if st.Acked < kept-1 {
		t.Errorf("Acked %d, want the kept partitions' %d", st.Acked, kept)
	}
}
