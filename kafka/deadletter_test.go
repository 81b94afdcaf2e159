package kafka_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"golang.org/x/time/rate"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// ackWatch is a Source that runs check before passing each Ack on: the
// test's window on when the consumer acks.
type ackWatch struct {
	effects.Source
	check func(d effects.Delivery)
}

func (a ackWatch) Ack(ctx context.Context, d effects.Delivery) error {
	a.check(d)
	return a.Source.Ack(ctx, d)
}

// poisonHandler fails a delivery whose body starts with "poison" with
// effects.ErrPoison, and handles the others.
func poisonHandler(_ context.Context, d effects.Delivery) error {
	if bytes.HasPrefix(d.Body, []byte("poison")) {
		return fmt.Errorf("cannot parse %q: %w", d.Body, effects.ErrPoison)
	}
	return nil
}

func readTopic(t *testing.T, c *kafkatest.Cluster, topic string) []*kgo.Record {
	t.Helper()
	recs, err := c.ReadAll(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// deadLetterID is the delivery id dead letter r carries.
func deadLetterID(r *kgo.Record) string {
	d, _ := kafka.ParseDeadLetter(r)
	return d.ID
}

func header(r *kgo.Record, name string) string {
	v, _ := kafkatest.Header(r, name)
	return v
}

// TestDeadLetterTopic dead-letters a poison record read through a
// consumer group Source and through a share group ShareSource: the dead
// letter holds the record's key, body and headers and the dead-letter
// headers, and it is in the topic when the consumer acks the original.
func TestDeadLetterTopic(t *testing.T) {
	for _, share := range []bool{false, true} {
		t.Run(fmt.Sprintf("share=%t", share), func(t *testing.T) {
			c, topic, group := shareCluster(t, 2, shareTestLock, 0)
			dlq := c.Topic(t, "dlq", 1)
			cl := c.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err := cl.ProduceSync(context.Background(),
				&kgo.Record{Topic: topic, Partition: 0, Value: []byte("good"), Headers: []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte("id-good")}}},
				&kgo.Record{Topic: topic, Partition: 1, Key: []byte("k1"), Value: []byte("poison!"), Headers: []kgo.RecordHeader{
					{Key: kafka.KeyHeader, Value: []byte("id-poison")}, {Key: "type", Value: []byte("created")}}},
			).FirstErr(); err != nil {
				t.Fatal(err)
			}
			var src effects.Source
			if share {
				src = newShareSource(t, c, group, topic)
			} else {
				src = newSource(t, c, "g-"+topic, topic)
			}
			hook, err := kafka.DeadLetterTopic(c.Client(t), dlq)
			if err != nil {
				t.Fatal(err)
			}
			var storedAtAck atomic.Int64
			watched := ackWatch{Source: src, check: func(d effects.Delivery) {
				if d.ID == "id-poison" {
					storedAtAck.Store(int64(len(readTopic(t, c, dlq))))
				}
			}}
			before := time.Now()
			cons := runConsumer(t, watched, poisonHandler, consume.WithDeadLetter(hook))
			eventually(t, "both deliveries acked", func() bool { return cons.Stats().Acked == 2 })
			if n := storedAtAck.Load(); n != 1 {
				t.Fatalf("%d dead letters in the topic when the poison delivery was acked, want 1", n)
			}
			recs := readTopic(t, c, dlq)
			if len(recs) != 1 {
				t.Fatalf("%d dead letters, want 1", len(recs))
			}
			r := recs[0]
			if string(r.Key) != "k1" || string(r.Value) != "poison!" || header(r, "type") != "created" || header(r, kafka.KeyHeader) != "id-poison" {
				t.Errorf("dead letter key %q value %q headers %v: want the original's", r.Key, r.Value, r.Headers)
			}
			if got := header(r, kafka.HeaderDLQError); !strings.Contains(got, `cannot parse "poison!"`) {
				t.Errorf("error header %q", got)
			}
			if got := header(r, kafka.HeaderDLQClass); got != "poison" {
				t.Errorf("class header %q, want poison", got)
			}
			if got := header(r, kafka.HeaderDLQTopic); got != topic {
				t.Errorf("topic header %q, want %q", got, topic)
			}
			if p, o := header(r, kafka.HeaderDLQPartition), header(r, kafka.HeaderDLQOffset); p != "1" || o != "0" {
				t.Errorf("partition/offset headers %s/%s, want 1/0", p, o)
			}
			if got, in := deadLetterID(r), header(r, kafka.HeaderDLQIDHeader); got != "id-poison" || in != kafka.KeyHeader {
				t.Errorf("delivery id %q in header %q, want id-poison in %s", got, in, kafka.KeyHeader)
			}
			if _, twice := kafkatest.Header(r, kafka.HeaderDLQDeliveryID); twice {
				t.Errorf("the delivery id is stored twice")
			}
			at, err := time.Parse(time.RFC3339Nano, header(r, kafka.HeaderDLQTime))
			if err != nil || at.Before(before.Add(-time.Second)) || at.After(time.Now()) {
				t.Errorf("time header %q (%v): want the dead-lettering time", header(r, kafka.HeaderDLQTime), err)
			}
			// A poison delivery is dead-lettered at its first attempt,
			// whichever source delivered it.
			if attempts, _ := kafkatest.Header(r, kafka.HeaderDLQAttempts); attempts != "1" {
				t.Errorf("attempts header %q, want 1 (poison goes at its first attempt)", attempts)
			}
			want := kafka.DeadLetter{ID: "id-poison", Class: "poison", Error: header(r, kafka.HeaderDLQError),
				Attempts: 1, Topic: topic, Partition: 1, Offset: 0, Time: at}
			if d, ok := kafka.ParseDeadLetter(r); !ok || d != want {
				t.Errorf("ParseDeadLetter = %+v, %t; want %+v, true", d, ok, want)
			}
		})
	}
}

// outage makes a kfake cluster drop every request, closing the
// connection, while down: an unreachable broker.
type outage struct{ down atomic.Bool }

func newOutage(c *kafkatest.Cluster, t *testing.T) *outage {
	fake := c.RequireFake(t)
	o := &outage{}
	fake.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		if !o.down.Load() {
			return nil, nil, false
		}
		fake.KeepControl()
		return nil, errors.New("broker down"), true
	})
	return o
}

// TestDeadLetterTopicBrokerOutage: the broker goes down as the hook starts
// producing the dead letter. The consumer does not ack the poison
// delivery while the dead letter is not stored; once the broker is back,
// the dead letter is stored, then the delivery acked, and its offset
// committed. (The outage may cost the group its session: the partition is
// revoked, the ack refused, and the delivery dead-lettered again by its
// new owner, the declared at-least-once.)
func TestDeadLetterTopicBrokerOutage(t *testing.T) {
	c := kafkatest.Start(t)
	topic, dlq := c.Topic(t, "src", 1), c.Topic(t, "dlq", 1)
	if err := c.Client(t).ProduceSync(context.Background(),
		&kgo.Record{Topic: topic, Value: []byte("poison")}, &kgo.Record{Topic: topic, Value: []byte("good")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	out := newOutage(c, t)
	hook, err := kafka.DeadLetterTopic(c.Client(t), dlq)
	if err != nil {
		t.Fatal(err)
	}
	var (
		hookCalls    atomic.Int64
		mu           sync.Mutex
		poisonAcks   int  // Acks of the poison delivery: more than one after a rebalance
		minStored    = -1 // the fewest dead letters stored at one of them
		ackedInOuter bool
	)
	outageHook := func(ctx context.Context, d effects.Delivery, cause error) error {
		if hookCalls.Add(1) == 1 {
			out.down.Store(true)
			go func() { // the outage lasts a few produce retries
				time.Sleep(2 * time.Second)
				out.down.Store(false)
			}()
		}
		return hook(ctx, d, cause)
	}
	group := "g-" + topic
	src := newSource(t, c, group, topic)
	watched := ackWatch{Source: src, check: func(d effects.Delivery) {
		if string(d.Body) != "poison" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		poisonAcks++
		ackedInOuter = ackedInOuter || out.down.Load()
		if n := len(readTopic(t, c, dlq)); minStored < 0 || n < minStored {
			minStored = n
		}
	}}
	cons := runConsumer(t, watched, poisonHandler, consume.WithDeadLetter(outageHook),
		consume.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	eventually(t, "both deliveries acked", func() bool { return cons.Stats().Acked == 2 })
	mu.Lock()
	if poisonAcks == 0 || ackedInOuter || minStored < 1 {
		t.Errorf("the poison delivery was acked %d times, once with the broker down=%t, once with %d dead letters stored; want up and at least 1",
			poisonAcks, ackedInOuter, minStored)
	}
	mu.Unlock()
	eventually(t, "the offset committed past both records", func() bool { return committed(t, c, group, topic, 0) == 2 })
	recs := readTopic(t, c, dlq)
	if len(recs) < 1 || header(recs[0], kafka.HeaderDLQClass) != "poison" {
		t.Fatalf("dead letters %d: want the poison record", len(recs))
	}
	t.Logf("hook called %d times, %d dead letters (at least once)", hookCalls.Load(), len(recs))
}

// TestDeadLetterTopicRefusesBadArguments: a nil client, an empty topic and
// a client that is not an idempotent producer are refused at once.
func TestDeadLetterTopicRefusesBadArguments(t *testing.T) {
	c := kafkatest.Start(t)
	if _, err := kafka.DeadLetterTopic(nil, "dlq"); effects.ClassOf(err) != effects.InvalidConfig {
		t.Errorf("nil client: %v", err)
	}
	if _, err := kafka.DeadLetterTopic(c.Client(t), ""); effects.ClassOf(err) != effects.InvalidConfig {
		t.Errorf("empty topic: %v", err)
	}
	if _, err := kafka.DeadLetterTopic(c.Client(t, kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())), "dlq"); !errors.Is(err, kafka.ErrNotIdempotent) {
		t.Errorf("non-idempotent client: %v", err)
	}
	// A dead-letter topic that does not exist is a configuration error
	// (a consumer stops on it), not a failure to retry for ever.
	hook, err := kafka.DeadLetterTopic(c.Client(t), "no-such-dlq")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := hook(ctx, effects.Delivery{ID: "x", Body: []byte("x")}, effects.ErrPoison); effects.ClassOf(err) != effects.InvalidConfig {
		t.Errorf("hook to a missing topic: %v, want a configuration error", err)
	}
}

// TestRedriveAfterFix is the redrive's round trip: two of five events
// fail their second step as poison after their first step applied, and
// are dead-lettered. The code is fixed; a dry run lists them and moves
// nothing; selections by id, limit, class and time pick what they should;
// the redrive moves both to the source topic with their delivery id, where
// their first step replays and their second applies: every step of every
// event applied once.
func TestRedriveAfterFix(t *testing.T) {
	c := kafkatest.Start(t)
	topic, dlq := c.Topic(t, "orders", 2), c.Topic(t, "orders-dlq", 1)
	fx, rows := shareLedger(t)
	var recs []*kgo.Record
	for i := range 5 {
		body := fmt.Sprint("event-", i)
		if i == 1 || i == 3 {
			body = fmt.Sprint("poison-", i)
		}
		r := &kgo.Record{Topic: topic, Value: []byte(body)}
		if i != 3 { // poison-3's delivery id is its topic/partition/offset
			r.Headers = []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte(fmt.Sprint("id-", i))}}
		}
		recs = append(recs, r)
	}
	if err := c.Client(t).ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var fixed atomic.Bool
	var replayed atomic.Int64
	step := func(ctx context.Context, d effects.Delivery, name string) (effects.Result, error) {
		key, err := effects.NewKey("share-test", d.ID, name)
		if err != nil {
			return effects.Result{}, err
		}
		return fx.Apply(ctx, key, d.ID+"/"+name)
	}
	handler := func(ctx context.Context, d effects.Delivery) error {
		r, err := step(ctx, d, "reserve")
		if err != nil {
			return err
		}
		if r.Replayed() {
			replayed.Add(1)
		}
		if !fixed.Load() && bytes.HasPrefix(d.Body, []byte("poison")) {
			return fmt.Errorf("no parser for %q: %w", d.Body, effects.ErrPoison)
		}
		_, err = step(ctx, d, "charge")
		return err
	}
	hook, err := kafka.DeadLetterTopic(c.Client(t), dlq)
	if err != nil {
		t.Fatal(err)
	}
	cons := runConsumer(t, newSource(t, c, "g-"+topic, topic), handler, consume.WithDeadLetter(hook))
	eventually(t, "five deliveries acked", func() bool { return cons.Stats().Acked == 5 })
	if st := cons.Stats(); st.DeadLettered != 2 {
		t.Fatalf("stats %+v, want 2 dead-lettered", st)
	}
	dead := readTopic(t, c, dlq)
	ids := map[string]bool{}
	var id3 string // poison-3's delivery id: topic/partition/offset
	for _, r := range dead {
		id := deadLetterID(r)
		ids[id] = true
		if id != "id-1" {
			id3 = id
		}
	}
	if len(dead) != 2 || !ids["id-1"] || !strings.HasPrefix(id3, topic+"/") {
		t.Fatalf("dead letters %v, want id-1 and poison-3's topic/partition/offset", ids)
	}
	// A dead letter written twice (a crash between the hook and the ack).
	if err := c.Client(t).ProduceSync(context.Background(), &kgo.Record{Topic: dlq, Key: dead[0].Key, Value: dead[0].Value, Headers: dead[0].Headers}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	fixed.Store(true) // the code change

	ctx := context.Background()
	redrive := func(opts ...kafka.RedriveOption) (kafka.RedriveStats, string) {
		t.Helper()
		var out bytes.Buffer
		st, err := kafka.Redrive(ctx, c.Client(t), dlq, append(opts, kafka.WithDryRun(&out))...)
		if err != nil {
			t.Fatal(err)
		}
		return st, out.String()
	}
	st, out := redrive()
	if st.Read != 3 || st.Moved != 2 || st.Repeated != 1 || strings.Count(out, "\n") != 2 || !strings.Contains(out, `"id-1" class poison -> `+topic) {
		t.Errorf("dry run: %+v\n%s", st, out)
	}
	for _, tc := range []struct {
		name  string
		opts  []kafka.RedriveOption
		moved int
	}{
		{"by id", []kafka.RedriveOption{kafka.WithFilter(func(d kafka.DeadLetter) bool { return d.ID == "id-1" })}, 1},
		{"by count", []kafka.RedriveOption{kafka.WithLimit(1)}, 1},
		{"by class", []kafka.RedriveOption{kafka.WithFilter(func(d kafka.DeadLetter) bool { return d.Class == "permanent" || d.Class == "retryable" })}, 0},
		{"by time", []kafka.RedriveOption{kafka.WithTimeRange(time.Now().Add(time.Hour), time.Time{})}, 0},
	} {
		if st, _ := redrive(tc.opts...); st.Moved != tc.moved {
			t.Errorf("%s: %+v, want %d moved", tc.name, st, tc.moved)
		}
	}
	if n := len(readTopic(t, c, topic)); n != 5 {
		t.Fatalf("%d records in the source topic after dry runs, want 5", n)
	}

	st, err = kafka.Redrive(ctx, c.Client(t), dlq, kafka.WithFilter(func(d kafka.DeadLetter) bool { return d.Class == "poison" }),
		kafka.WithLimiter(rate.NewLimiter(100, 1)))
	if err != nil || st.Moved != 2 || st.Repeated != 1 {
		t.Fatalf("Redrive = %+v, %v; want 2 moved, 1 repeated", st, err)
	}
	eventually(t, "the redriven deliveries acked", func() bool { return cons.Stats().Acked == 7 })
	if n := replayed.Load(); n != 2 {
		t.Errorf("%d first steps replayed, want the 2 redriven ones", n)
	}
	got := rows()
	for i := range 5 {
		id := fmt.Sprint("id-", i)
		if i == 3 {
			id = id3
		}
		for _, s := range []string{"reserve", "charge"} {
			if n := got[id+"/"+s]; n != 1 {
				t.Errorf("%s/%s applied %d times, want 1 (ledger %v)", id, s, n, got)
			}
		}
	}
	if st := cons.Stats(); st.DeadLettered != 2 {
		t.Errorf("stats %+v: a redriven delivery was dead-lettered again", st)
	}
}
