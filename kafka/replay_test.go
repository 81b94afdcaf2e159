package kafka_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// seedTopic writes n records to each of parts partitions, with timestamps
// base + i seconds and values "p<partition>-<i>".
func seedTopic(t *testing.T, c *kafkatest.Cluster, parts int32, n int, base time.Time) string {
	t.Helper()
	topic := c.Topic(t, "replay", parts)
	cl := c.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var recs []*kgo.Record
	for p := int32(0); p < parts; p++ {
		for i := 0; i < n; i++ {
			recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Timestamp: base.Add(time.Duration(i) * time.Second),
				Value: []byte(fmt.Sprintf("p%d-%d", p, i))})
		}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return topic
}

// collect is a handler that records partition/offset pairs.
type collect struct {
	mu   sync.Mutex
	seen map[int32][]int64
}

func (h *collect) handle(_ context.Context, recs []*kgo.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen == nil {
		h.seen = map[int32][]int64{}
	}
	for _, r := range recs {
		h.seen[r.Partition] = append(h.seen[r.Partition], r.Offset)
	}
	return nil
}

func span(from, to int64) []int64 {
	var out []int64
	for o := from; o < to; o++ {
		out = append(out, o)
	}
	return out
}

func TestReplayOffsetRange(t *testing.T) {
	c := kafkatest.Start(t)
	topic := seedTopic(t, c, 2, 20, time.Now())
	var h collect
	st, err := kafka.Replay(context.Background(), c.Client(t), topic, h.handle,
		kafka.WithOffsetRange(5, 15), kafka.WithProgress(&bytes.Buffer{}))
	if err != nil {
		t.Fatal(err)
	}
	for p := int32(0); p < 2; p++ {
		if got, want := fmt.Sprint(h.seen[p]), fmt.Sprint(span(5, 15)); got != want {
			t.Errorf("partition %d: offsets %s, want %s", p, got, want)
		}
		if r := st.Ranges[p]; r != (kafka.OffsetRange{Start: 5, End: 15}) {
			t.Errorf("partition %d: range %+v", p, r)
		}
		if st.Next[p] != 15 {
			t.Errorf("partition %d: next %d, want 15", p, st.Next[p])
		}
	}
	if st.Records != 20 {
		t.Errorf("%d records, want 20", st.Records)
	}

	// One partition, to the end of the log.
	h = collect{}
	if _, err := kafka.Replay(context.Background(), c.Client(t), topic, h.handle,
		kafka.WithPartitions(1), kafka.WithOffsetRange(18, 0), kafka.WithProgress(&bytes.Buffer{})); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(h.seen); got != "map[1:[18 19]]" {
		t.Errorf("got %s, want partition 1 offsets 18 and 19", got)
	}
	if _, err := kafka.Replay(context.Background(), c.Client(t), topic, h.handle, kafka.WithPartitions(7)); err == nil {
		t.Error("replaying a partition that does not exist succeeded")
	}
}

func TestReplayTimeRange(t *testing.T) {
	c := kafkatest.Start(t)
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	topic := seedTopic(t, c, 1, 20, base)
	var h collect
	if _, err := kafka.Replay(context.Background(), c.Client(t), topic, h.handle,
		kafka.WithTimeRange(base.Add(5*time.Second), base.Add(10*time.Second)), kafka.WithProgress(&bytes.Buffer{})); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(h.seen[0]), fmt.Sprint(span(5, 10)); got != want {
		t.Errorf("offsets %s, want %s: timestamps in [From, To)", got, want)
	}
}

// virtualLimiter is a rate.Limiter on a fake clock: Wait never sleeps, it
// advances the clock by the delay the limiter asks for.
type virtualLimiter struct {
	lim    *rate.Limiter
	now    time.Time
	waits  int
	events *[]string
}

func (v *virtualLimiter) Wait(context.Context) error {
	r := v.lim.ReserveN(v.now, 1)
	v.now = v.now.Add(r.DelayFrom(v.now))
	v.waits++
	*v.events = append(*v.events, "wait")
	return nil
}

// TestReplayRateLimit: Replay waits on the limiter once before every
// record, so the replay takes as long as the limit says (measured on a
// fake clock, not the wall clock).
func TestReplayRateLimit(t *testing.T) {
	c := kafkatest.Start(t)
	topic := seedTopic(t, c, 2, 25, time.Now())
	var events []string
	start := time.Unix(1_000_000, 0)
	lim := &virtualLimiter{lim: rate.NewLimiter(10, 1), now: start, events: &events}
	st, err := kafka.Replay(context.Background(), c.Client(t), topic,
		func(context.Context, []*kgo.Record) error {
			events = append(events, "handle")
			return nil
		}, kafka.WithLimiter(lim), kafka.WithProgress(&bytes.Buffer{}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Records != 50 || lim.waits != 50 {
		t.Fatalf("%d records, %d waits; want 50 of each", st.Records, lim.waits)
	}
	for i, e := range events {
		if want := []string{"wait", "handle"}[i%2]; e != want {
			t.Fatalf("event %d is %s, want %s: every record must wait on the limiter first", i, e, want)
		}
	}
	// 10 records a second, burst 1: the 50th record goes at 4.9 s.
	if got, want := lim.now.Sub(start), 4900*time.Millisecond; got != want {
		t.Errorf("virtual duration %v, want %v", got, want)
	}
}

// TestReplayEndsOnTransactionMarker: a range that ends on a transaction's
// commit marker (a control record the handler never sees) still ends, and
// records of aborted transactions are not replayed.
func TestReplayEndsOnTransactionMarker(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "txn", 1)
	txn := c.Client(t, kgo.TransactionalID("replay-txn"))
	ctx := context.Background()
	for i, commit := range []kgo.TransactionEndTry{kgo.TryCommit, kgo.TryAbort, kgo.TryCommit} {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 2; j++ {
			if err := txn.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(fmt.Sprintf("t%d-%d", i, j))}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := txn.EndTransaction(ctx, commit); err != nil {
			t.Fatal(err)
		}
	}
	var values []string
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	st, err := kafka.Replay(rctx, c.Client(t), topic,
		func(_ context.Context, recs []*kgo.Record) error {
			values = append(values, string(recs[0].Value))
			return nil
		}, kafka.WithProgress(&bytes.Buffer{}))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(values, " "); got != "t0-0 t0-1 t2-0 t2-1" {
		t.Errorf("replayed %q, want only the committed transactions' records", got)
	}
	if r := st.Ranges[0]; st.Next[0] != r.End {
		t.Errorf("stopped at %d, range %+v", st.Next[0], r)
	}

	// The same in batches: the range still ends, and Next passes the marker.
	values = nil
	st, err = kafka.Replay(rctx, c.Client(t), topic,
		func(_ context.Context, recs []*kgo.Record) error {
			for _, r := range recs {
				values = append(values, string(r.Value))
			}
			return nil
		}, kafka.WithBatchSize(3), kafka.WithProgress(&bytes.Buffer{}))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(values, " "); got != "t0-0 t0-1 t2-0 t2-1" || st.Next[0] != st.Ranges[0].End {
		t.Errorf("batches replayed %q and stopped at %d of %+v, want only the committed records and the range's end", got, st.Next[0], st.Ranges[0])
	}
}

func TestReplayHandlerErrorStops(t *testing.T) {
	c := kafkatest.Start(t)
	topic := seedTopic(t, c, 1, 10, time.Now())
	boom := errors.New("boom")
	var progress bytes.Buffer
	st, err := kafka.Replay(context.Background(), c.Client(t), topic,
		func(_ context.Context, recs []*kgo.Record) error {
			if recs[0].Offset == 4 {
				return boom
			}
			return nil
		}, kafka.WithProgress(&progress), kafka.WithLimiter(rate.NewLimiter(1e6, 1)))
	if !errors.Is(err, boom) {
		t.Fatalf("Replay = %v, want the handler's error", err)
	}
	if st.Records != 4 || st.Next[0] != 4 {
		t.Errorf("records %d next %d, want 4 and 4 (resume at the failed record)", st.Records, st.Next[0])
	}
	if !strings.Contains(progress.String(), "replay "+topic) {
		t.Errorf("progress output %q", progress.String())
	}
}

func TestReplayProgressBar(t *testing.T) {
	c := kafkatest.Start(t)
	topic := seedTopic(t, c, 1, 10, time.Now())
	var progress bytes.Buffer
	if _, err := kafka.Replay(context.Background(), c.Client(t), topic,
		func(context.Context, []*kgo.Record) error { return nil }, kafka.WithProgress(&progress)); err != nil {
		t.Fatal(err)
	}
	out := progress.String()
	if !strings.Contains(out, "[##############################] 100% 10/10 offsets, 10 records") || !strings.HasSuffix(out, "\n") {
		t.Errorf("progress output %q, want a full bar and a final newline", out)
	}
}

// TestReplayBatch: with WithBatchSize, Replay hands every record of the
// range once, in offset order per partition, in batches of at most the
// batch size, and counts a batch only once its handler returned nil.
func TestReplayBatch(t *testing.T) {
	c := kafkatest.Start(t)
	topic := seedTopic(t, c, 2, 25, time.Now())

	t.Run("every record once, in order, at most BatchSize at a time", func(t *testing.T) {
		var h collect
		var sizes []int
		var events []string
		lim := &virtualLimiter{lim: rate.NewLimiter(rate.Inf, 1), now: time.Unix(0, 0), events: &events}
		st, err := kafka.Replay(context.Background(), c.Client(t), topic, func(ctx context.Context, recs []*kgo.Record) error {
			sizes = append(sizes, len(recs))
			return h.handle(ctx, recs)
		}, kafka.WithOffsetRange(3, 0), kafka.WithBatchSize(10), kafka.WithLimiter(lim), kafka.WithProgress(&bytes.Buffer{}))
		if err != nil {
			t.Fatal(err)
		}
		for p := int32(0); p < 2; p++ {
			if got, want := fmt.Sprint(h.seen[p]), fmt.Sprint(span(3, 25)); got != want {
				t.Errorf("partition %d: offsets %s, want %s", p, got, want)
			}
			if st.Next[p] != 25 {
				t.Errorf("partition %d: next %d, want 25", p, st.Next[p])
			}
		}
		total := 0
		for i, n := range sizes {
			if n < 1 || n > 10 || (i < len(sizes)-1 && n != 10) {
				t.Errorf("batch sizes %v: want full batches of 10 and a last one of 1 to 10", sizes)
				break
			}
			total += n
		}
		if total != 44 || st.Records != 44 || lim.waits != 44 {
			t.Errorf("%d records in batches, stats %d, %d limiter waits; want 44 of each", total, st.Records, lim.waits)
		}
	})

	t.Run("a failed batch is not counted and the replay resumes at its first record", func(t *testing.T) {
		boom := errors.New("boom")
		opts := []kafka.ReplayOption{kafka.WithPartitions(0), kafka.WithBatchSize(10), kafka.WithProgress(&bytes.Buffer{})}
		calls := 0
		st, err := kafka.Replay(context.Background(), c.Client(t), topic, func(_ context.Context, recs []*kgo.Record) error {
			calls++
			if calls == 2 {
				return boom
			}
			return nil
		}, opts...)
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "a batch of 10 records from 0/10") {
			t.Fatalf("Replay = %v, want the handler's error naming the batch", err)
		}
		if st.Records != 10 || st.Next[0] != 10 {
			t.Fatalf("records %d next %d, want 10 and 10", st.Records, st.Next[0])
		}
		var h collect
		opts = append(opts, kafka.WithOffsetRange(st.Next[0], 0))
		if _, err := kafka.Replay(context.Background(), c.Client(t), topic, h.handle, opts...); err != nil {
			t.Fatal(err)
		}
		if got, want := fmt.Sprint(h.seen[0]), fmt.Sprint(span(10, 25)); got != want {
			t.Errorf("resumed offsets %s, want %s", got, want)
		}
	})
}

// TestReplayRefusesBadOptions: each mistake is a ConfigError naming the
// argument or option, before any I/O (the client points at a closed port).
func TestReplayRefusesBadOptions(t *testing.T) {
	client, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	txn, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.TransactionalID("replay-txn"))
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	// A case that got past validation would dial the closed port until
	// this deadline and fail with something else than a ConfigError.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	one := func(context.Context, []*kgo.Record) error { return nil }
	replay := func(opts ...kafka.ReplayOption) func() error {
		return func() error { _, err := kafka.Replay(ctx, client, "t", one, opts...); return err }
	}
	at := time.Date(2025, 3, 1, 14, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, option string
		run          func() error
	}{
		{"negative batch size", "WithBatchSize", replay(kafka.WithBatchSize(-1))},
		{"zero batch size", "WithBatchSize", replay(kafka.WithBatchSize(0))},
		{"no topic", "topic", func() error { _, err := kafka.Replay(ctx, client, "", one); return err }},
		{"no client", "client", func() error { _, err := kafka.Replay(ctx, nil, "t", one); return err }},
		{"transactional client", "client", func() error { _, err := kafka.Replay(ctx, txn, "t", one); return err }},
		{"no handler", "handler", func() error { _, err := kafka.Replay(ctx, client, "t", nil); return err }},
		{"no partitions", "WithPartitions", replay(kafka.WithPartitions())},
		{"negative partition", "WithPartitions", replay(kafka.WithPartitions(0, -1))},
		{"negative start offset", "WithOffsetRange", replay(kafka.WithOffsetRange(-1, 0))},
		{"end offset before start", "WithOffsetRange", replay(kafka.WithOffsetRange(10, 5))},
		{"to before from", "WithTimeRange", replay(kafka.WithTimeRange(at, at.Add(-time.Second)))},
		{"nil limiter", "WithLimiter", replay(kafka.WithLimiter(nil))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			var ce *effects.ConfigError
			if !errors.As(err, &ce) || ce.Option != tc.option {
				t.Fatalf("err = %v, want a ConfigError about %s", err, tc.option)
			}
		})
	}
}

// TestReplayDefaults: without options (nil ones are ignored) Replay
// re-feeds every record of every partition, one at a time.
func TestReplayDefaults(t *testing.T) {
	c := kafkatest.Start(t)
	const n = 30
	topic := seedTopic(t, c, 1, n, time.Now())
	var h collect
	var sizes []int
	st, err := kafka.Replay(context.Background(), c.Client(t), topic, func(ctx context.Context, recs []*kgo.Record) error {
		sizes = append(sizes, len(recs))
		return h.handle(ctx, recs)
	}, nil, kafka.WithProgress(io.Discard), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(h.seen[0]), fmt.Sprint(span(0, n)); got != want || st.Records != n || st.Next[0] != n {
		t.Errorf("replayed %d records, next %d, in order %v; want every offset of [0, %d) once", st.Records, st.Next[0], got == want, n)
	}
	if len(sizes) != n || slices.Max(sizes) != 1 {
		t.Errorf("batch sizes %v, want %d batches of one record", sizes, n)
	}
}

// Re-feed a topic to a batch handler, 2 records at a time; a handler that
// uses postgres.ApplyBatch with postgres.WithPrecheck replays the records
// already handled with one query per batch.
func ExampleWithBatchSize() {
	cluster, stop := exampleCluster("orders")
	defer stop()
	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	for i := range 5 {
		if err := client.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte(fmt.Sprint("order ", i))}).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}

	stats, err := kafka.Replay(ctx, client, "orders",
		func(_ context.Context, recs []*kgo.Record) error {
			fmt.Printf("batch of %d:", len(recs))
			for _, r := range recs {
				fmt.Printf(" %d", r.Offset)
			}
			fmt.Println()
			return nil
		}, kafka.WithBatchSize(2), kafka.WithProgress(io.Discard))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(stats.Records, "records, next", stats.Next[0])
	// Output:
	// batch of 2: 0 1
	// batch of 2: 2 3
	// batch of 1: 4
	// 5 records, next 5
}
