package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// shareTestLock is the acquisition lock of the share-group tests' clusters.
const shareTestLock = 3 * time.Second

// shareCluster starts a cluster for share-group tests (lock, delivery
// limit: see kafkatest.ShareBrokerConfigs), a topic of parts partitions,
// and a share group reading it from the earliest offset.
func shareCluster(t *testing.T, parts int32, lock time.Duration, limit int) (c *kafkatest.Cluster, topic, group string) {
	t.Helper()
	c = kafkatest.Start(t, kafkatest.ShareBrokerConfigs(lock, limit))
	topic = c.Topic(t, "share", parts)
	group = "sg-" + topic
	c.ShareFromEarliest(t, group)
	return c, topic, group
}

func newShareSource(t *testing.T, c *kafkatest.Cluster, group, topic string, opts ...kafka.ShareOption) *kafka.ShareSource {
	t.Helper()
	s, err := kafka.NewShareSource(c.Opts(kgo.ShareGroup(group), kgo.ConsumeTopics(topic)), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func shareNext(t *testing.T, s *kafka.ShareSource) effects.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return d
}

// noDelivery asserts that s hands out nothing within d.
func noDelivery(t *testing.T, s *kafka.ShareSource, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if got, err := s.Next(ctx); err == nil {
		t.Fatalf("Next handed out %q (attempt %d), want nothing within %v", got.ID, got.Attempt, d)
	}
}

// TestShareSourceDelivery: records come out with the id header (or
// topic/partition/offset) as ID, no Ordering, attempt 1; accepted ones are
// not delivered again, to this member or a new one.
func TestShareSourceDelivery(t *testing.T) {
	c, topic, group := shareCluster(t, 2, shareTestLock, 0)
	produceN(t, c, topic, 4, 2)
	s := newShareSource(t, c, group, topic)
	var ids []string
	for range 4 {
		d := shareNext(t, s)
		if d.Ordering != "" {
			t.Errorf("%s: Ordering %q, want none", d.ID, d.Ordering)
		}
		if d.Attempt != 1 {
			t.Errorf("%s: Attempt %d, want 1", d.ID, d.Attempt)
		}
		if !s.Owns(d) {
			t.Errorf("%s: not owned right after Next", d.ID)
		}
		ids = append(ids, d.ID)
		if err := s.Ack(context.Background(), d); err != nil {
			t.Fatalf("Ack(%s): %v", d.ID, err)
		}
		if s.Owns(d) {
			t.Errorf("%s: still owned after Ack", d.ID)
		}
		if err := s.Ack(context.Background(), d); err != nil {
			t.Errorf("second Ack(%s): %v, want nil", d.ID, err)
		}
	}
	sort.Strings(ids)
	want := []string{"id-0", "id-2", topic + "/1/0", topic + "/1/1"}
	if fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Errorf("ids %v, want %v", ids, want)
	}
	// Past the lock: an accepted record would have come back by now.
	noDelivery(t, s, shareTestLock+time.Second)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s2 := newShareSource(t, c, group, topic)
	noDelivery(t, s2, 2*time.Second)
}

// TestShareSourceRelease: a released record comes back with its attempt
// raised; at the delivery limit Release refuses (ErrNotReleased) and the
// record stays held, renewed past its lock.
func TestShareSourceRelease(t *testing.T) {
	c, topic, group := shareCluster(t, 1, shareTestLock, 3)
	produceN(t, c, topic, 1, 1)
	s := newShareSource(t, c, group, topic, kafka.WithDeliveryLimit(3), kafka.WithShareMembers(1))
	for attempt := 1; attempt <= 2; attempt++ {
		d := shareNext(t, s)
		if d.ID != "id-0" || d.Attempt != attempt {
			t.Fatalf("got %q attempt %d, want id-0 attempt %d", d.ID, d.Attempt, attempt)
		}
		if err := s.Release(context.Background(), d); err != nil {
			t.Fatalf("Release on attempt %d: %v", attempt, err)
		}
		if s.Owns(d) {
			t.Errorf("still owned after Release")
		}
	}
	d := shareNext(t, s)
	if d.Attempt != 3 {
		t.Fatalf("attempt %d, want 3", d.Attempt)
	}
	if err := s.Release(context.Background(), d); !errors.Is(err, effects.ErrNotReleased) || !strings.Contains(err.Error(), "last allowed delivery") {
		t.Fatalf("Release on the last delivery = %v, want ErrNotReleased for the delivery limit", err)
	}
	// Kept and renewed: still ours after two locks' time.
	time.Sleep(2 * shareTestLock)
	if !s.Owns(d) {
		t.Fatal("the refused delivery was not kept: its lock lapsed")
	}
	if err := s.Ack(context.Background(), d); err != nil {
		t.Fatalf("Ack after two locks: %v", err)
	}
	noDelivery(t, s, shareTestLock+time.Second)
}

// TestShareSourceLockExpiry: a member frozen past its lock (here: one that
// holds a record and cannot renew, because its renewal lead is shorter than
// the margin the test leaves) loses the record to another member, with the
// attempt raised; its late Ack reports ErrLockExpired.
func TestShareSourceLockExpiry(t *testing.T) {
	c, topic, group := shareCluster(t, 1, shareTestLock, 0)
	produceN(t, c, topic, 1, 1)
	a := newShareSource(t, c, group, topic, kafka.WithShareMembers(1),
		kafka.WithRenewBefore(time.Millisecond), kafka.WithLockMargin(0))
	d := shareNext(t, a)
	b := newShareSource(t, c, group, topic, kafka.WithShareMembers(1))
	// Either member may acquire the record again once its lock expired:
	// the first member's poller released it and polls again.
	type got struct {
		src *kafka.ShareSource
		d   effects.Delivery
	}
	ch := make(chan got, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, s := range []*kafka.ShareSource{a, b} {
		go func() {
			if d2, err := s.Next(ctx); err == nil {
				ch <- got{s, d2}
			}
		}()
	}
	var g got
	select {
	case g = <-ch:
	case <-ctx.Done():
		t.Fatal("the record was not delivered again after its lock expired")
	}
	if g.d.ID != d.ID || g.d.Attempt != 2 {
		t.Fatalf("redelivered %q attempt %d, want %q attempt 2", g.d.ID, g.d.Attempt, d.ID)
	}
	// The first member's deadline is the client's estimate, taken when the
	// fetch arrived, after the broker had started the lock: it may lag the
	// broker's by a round trip and a scheduling delay (which the default
	// WithLockMargin covers; this source has none), not by a second.
	lapse := time.Now().Add(time.Second)
	for a.Owns(d) && time.Now().Before(lapse) {
		time.Sleep(10 * time.Millisecond)
	}
	if a.Owns(d) {
		t.Error("the first delivery is still owned a second after its record went to another member")
	}
	if err := a.Ack(context.Background(), d); !errors.Is(err, kafka.ErrLockExpired) {
		t.Errorf("late Ack = %v, want ErrLockExpired", err)
	}
	if err := g.src.Ack(context.Background(), g.d); err != nil {
		t.Fatalf("Ack of the redelivery: %v", err)
	}
	cancel()
	noDelivery(t, a, shareTestLock+time.Second)
}

// TestShareSourceCloseReleases: Close releases what was handed out and not
// acked, at once (well before the lock would expire), and Next, Ack and
// Release report ErrSourceClosed.
func TestShareSourceCloseReleases(t *testing.T) {
	c, topic, group := shareCluster(t, 1, time.Minute, 0)
	produceN(t, c, topic, 2, 1)
	a := newShareSource(t, c, group, topic, kafka.WithShareMembers(1))
	d0, d1 := shareNext(t, a), shareNext(t, a)
	if err := a.Ack(context.Background(), d0); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := a.Next(context.Background()); !errors.Is(err, kafka.ErrSourceClosed) {
		t.Errorf("Next after Close = %v", err)
	}
	if err := a.Ack(context.Background(), d1); !errors.Is(err, kafka.ErrSourceClosed) {
		t.Errorf("Ack after Close = %v", err)
	}
	if err := a.Release(context.Background(), d1); !errors.Is(err, kafka.ErrSourceClosed) {
		t.Errorf("Release after Close = %v", err)
	}
	b := newShareSource(t, c, group, topic, kafka.WithShareMembers(1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // the lock is a minute
	defer cancel()
	got, err := b.Next(ctx)
	if err != nil {
		t.Fatalf("the unacked record was not released by Close: %v", err)
	}
	// At least 2: kfake lets the closing member's parked fetch acquire
	// the released record once more before the session closes.
	if got.ID != d1.ID || got.Attempt < 2 {
		t.Errorf("got %q attempt %d, want %q attempt 2 or more", got.ID, got.Attempt, d1.ID)
	}
}

// TestNewShareSourceValidates: bad options and a missing or wrong group
// are a *effects.ConfigError naming the option.
func TestNewShareSourceValidates(t *testing.T) {
	c := kafkatest.Start(t)
	share := c.Opts(kgo.ShareGroup("g"), kgo.ConsumeTopics("t"))
	for _, tc := range []struct {
		name   string
		client []kgo.Opt
		opts   []kafka.ShareOption
		option string
	}{
		{"no share group", c.Opts(kgo.ConsumeTopics("t")), nil, "clientOpts"},
		{"consumer group", c.Opts(kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t")), nil, "clientOpts"},
		{"no topics", c.Opts(kgo.ShareGroup("g")), nil, "clientOpts"},
		{"empty id header", share, []kafka.ShareOption{kafka.WithIDHeader("")}, "WithIDHeader"},
		{"members 0", share, []kafka.ShareOption{kafka.WithShareMembers(0)}, "WithShareMembers"},
		{"max poll 0", share, []kafka.ShareOption{kafka.WithMaxPoll(0)}, "WithMaxPoll"},
		{"nil logger", share, []kafka.ShareOption{kafka.WithLogger(nil)}, "WithLogger"},
		{"negative limit", share, []kafka.ShareOption{kafka.WithDeliveryLimit(-1)}, "WithDeliveryLimit"},
		{"renew 0", share, []kafka.ShareOption{kafka.WithRenewBefore(0)}, "withRenewBefore"},
		{"negative margin", share, []kafka.ShareOption{kafka.WithLockMargin(-time.Second)}, "withLockMargin"},
		{"margin past renewal", share, []kafka.ShareOption{kafka.WithRenewBefore(time.Second), kafka.WithLockMargin(time.Second)}, "withLockMargin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := kafka.NewShareSource(tc.client, tc.opts...)
			var ce *effects.ConfigError
			if !errors.As(err, &ce) || ce.Option != tc.option || !errors.Is(err, effects.ErrInvalidConfig) {
				t.Fatalf("NewShareSource = %v, %v; want a ConfigError for %s", s, err, tc.option)
			}
		})
	}
	s, err := kafka.NewShareSource(share, nil, kafka.WithDeliveryLimit(0))
	if err != nil {
		t.Fatalf("nil option and no delivery limit: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(context.Background()); !errors.Is(err, kafka.ErrSourceClosed) {
		t.Errorf("Next after Close = %v, want ErrSourceClosed", err)
	}
	other := effects.Delivery{ID: "x", Token: "not a record"}
	if err := s.Ack(context.Background(), other); err == nil {
		t.Error("Ack of a foreign delivery: nil error")
	}
	if s.Owns(other) {
		t.Error("Owns a foreign delivery")
	}
}

// TestShareSourceEmptyIDHeader: as with the partition Source, a record
// whose id header is present but empty gets an empty ID (NewKey refuses
// it: dead letter), never its position, which a resent event would not
// share; only a record without the header gets topic/partition/offset.
func TestShareSourceEmptyIDHeader(t *testing.T) {
	c, topic, group := shareCluster(t, 1, shareTestLock, 0)
	hdr := func(v string) []kgo.RecordHeader { return []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte(v)}} }
	recs := []*kgo.Record{
		{Topic: topic, Value: []byte("empty"), Headers: hdr("")},
		{Topic: topic, Value: []byte("absent")},
		{Topic: topic, Value: []byte("empty-then-named"), Headers: append(hdr(""), hdr("evt-3")...)},
	}
	if err := c.Client(t).ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	s := newShareSource(t, c, group, topic)
	ids := map[string]string{}
	for range recs {
		d := shareNext(t, s)
		ids[string(d.Body)] = d.ID
		if err := s.Ack(context.Background(), d); err != nil {
			t.Fatalf("Ack(%s): %v", d.Body, err)
		}
	}
	want := map[string]string{"empty": "", "absent": topic + "/0/1", "empty-then-named": ""}
	if fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Errorf("ids by record %v, want %v", ids, want)
	}
	if _, err := effects.NewKey("billing", ids["empty"], "ledger"); !errors.Is(err, effects.ErrInvalidKey) {
		t.Errorf("NewKey of the empty id: %v, want ErrInvalidKey", err)
	}
}
