package outbox_test

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/kafka/outbox"
	"effectively.dev/postgres/pgtest"
)

// smallTopic creates a topic whose broker refuses record batches over
// maxBytes (max.message.bytes).
func smallTopic(t *testing.T, c *kafkatest.Cluster, prefix string, partitions int32, maxBytes int) string {
	t.Helper()
	topic := c.Topic(t, prefix, partitions)
	setMaxMessageBytes(t, c, topic, maxBytes)
	return topic
}

// setMaxMessageBytes sets topic's max.message.bytes.
func setMaxMessageBytes(t *testing.T, c *kafkatest.Cluster, topic string, n int) {
	t.Helper()
	v := fmt.Sprint(n)
	resp, err := kadm.NewClient(c.Client(t)).AlterTopicConfigs(context.Background(),
		[]kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &v}}, topic)
	if err == nil {
		_, err = resp.On(topic, nil)
	}
	if err != nil {
		t.Fatalf("setting max.message.bytes of %s: %v", topic, err)
	}
}

// enqueue commits msgs in one business transaction.
func enqueue(t *testing.T, pool *pgxpool.Pool, msgs ...outbox.Message) {
	t.Helper()
	if err := inTx(t, pool, false, func(tx pgx.Tx) error {
		for _, m := range msgs {
			if _, err := outbox.Enqueue(context.Background(), tx, m); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// msg is a message of size random bytes: the producer's compression
// cannot shrink it below the topic's limit.
func msg(id, topic, key string, size int) outbox.Message {
	value := make([]byte, size)
	_, _ = crand.Read(value)
	m := outbox.Message{ID: effects.Key(id), Topic: topic, Value: value}
	if key != "" {
		m.Key = []byte(key)
	}
	return m
}

// rowState is one outbox row as the relay left it.
type rowState struct {
	sent, parked bool
	attempts     int
	class        string
}

func rowStates(t *testing.T, pool *pgxpool.Pool) map[string]rowState {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT message_id, sent_at IS NOT NULL, parked_at IS NOT NULL, attempts, coalesce(error_class, '') FROM effectively_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]rowState{}
	for rows.Next() {
		var id string
		var s rowState
		if err := rows.Scan(&id, &s.sent, &s.parked, &s.attempts, &s.class); err != nil {
			t.Fatal(err)
		}
		out[id] = s
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRelayParksPoisonAndGoodRowsFlow is the repro: three rows
// the broker refuses (over the topic's max.message.bytes) at the head of
// the outbox, five good rows behind them, batches of three. The poison
// rows are parked in the first batch, with their error and attempt count,
// and the good rows go out in the next two: before the fix none of them
// was published after 20 batches.
func TestRelayParksPoisonAndGoodRowsFlow(t *testing.T) {
	pool := outboxPool(t)
	c := kafkatest.Start(t)
	topic := smallTopic(t, c, "poison", 2, 4<<10)
	var msgs []outbox.Message
	for i := range 3 {
		msgs = append(msgs, msg(fmt.Sprint("poison-", i), topic, "", 64<<10))
	}
	for i := range 5 {
		msgs = append(msgs, msg(fmt.Sprint("good-", i), topic, "", 10))
	}
	enqueue(t, pool, msgs...)
	relay, err := outbox.NewRelay(pool, c.Client(t), outbox.WithBatchSize(3))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	n, err := relay.RelayBatch(ctx)
	var parked []*outbox.ParkedError
	for _, e := range unjoin(err) {
		var p *outbox.ParkedError
		if !errors.As(e, &p) {
			t.Fatalf("first batch: unexpected error %v", e)
		}
		parked = append(parked, p)
	}
	if n != 0 || len(parked) != 3 {
		t.Fatalf("first batch: %d sent, %d parked (%v); want 0 and the 3 poison rows", n, len(parked), err)
	}
	for _, p := range parked {
		if !errors.Is(p, kerr.MessageTooLarge) || p.Class != effects.Permanent || p.Attempts != 1 || !strings.HasPrefix(string(p.MessageID), "poison-") {
			t.Errorf("parked %+v: want a poison row, MESSAGE_TOO_LARGE, permanent, 1 attempt", p)
		}
	}
	for batch := 2; batch <= 3; batch++ {
		want := 3
		if batch == 3 {
			want = 2
		}
		if n, err := relay.RelayBatch(ctx); n != want || err != nil {
			t.Fatalf("batch %d: %d sent, %v; want %d good rows", batch, n, err, want)
		}
	}
	if n, err := relay.RelayBatch(ctx); n != 0 || err != nil {
		t.Fatalf("after the good rows: %d, %v; want nothing left to claim (parked rows are never claimed)", n, err)
	}
	got := published(t, c, topic)
	for i := range 5 {
		if id := fmt.Sprint("good-", i); got[id] != 1 {
			t.Errorf("%s published %d times, want 1", id, got[id])
		}
	}
	states := rowStates(t, pool)
	for i := range 3 {
		id := fmt.Sprint("poison-", i)
		if s := states[id]; !s.parked || s.sent || s.attempts != 1 || s.class != "permanent" || got[id] != 0 {
			t.Errorf("%s: %+v, published %d; want parked (permanent, 1 attempt), unpublished", id, s, got[id])
		}
	}
	if s := relay.Stats(); s.Sent != 5 || s.Parked != 3 || s.Failed != 0 || s.Batches != 3 {
		t.Errorf("stats %+v; want 3 batches, 5 sent, 3 parked, 0 failed", s)
	}
}

func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unjoin(e)...)
		}
		return out
	}
	return []error{err}
}

// TestRelayRunDoesNotWaitBehindPoison: Run goes on at once after a batch
// that parked a full batch of poison, so the good rows behind it are not
// delayed by a poll interval (here a minute, which the test would not
// outlast), and the parked rows are logged by default.
func TestRelayRunDoesNotWaitBehindPoison(t *testing.T) {
	pool := outboxPool(t)
	c := kafkatest.Start(t)
	topic := smallTopic(t, c, "poison-run", 1, 4<<10)
	var msgs []outbox.Message
	for i := range 4 {
		msgs = append(msgs, msg(fmt.Sprint("poison-", i), topic, "", 64<<10))
	}
	for i := range 4 {
		msgs = append(msgs, msg(fmt.Sprint("good-", i), topic, "", 10))
	}
	enqueue(t, pool, msgs...)
	logs := captureLog(t)
	relay, err := outbox.NewRelay(pool, c.Client(t), outbox.WithBatchSize(4), outbox.WithPollInterval(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	eventually(t, 20*time.Second, "the good rows published", func() bool { return relay.Stats().Sent == 4 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if s := relay.Stats(); s.Parked != 4 {
		t.Errorf("stats %+v, want 4 parked", s)
	}
	if n := strings.Count(logs.String(), "outbox: row parked"); n != 4 {
		t.Errorf("%d 'row parked' log lines, want 4:\n%s", n, logs.String())
	}
}

// captureLog points slog.Default at a buffer until t ends.
func captureLog(t *testing.T) *syncBuffer {
	t.Helper()
	var b syncBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&b, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return &b
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestRelayIsolatesABatchTheBrokerRefused: on a one-partition topic the
// producer puts good and poison rows into one record batch, which the
// broker refuses whole; the relay produces each refused row again alone
// and parks only the poison.
func TestRelayIsolatesABatchTheBrokerRefused(t *testing.T) {
	pool := outboxPool(t)
	c := kafkatest.Start(t)
	topic := smallTopic(t, c, "mixed", 1, 4<<10)
	// A long linger, and a topic the relay produced to once: the batch's
	// records wait in one record batch until the produce ends the linger.
	relay, err := outbox.NewRelay(pool, c.Client(t, kgo.ProducerLinger(time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	enqueue(t, pool, msg("warm", topic, "", 10))
	if n, err := relay.RelayBatch(ctx); n != 1 || err != nil {
		t.Fatalf("first batch = %d, %v", n, err)
	}
	enqueue(t, pool, msg("good-0", topic, "", 1<<10), msg("poison-0", topic, "", 5<<10), msg("good-1", topic, "", 1<<10),
		msg("poison-1", topic, "", 5<<10), msg("good-2", topic, "", 1<<10))
	n, err := relay.RelayBatch(ctx)
	if n != 3 || len(unjoin(err)) != 2 {
		t.Fatalf("RelayBatch = %d, %v; want the 3 good rows sent and 2 parked", n, err)
	}
	states := rowStates(t, pool)
	for id, s := range states {
		if want := strings.HasPrefix(id, "poison-"); s.parked != want || s.sent == want {
			t.Errorf("%s: %+v", id, s)
		}
	}
}

// TestRelayParksAfterMaxAttempts: a row whose topic the broker keeps
// answering with a retryable error (NOT_ENOUGH_REPLICAS) while the
// cluster is up fails every attempt; after WithMaxAttempts counted
// attempts it is parked as retryable, and rows of another topic behind it
// flow all along.
func TestRelayParksAfterMaxAttempts(t *testing.T) {
	pool := outboxPool(t)
	c := kafkatest.Start(t)
	fake := c.RequireFake(t)
	bad, good := c.Topic(t, "sick", 1), c.Topic(t, "healthy", 1)
	fault := fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: bad, Err: kerr.NotEnoughReplicas, Count: -1})
	defer fault.Remove()
	enqueue(t, pool, msg("sick-0", bad, "", 10), msg("good-0", good, "", 10))
	relay, err := outbox.NewRelay(pool, c.Client(t), outbox.WithMaxAttempts(2),
		outbox.WithProduceTimeout(300*time.Millisecond), outbox.WithPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var parked *outbox.ParkedError
	for i := 0; parked == nil; i++ {
		if i == 50 {
			t.Fatalf("not parked after %d batches: %+v", i, rowStates(t, pool)["sick-0"])
		}
		_, err := relay.RelayBatch(ctx)
		errors.As(err, &parked)
		time.Sleep(20 * time.Millisecond)
	}
	if parked.Class != effects.Retryable || parked.Attempts != 2 || parked.MessageID != "sick-0" {
		t.Errorf("parked %+v; want sick-0, retryable, 2 attempts", parked)
	}
	if s := rowStates(t, pool); !s["good-0"].sent || s["sick-0"].class != "retryable" {
		t.Errorf("rows %+v; want good-0 sent, sick-0 parked as retryable", s)
	}
	if s := relay.Stats(); s.Failed != 1 || s.Parked != 1 || s.Sent != 1 {
		t.Errorf("stats %+v; want 1 failed attempt, 1 parked, 1 sent", s)
	}
}

// outage makes a kfake cluster drop every request, closing the
// connection, while down: an unreachable broker.
type outage struct{ down atomic.Bool }

func newOutage(fake *kfake.Cluster) *outage {
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

// TestRelayHoldsNoTransactionWhileKafkaIsDown: with Kafka unreachable for
// several produce timeouts, no session of the relay is ever idle in a
// transaction, or in one at all for a second (pg_stat_activity, sampled
// every 20 ms); the failed attempts are an outage, not the rows' fault, so
// none is counted or parked; once Kafka is
// back every row is published. Before the fix one session stayed idle in
// transaction, holding the rows' locks, for as long as the produce waited.
func TestRelayHoldsNoTransactionWhileKafkaIsDown(t *testing.T) {
	url := pgtest.DB(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "outbox-relay-under-test"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	watcher := outboxPool(t) // another database role of the same cluster sees every session
	c := kafkatest.Start(t)
	topic := c.Topic(t, "outage", 2)
	var msgs []outbox.Message
	for i := range 20 {
		msgs = append(msgs, msg(fmt.Sprint("m-", i), topic, "", 10))
	}
	enqueue(t, pool, msgs...)
	cl := c.Client(t)
	if err := cl.Ping(ctx); err != nil { // connected before the outage
		t.Fatal(err)
	}
	out := newOutage(c.RequireFake(t))
	out.down.Store(true)

	// The produce in flight when Kafka comes back may time out while a
	// metadata request already succeeds, and count: the default attempt
	// limit leaves room for that; during the outage nothing counts.
	relay, err := outbox.NewRelay(pool, cl, outbox.WithBatchSize(5),
		outbox.WithProduceTimeout(700*time.Millisecond), outbox.WithPollInterval(20*time.Millisecond),
		outbox.WithObserver(effects.ObserverFunc(func(_ context.Context, ev effects.Event) {
			if !out.down.Load() {
				t.Log(ev.Err)
			}
		})))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()

	var (
		longest  time.Duration
		idleInTx int
		samples  int
	)
	sample := func() {
		var age time.Duration
		var idle int
		if err := watcher.QueryRow(ctx, `SELECT coalesce(max(now() - xact_start), '0'), count(*) FILTER (WHERE state LIKE 'idle in transaction%')
FROM pg_stat_activity WHERE application_name = 'outbox-relay-under-test' AND xact_start IS NOT NULL`).Scan(&age, &idle); err != nil {
			t.Fatal(err)
		}
		longest, idleInTx, samples = max(longest, age), max(idleInTx, idle), samples+1
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		sample()
	}
	stats := relay.Stats()
	if stats.Batches < 3 || stats.Failed < 3 || stats.Sent != 0 {
		t.Fatalf("stats %+v while Kafka was down: want several failed batches and nothing sent", stats)
	}
	if longest >= time.Second {
		t.Errorf("a relay session was in a transaction for %v while Kafka was down; want under a second", longest)
	}
	for id, s := range rowStates(t, pool) {
		if s.parked || s.attempts != 0 {
			t.Errorf("%s %+v during the outage: want not parked, no counted attempt", id, s)
		}
	}

	out.down.Store(false)
	eventually(t, 30*time.Second, "every row published after the outage", func() bool { return relay.Stats().Sent == 20 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if got := published(t, c, topic); len(got) != 20 {
		t.Errorf("%d message ids published, want 20", len(got))
	}
	t.Logf("%d samples; longest relay transaction %v; %d sessions idle in transaction at most; stats %+v", samples, longest, idleInTx, relay.Stats())
}

// TestRelayProducesOutsideTransactions stops a produce at the broker and,
// while it waits, reads pg_stat_activity: no session of the relay is in a
// transaction.
func TestRelayProducesOutsideTransactions(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "outbox-relay-in-produce"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	watcher := outboxPool(t)
	c := kafkatest.Start(t)
	fake := c.RequireFake(t)
	topic := c.Topic(t, "held", 1)
	enqueue(t, pool, msg("m-0", topic, "", 10))
	relay, err := outbox.NewRelay(pool, c.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	arrived, release := make(chan struct{}), make(chan struct{})
	fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		close(arrived)
		fake.SleepControl(func() { <-release })
		return nil, nil, false
	})
	done := make(chan error, 1)
	go func() {
		_, err := relay.RelayBatch(ctx)
		done <- err
	}()
	<-arrived
	var inTx int
	if err := watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-relay-in-produce' AND xact_start IS NOT NULL`).Scan(&inTx); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if inTx != 0 {
		t.Errorf("%d relay sessions in a transaction while the produce was at the broker, want 0", inTx)
	}
}

// TestEnqueueRefusesTooLarge: a message over the maximum is refused with
// a typed error before any statement, and the business transaction goes
// on.
func TestEnqueueRefusesTooLarge(t *testing.T) {
	pool := outboxPool(t)
	ctx := context.Background()
	const defaultMax = 960 << 10 // WithMaxMessageBytes's default
	big := msg("big", "orders", "", defaultMax)
	err := inTx(t, pool, false, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, big)
		var tl *outbox.TooLargeError
		if !errors.As(err, &tl) || effects.ClassOf(err) != effects.Permanent ||
			tl.Size != big.Size() || tl.Max != defaultMax || tl.ID != "big" {
			t.Errorf("Enqueue(too large) = %v; want a permanent *TooLargeError with its size and the maximum", err)
		}
		// A larger limit takes it; a smaller one refuses a small message.
		if ok, err := outbox.Enqueue(ctx, tx, big, outbox.WithMaxMessageBytes(2*defaultMax)); !ok || err != nil {
			t.Errorf("Enqueue with a larger limit = %v, %v", ok, err)
		}
		if _, err := outbox.Enqueue(ctx, tx, msg("small", "orders", "", 100), outbox.WithMaxMessageBytes(50)); !errors.As(err, new(*outbox.TooLargeError)) {
			t.Errorf("Enqueue over a 50-byte limit = %v, want a *TooLargeError", err)
		}
		if _, err := outbox.Enqueue(ctx, tx, msg("small", "orders", "", 1), outbox.WithMaxMessageBytes(0)); effects.ClassOf(err) != effects.InvalidConfig {
			t.Errorf("WithMaxMessageBytes(0) = %v, want a configuration error", err)
		}
		_, err = outbox.Enqueue(ctx, tx, msg("after", "orders", "", 10))
		return err // the transaction is still usable
	})
	if err != nil {
		t.Fatalf("the business transaction after the refusal: %v", err)
	}
	if _, err := outbox.EnqueueStatement(big); !errors.As(err, new(*outbox.TooLargeError)) {
		t.Errorf("EnqueueStatement(too large) = %v, want a *TooLargeError", err)
	}
	states := rowStates(t, pool)
	if len(states) != 2 {
		t.Errorf("rows %v; want big (with the larger limit) and after", states)
	}
}

// TestRelayKeyOrder is what parking does to the order of one record key.
// By default the later rows of a parked row's key go ahead without it.
// WithKeyOrder holds them back until the parked row is retried and sent,
// and then the key's rows are published in id order; other keys flow all
// along.
func TestRelayKeyOrder(t *testing.T) {
	for _, keyOrder := range []bool{false, true} {
		t.Run(fmt.Sprintf("WithKeyOrder=%t", keyOrder), func(t *testing.T) {
			pool := outboxPool(t)
			ctx := context.Background()
			if keyOrder {
				if err := outbox.Migrate(ctx, pool, outbox.WithKeyOrder()); err != nil {
					t.Fatal(err)
				}
			}
			c := kafkatest.Start(t)
			topic := smallTopic(t, c, "keys", 1, 4<<10)
			enqueue(t, pool, msg("a-1", topic, "a", 8<<10), msg("a-2", topic, "a", 10), msg("b-1", topic, "b", 10),
				msg("a-3", topic, "a", 10), msg("b-2", topic, "b", 10))
			opts := []outbox.RelayOption{outbox.WithBatchSize(10)}
			if keyOrder {
				opts = append(opts, outbox.WithKeyOrder())
			}
			relay, err := outbox.NewRelay(pool, c.Client(t), opts...)
			if err != nil {
				t.Fatal(err)
			}
			drain := func() {
				t.Helper()
				for range 10 {
					if n, err := relay.RelayBatch(ctx); n == 0 && err == nil {
						return
					}
				}
				t.Fatal("the relay did not drain the outbox in 10 batches")
			}
			drain()
			order := func() []string {
				recs, err := c.ReadAll(ctx, topic)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, r := range recs {
					id, _ := kafkatest.Header(r, kafka.KeyHeader)
					ids = append(ids, id)
				}
				return ids
			}
			want := []string{"a-2", "b-1", "a-3", "b-2"}
			if keyOrder {
				want = []string{"b-1", "b-2"} // a-2 and a-3 wait behind the parked a-1
			}
			if got := order(); !slices.Equal(got, want) {
				t.Fatalf("published %v with a-1 parked, want %v", got, want)
			}
			// The fix: the topic takes larger records; retry the parked row.
			setMaxMessageBytes(t, c, topic, 64<<10)
			if n, err := (outbox.ParkedFilter{MessageIDs: []effects.Key{"a-1"}}).Retry(ctx, pool); n != 1 || err != nil {
				t.Fatalf("Retry = %d, %v", n, err)
			}
			drain()
			want = append(want, "a-1")
			if keyOrder {
				want = append(want, "a-2", "a-3")
			}
			if got := order(); !slices.Equal(got, want) {
				t.Fatalf("published %v after the retry, want %v", got, want)
			}
		})
	}
}

// TestParkedRows lists, counts, retries and drops parked rows by each
// selector.
func TestParkedRows(t *testing.T) {
	pool := outboxPool(t)
	ctx := context.Background()
	c := kafkatest.Start(t)
	t1 := smallTopic(t, c, "p1", 1, 1<<10)
	t2 := smallTopic(t, c, "p2", 1, 1<<10)
	var msgs []outbox.Message
	for i := range 4 {
		msgs = append(msgs, msg(fmt.Sprint("t1-", i), t1, "", 2<<10))
	}
	msgs = append(msgs, msg("t2-0", t2, "", 2<<10), msg("ok", t2, "", 1))
	msgs[0].Headers = []kgo.RecordHeader{{Key: "type", Value: []byte("created")}}
	enqueue(t, pool, msgs...)
	before := time.Now()
	relay, err := outbox.NewRelay(pool, c.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RelayBatch(ctx); n != 1 || len(unjoin(err)) != 5 {
		t.Fatalf("RelayBatch = %d, %v; want 1 sent and 5 parked", n, err)
	}
	ids := func(ps []outbox.Parked) []string {
		var out []string
		for _, p := range ps {
			out = append(out, string(p.MessageID))
		}
		return out
	}
	list := func(f outbox.ParkedFilter) []string {
		t.Helper()
		ps, err := f.List(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		return ids(ps)
	}
	all, err := outbox.ParkedFilter{}.List(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(all); !slices.Equal(got, []string{"t1-0", "t1-1", "t1-2", "t1-3", "t2-0"}) {
		t.Fatalf("List = %v", got)
	}
	p := all[0]
	if p.Topic != t1 || len(p.Value) != 2<<10 || string(p.Key) != "t1-0" || p.Attempts != 1 || p.Class != "permanent" ||
		!strings.Contains(p.Error, "MESSAGE_TOO_LARGE") || p.ParkedAt.Before(p.CreatedAt) ||
		len(p.Headers) != 1 || p.Headers[0].Key != "type" {
		t.Errorf("parked row %+v", p)
	}
	for _, tc := range []struct {
		name string
		f    outbox.ParkedFilter
		want []string
	}{
		{"topic", outbox.ParkedFilter{Topic: t2}, []string{"t2-0"}},
		{"ids", outbox.ParkedFilter{IDs: []int64{all[1].ID, all[3].ID}}, []string{"t1-1", "t1-3"}},
		{"message ids", outbox.ParkedFilter{MessageIDs: []effects.Key{"t1-2", "ok"}}, []string{"t1-2"}},
		{"class", outbox.ParkedFilter{Class: "retryable"}, nil},
		{"limit and page", outbox.ParkedFilter{AfterID: all[1].ID, Limit: 2}, []string{"t1-2", "t1-3"}},
		{"parked since", outbox.ParkedFilter{From: before.Add(-time.Minute)}, ids(all)},
		{"parked before", outbox.ParkedFilter{To: before.Add(-time.Minute)}, nil},
	} {
		if got := list(tc.f); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if n, err := (outbox.ParkedFilter{Topic: t1}).Count(ctx, pool); n != 4 || err != nil {
		t.Errorf("Count(t1) = %d, %v; want 4", n, err)
	}
	if _, err := (outbox.ParkedFilter{Limit: -1}).List(ctx, pool); effects.ClassOf(err) != effects.InvalidConfig {
		t.Errorf("Limit -1: %v, want a configuration error", err)
	}
	if n, err := (outbox.ParkedFilter{Topic: t2}).Drop(ctx, pool); n != 1 || err != nil {
		t.Errorf("Drop(t2) = %d, %v", n, err)
	}
	setMaxMessageBytes(t, c, t1, 64<<10)
	if n, err := (outbox.ParkedFilter{Limit: 3}).Retry(ctx, pool); n != 3 || err != nil {
		t.Errorf("Retry(limit 3) = %d, %v", n, err)
	}
	if n, err := relay.RelayBatch(ctx); n != 3 || err != nil {
		t.Errorf("RelayBatch after the retry = %d, %v; want the 3 retried rows", n, err)
	}
	states := rowStates(t, pool)
	if _, ok := states["t2-0"]; ok || !states["t1-0"].sent || !states["t1-3"].parked {
		t.Errorf("rows %+v; want t2-0 dropped, t1-0..2 sent, t1-3 still parked", states)
	}
}
