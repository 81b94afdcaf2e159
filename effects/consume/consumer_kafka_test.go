package consume_test

// Consumer tests against real components: a kafka.Source over a kfake
// cluster (kafka/kafkatest), and a postgres.Effect on a throwaway
// PostgreSQL database (postgres/pgtest).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// produceRecords writes per records to each of parts partitions of topic,
// with values "p<partition>-<i>"; withID adds the key header
// "evt-<partition>-<i>", else Delivery.ID is topic/partition/offset.
func produceRecords(t *testing.T, c *kafkatest.Cluster, topic string, parts int32, per int, withID bool) {
	t.Helper()
	cl := c.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var recs []*kgo.Record
	for i := range per {
		for p := range parts {
			r := &kgo.Record{Topic: topic, Partition: p, Value: fmt.Appendf(nil, "p%d-%d", p, i)}
			if withID {
				r.Headers = []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: fmt.Appendf(nil, "evt-%d-%02d", p, i)}}
			}
			recs = append(recs, r)
		}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func newKafkaSource(t *testing.T, c *kafkatest.Cluster, group, topic string) *kafka.Source {
	t.Helper()
	s, err := kafka.NewSource(c.Opts(kafkatest.GroupOpts(group, topic)...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// offsets reads a group's committed offsets.
type offsets struct {
	t     *testing.T
	adm   *kadm.Client
	group string
	topic string
}

func newOffsets(t *testing.T, c *kafkatest.Cluster, group, topic string) *offsets {
	return &offsets{t: t, adm: kadm.NewClient(c.Client(t)), group: group, topic: topic}
}

// of returns the committed offset of partition p, -1 if none.
func (o *offsets) of(p int32) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := o.adm.FetchOffsets(ctx, o.group)
	if err != nil {
		o.t.Errorf("fetching offsets: %v", err)
		return -1
	}
	off, ok := offs.Lookup(o.topic, p)
	if !ok {
		return -1
	}
	return off.At
}

// offsetOf parses the offset out of a Delivery.ID topic/partition/offset.
func offsetOf(t *testing.T, d effects.Delivery) int64 {
	i := strings.LastIndexByte(d.ID, '/')
	off, err := strconv.ParseInt(d.ID[i+1:], 10, 64)
	if err != nil {
		t.Errorf("delivery id %q: %v", d.ID, err)
	}
	return off
}

// countingSource wraps a Source and counts Ack calls per delivery.
type countingSource struct {
	effects.Source
	mu   sync.Mutex
	acks map[string]int
}

func countAcks(s effects.Source) *countingSource {
	return &countingSource{Source: s, acks: map[string]int{}}
}

func (s *countingSource) Ack(ctx context.Context, d effects.Delivery) error {
	s.mu.Lock()
	s.acks[d.ID]++
	s.mu.Unlock()
	return s.Source.Ack(ctx, d)
}

func (s *countingSource) acked() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.acks))
	for id, n := range s.acks {
		if n > 1 {
			panic(fmt.Sprintf("delivery %s acked %d times in one run", id, n))
		}
		out[id] = n
	}
	return out
}

// TestConsumerKafkaAcksOnlyAfterSuccess: committed offsets advance only
// past records whose handler returned nil; a record whose handler keeps
// failing is never committed past, holds back its partition, and is
// delivered first to the restarted consumer.
func TestConsumerKafkaAcksOnlyAfterSuccess(t *testing.T) {
	kc := kafkatest.Start(t)
	topic := kc.Topic(t, "ack-after-success", 1)
	group := "g-" + topic
	produceRecords(t, kc, topic, 1, 10, false)
	offs := newOffsets(t, kc, group, topic)

	var mu sync.Mutex
	var handled []int64
	var failures atomic.Int64
	h := func(_ context.Context, d effects.Delivery) error {
		off := offsetOf(t, d)
		if got := offs.of(0); got > off {
			t.Errorf("offset %d committed while record %d was still being handled", got, off)
		}
		mu.Lock()
		handled = append(handled, off)
		mu.Unlock()
		if off == 4 {
			failures.Add(1)
			return errors.New("handler failed")
		}
		return nil
	}
	src := newKafkaSource(t, kc, group, topic)
	cons := newConsumer(t, src, h, consume.WithMaxAttempts(2), consume.WithBackoff(time.Millisecond, 20*time.Millisecond), consume.WithoutDeadLetter())
	stop := start(t, cons)
	waitFor(t, 30*time.Second, "three failures of offset 4", func() bool { return failures.Load() >= 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if got := offs.of(0); got != 4 {
		t.Fatalf("committed %d after offset 4 kept failing, want 4", got)
	}
	mu.Lock()
	if i := slices.Index(handled, 4); i != 4 || slices.ContainsFunc(handled, func(o int64) bool { return o > 4 }) {
		t.Errorf("handled %v; want 0..3, then only 4 (the records behind it wait)", handled)
	}
	handled = nil
	mu.Unlock()
	if st := cons.Stats(); st.Acked != 4 || st.Failed == 0 || st.DeadLettered != 0 {
		t.Errorf("Stats = %+v, want Acked 4 and Failed > 0", st)
	}

	// The restarted process, with the bug fixed.
	src2 := newKafkaSource(t, kc, group, topic)
	cons2 := newConsumer(t, src2, func(_ context.Context, d effects.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, offsetOf(t, d))
		return nil
	}, consume.WithoutDeadLetter())
	stop = start(t, cons2)
	waitFor(t, 30*time.Second, "offset 10 committed", func() bool { return offs.of(0) == 10 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []int64{4, 5, 6, 7, 8, 9}; !slices.Equal(handled, want) {
		t.Errorf("restarted consumer handled %v, want %v", handled, want)
	}
}

// TestConsumerKafkaPerPartitionOrder: with more workers than partitions,
// each partition's records are handled one at a time in offset order, and
// partitions run in parallel.
func TestConsumerKafkaPerPartitionOrder(t *testing.T) {
	const parts, per = 4, 50
	kc := kafkatest.Start(t)
	topic := kc.Topic(t, "order", parts)
	group := "g-" + topic
	produceRecords(t, kc, topic, parts, per, false)

	var mu sync.Mutex
	order := map[string][]int64{}
	active := map[string]int{}
	var running, peak atomic.Int64
	h := func(_ context.Context, d effects.Delivery) error {
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		mu.Lock()
		if active[d.Ordering]++; active[d.Ordering] > 1 {
			t.Errorf("two handlers at once in partition %s", d.Ordering)
		}
		order[d.Ordering] = append(order[d.Ordering], offsetOf(t, d))
		mu.Unlock()
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
		mu.Lock()
		active[d.Ordering]--
		mu.Unlock()
		return nil
	}
	src := newKafkaSource(t, kc, group, topic)
	cons := newConsumer(t, src, h, consume.WithConcurrency(8), consume.WithoutDeadLetter())
	stop := start(t, cons)
	waitFor(t, 60*time.Second, "every record acked", func() bool { return cons.Stats().Acked == parts*per })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) != parts {
		t.Fatalf("handled %d partitions, want %d", len(order), parts)
	}
	for p, offs := range order {
		if len(offs) != per || !slices.IsSorted(offs) || offs[0] != 0 || offs[per-1] != per-1 {
			t.Errorf("partition %s handled in order %v", p, offs)
		}
	}
	if peak.Load() < 2 {
		t.Errorf("peak concurrency %d: partitions did not run in parallel", peak.Load())
	}
	// Acks do not wait for the broker: the group commit stores the offsets
	// shortly after, without Flush or Close.
	offs := newOffsets(t, kc, group, topic)
	waitFor(t, 10*time.Second, "the group commit of every partition", func() bool {
		for p := range int32(parts) {
			if offs.of(p) != per {
				return false
			}
		}
		return true
	})
}

// ledgerDB creates a database with the effectively schema and a ledger
// table without a unique index, so only the dedup row keeps duplicates out.
func ledgerDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (id bigserial, event_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

// ledgerCounts returns the number of ledger rows per event id.
func ledgerCounts(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, _ := pool.Query(context.Background(), `SELECT event_id, count(*) FROM ledger GROUP BY event_id`)
	out := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestConsumerKafkaGracefulShutdownAndRestart: cancel Run while two
// handlers are in flight. The one that finishes within the grace is acked;
// the one interrupted when the grace expires (after its effect committed)
// is not; Run returns nil. A restarted consumer then handles everything
// left. Across both runs every record is handled at least once, acked
// exactly once (no run acks twice, and strict per-partition order means no
// record behind an unacked one was handled), and its effect is in the
// ledger exactly once.
func TestConsumerKafkaGracefulShutdownAndRestart(t *testing.T) {
	const parts, per = 2, 20
	kc := kafkatest.Start(t)
	topic := kc.Topic(t, "shutdown", parts)
	group := "g-" + topic
	produceRecords(t, kc, topic, parts, per, true)
	offs := newOffsets(t, kc, group, topic)
	pool := ledgerDB(t)
	fx, err := postgres.New(pool, "consumer-test", func(ctx context.Context, tx pgx.Tx, eventID string) (string, error) {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (event_id) VALUES ($1)`, eventID)
		return "", err
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handled := map[string]int{}
	apply := func(ctx context.Context, d effects.Delivery) error {
		mu.Lock()
		handled[d.ID]++
		mu.Unlock()
		key, err := effects.NewKey("consumer-test", d.ID, "ledger")
		if err != nil {
			return err
		}
		_, err = fx.Apply(ctx, key, d.ID)
		return err
	}

	// Run 1: evt-0-02 is slow but finishes within the grace; evt-1-02
	// commits its effect, then hangs until its context ends.
	started := make(chan string, 2)
	release := make(chan struct{})
	h1 := func(ctx context.Context, d effects.Delivery) error {
		switch d.ID {
		case "evt-0-02":
			started <- d.ID
			<-release
			if ctx.Err() != nil {
				t.Error("handler context cancelled before the grace expired")
			}
			return apply(ctx, d)
		case "evt-1-02":
			if err := apply(ctx, d); err != nil {
				return err
			}
			started <- d.ID
			<-ctx.Done()
			return fmt.Errorf("interrupted after the effect committed: %w", ctx.Err())
		}
		return apply(ctx, d)
	}
	src1 := countAcks(newKafkaSource(t, kc, group, topic))
	cons1 := newConsumer(t, src1, h1, consume.WithConcurrency(4), consume.WithShutdownGrace(500*time.Millisecond),
		consume.WithObserver(effects.ObserverFunc(func(_ context.Context, ev effects.Event) { t.Logf("%v %s: %v", ev.Kind, ev.DeliveryID, ev.Err) })), consume.WithoutDeadLetter())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cons1.Run(ctx) }()
	for range 2 {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			mu.Lock()
			t.Fatalf("the slow handlers did not start; handled %v, stats %+v", handled, cons1.Stats())
		}
	}
	cancel()
	time.Sleep(50 * time.Millisecond)
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil after a cancel", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	if err := src1.Source.(*kafka.Source).Close(); err != nil {
		t.Fatal(err)
	}
	acked1 := src1.acked()
	if got0, got1 := offs.of(0), offs.of(1); got0 != 3 || got1 != 2 {
		t.Errorf("after run 1 committed %d, %d; want 3 (evt-0-02 acked) and 2 (evt-1-02 not)", got0, got1)
	}
	if acked1["evt-0-02"] != 1 || acked1["evt-1-02"] != 0 {
		t.Errorf("run 1 acks: evt-0-02 %d, evt-1-02 %d; want 1 and 0", acked1["evt-0-02"], acked1["evt-1-02"])
	}
	if st := cons1.Stats(); st.Acked != 5 || st.Failed != 1 {
		t.Errorf("run 1 Stats = %+v, want Acked 5, Failed 1", st)
	}

	// Run 2: the restarted process handles what run 1 left.
	src2 := countAcks(newKafkaSource(t, kc, group, topic))
	cons2 := newConsumer(t, src2, apply, consume.WithConcurrency(4), consume.WithoutDeadLetter())
	stop := start(t, cons2)
	waitFor(t, 60*time.Second, "every offset committed", func() bool { return offs.of(0) == per && offs.of(1) == per })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	acked2 := src2.acked()

	ledger := ledgerCounts(t, pool)
	mu.Lock()
	defer mu.Unlock()
	for p := range parts {
		for i := range per {
			id := fmt.Sprintf("evt-%d-%02d", p, i)
			if handled[id] < 1 {
				t.Errorf("%s never handled", id)
			}
			if n := acked1[id] + acked2[id]; n != 1 {
				t.Errorf("%s acked %d times over both runs, want 1", id, n)
			}
			if ledger[id] != 1 {
				t.Errorf("%s has %d ledger rows, want 1", id, ledger[id])
			}
		}
	}
	if handled["evt-1-02"] != 2 {
		t.Errorf("evt-1-02 handled %d times, want 2 (interrupted, then replayed)", handled["evt-1-02"])
	}
}

// TestConsumerBatchApplyBatch: a batch consumer whose BatchHandler is
// postgres.ApplyBatch writes every event's ledger row exactly once, though
// a third of the deliveries are redeliveries, some in the same batch as
// their original, and acks every delivery.
func TestConsumerBatchApplyBatch(t *testing.T) {
	pool := ledgerDB(t)
	var ds []effects.Delivery
	for i := range 300 {
		ordering := ""
		if i%3 == 0 {
			ordering = fmt.Sprintf("acct-%d", i%7) // some per-account order too
		}
		d := effects.Delivery{ID: fmt.Sprintf("evt-%03d", i), Ordering: ordering}
		ds = append(ds, d)
		if i%3 == 1 {
			ds = append(ds, d) // redelivered
		}
	}
	src := newMemSource(ds...)
	var batches atomic.Int64
	bh := func(ctx context.Context, batch []effects.Delivery) []error {
		batches.Add(1)
		items := make([]postgres.BatchItem, len(batch))
		for i, d := range batch {
			key, err := effects.NewKey("consumer-test", d.ID, "ledger")
			if err != nil {
				return slices.Repeat([]error{err}, len(batch))
			}
			items[i] = postgres.BatchItem{Key: key, Fingerprint: []byte(d.ID)}
		}
		results, err := postgres.ApplyBatch(ctx, pool, "consumer-test", items, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
			_, err := tx.Exec(ctx, `INSERT INTO ledger (event_id) VALUES ($1)`, batch[i].ID)
			return "", err
		})
		return postgres.BatchErrors(len(batch), results, err)
	}
	c := newConsumer(t, src, nil, consume.WithBatch(50, 10*time.Millisecond, bh), consume.WithConcurrency(2), consume.WithoutDeadLetter())
	stop := start(t, c)
	waitFor(t, 60*time.Second, "every ack", func() bool { return src.totalAcks() == len(ds) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	ledger := ledgerCounts(t, pool)
	for i := range 300 {
		if id := fmt.Sprintf("evt-%03d", i); ledger[id] != 1 {
			t.Errorf("%s has %d ledger rows, want 1", id, ledger[id])
		}
	}
	if n := batches.Load(); n >= int64(len(ds)) {
		t.Errorf("%d batches for %d deliveries: nothing was batched", n, len(ds))
	}
	t.Logf("%d deliveries in %d batches", len(ds), batches.Load())
}
