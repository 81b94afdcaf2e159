package kafka_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

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

func (h *collect) handle(_ context.Context, r *kgo.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen == nil {
		h.seen = map[int32][]int64{}
	}
	h.seen[r.Partition] = append(h.seen[r.Partition], r.Offset)
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
	c := kafkatest.New(t)
	topic := seedTopic(t, c, 2, 20, time.Now())
	var h collect
	st, err := kafka.Replay(context.Background(), c.Client(t), kafka.ReplayOptions{
		Topic: topic, StartOffset: 5, EndOffset: 15, Progress: &bytes.Buffer{},
	}, h.handle)
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
	if _, err := kafka.Replay(context.Background(), c.Client(t), kafka.ReplayOptions{
		Topic: topic, Partitions: []int32{1}, StartOffset: 18, Progress: &bytes.Buffer{},
	}, h.handle); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(h.seen); got != "map[1:[18 19]]" {
		t.Errorf("got %s, want partition 1 offsets 18 and 19", got)
	}
	if _, err := kafka.Replay(context.Background(), c.Client(t), kafka.ReplayOptions{Topic: topic, Partitions: []int32{7}}, h.handle); err == nil {
		t.Error("replaying a partition that does not exist succeeded")
	}
}

func TestReplayTimeRange(t *testing.T) {
	c := kafkatest.New(t)
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	topic := seedTopic(t, c, 1, 20, base)
	var h collect
	if _, err := kafka.Replay(context.Background(), c.Client(t), kafka.ReplayOptions{
		Topic: topic, From: base.Add(5 * time.Second), To: base.Add(10 * time.Second), Progress: &bytes.Buffer{},
	}, h.handle); err != nil {
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
	c := kafkatest.New(t)
	topic := seedTopic(t, c, 2, 25, time.Now())
	var events []string
	start := time.Unix(1_000_000, 0)
	lim := &virtualLimiter{lim: rate.NewLimiter(10, 1), now: start, events: &events}
	st, err := kafka.Replay(context.Background(), c.Client(t), kafka.ReplayOptions{Topic: topic, Limiter: lim, Progress: &bytes.Buffer{}},
		func(context.Context, *kgo.Record) error {
			events = append(events, "handle")
			return nil
		})
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
	c := kafkatest.New(t)
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
	st, err := kafka.Replay(rctx, c.Client(t), kafka.ReplayOptions{Topic: topic, Progress: &bytes.Buffer{}},
		func(_ context.Context, r *kgo.Record) error {
			values = append(values, string(r.Value))
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(values, " "); got != "t0-0 t0-1 t2-0 t2-1" {
		t.Errorf("replayed %q, want only the committed transactions' records", got)
	}
	if r := st.Ranges[0]; st.Next[0] != r.End {
		t.Errorf("stopped at %d, range %+v", st.Next[0], r)
	}
}

func TestReplayHandlerErrorStops(t *testing.T) {
	c := kafkatest.New(t)
	topic := seedTopic(t, c, 1, 10, time.Now())
	boom := errors.New("boom")
	var progress bytes.Buffer
	st, err := kafka.Replay(context.Background(), c.Client(t), kafka.ReplayOptions{Topic: topic, Progress: &progress, Rate: 1e6},
		func(_ context.Context, r *kgo.Record) error {
			if r.Offset == 4 {
				return boom
			}
			return nil
		})
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
	c := kafkatest.New(t)
	topic := seedTopic(t, c, 1, 10, time.Now())
	var progress bytes.Buffer
	if _, err := kafka.Replay(context.Background(), c.Client(t), kafka.ReplayOptions{Topic: topic, Progress: &progress},
		func(context.Context, *kgo.Record) error { return nil }); err != nil {
		t.Fatal(err)
	}
	out := progress.String()
	if !strings.Contains(out, "[##############################] 100% 10/10 offsets, 10 records") || !strings.HasSuffix(out, "\n") {
		t.Errorf("progress output %q, want a full bar and a final newline", out)
	}
}
