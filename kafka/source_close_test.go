package kafka_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// TestSourceCloseIsBoundedDuringARebalance: a member frozen in a
// rebalance (its JoinGroup never reaches the broker) keeps the others'
// JoinGroups parked until the rebalance timeout; Close of a member whose
// join is parked returns within WithCloseTimeout instead of waiting the
// rebalance out. The rebalance timeout is below the session timeout: kfake
// does not refresh a member's session while its JoinGroup is parked.
func TestSourceCloseIsBoundedDuringARebalance(t *testing.T) {
	const (
		bound     = 500 * time.Millisecond
		rebalance = 15 * time.Second
	)
	c := kafkatest.Start(t)
	fake := c.RequireFake(t)
	topic := c.Topic(t, "closebound", 2)
	group := "g-" + topic
	produceN(t, c, topic, 20, 2)
	opts := c.Opts(
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.HeartbeatInterval(100*time.Millisecond),
		kgo.SessionTimeout(2*rebalance),
		kgo.RebalanceTimeout(rebalance),
	)
	newMember := func() *kafka.Source {
		s, err := kafka.NewSource(opts, kafka.WithCloseTimeout(bound))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a := newMember()
	next(t, a)
	b := newMember()
	rebalanceTo(t, a, b) // both members hold partitions

	bID, _ := b.Client().GroupMetadata()
	aID, _ := a.Client().GroupMetadata()
	var (
		parked = make(chan struct{})
		once   sync.Once
		frozen atomic.Bool
	)
	frozen.Store(true)
	fake.ControlKey(int16(kmsg.JoinGroup), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		switch req.(*kmsg.JoinGroupRequest).MemberID {
		case bID:
			return nil, nil, frozen.Load() // the request never reaches the group
		case aID:
			once.Do(func() { close(parked) })
		}
		return nil, nil, false
	})
	fake.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		return nil, nil, frozen.Load() && req.(*kmsg.HeartbeatRequest).MemberID == bID
	})

	// A third member joins: a rebalance starts, a rejoins and waits for b.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cm := newMember()
	joined := make(chan struct{})
	go func() { defer close(joined); cm.Next(ctx) }()
	go func() {
		for {
			if _, err := a.Next(ctx); err != nil {
				return
			}
		}
	}()
	select {
	case <-parked:
	case <-time.After(30 * time.Second):
		t.Fatal("the first member never rejoined")
	}

	start := time.Now()
	err := a.Close()
	took := time.Since(start)
	if took > rebalance/3 {
		t.Fatalf("Close took %v during a rebalance, bound %v (the rebalance timeout is %v)", took, bound, rebalance)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close = %v, want the bound's context.DeadlineExceeded", err)
	}
	if _, err := a.Next(ctx); !errors.Is(err, kafka.ErrSourceClosed) {
		t.Errorf("Next after Close: %v, want ErrSourceClosed", err)
	}
	frozen.Store(false) // b thaws, so the group settles and the others close
	cancel()
	<-joined
}

// TestSourceCloseTimeoutOption: the bound must be positive.
func TestSourceCloseTimeoutOption(t *testing.T) {
	c := kafkatest.Start(t)
	for _, d := range []time.Duration{0, -time.Second} {
		_, err := kafka.NewSource(c.Opts(kafkatest.GroupOpts("g", "t")...), kafka.WithCloseTimeout(d))
		var ce *effects.ConfigError
		if !errors.As(err, &ce) || ce.Option != "WithCloseTimeout" || !errors.Is(err, effects.ErrInvalidConfig) {
			t.Errorf("WithCloseTimeout(%v): %v, want a ConfigError naming the option", d, err)
		}
	}
}
