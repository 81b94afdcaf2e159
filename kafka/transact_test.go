package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

func newSession(t *testing.T, c *kafkatest.Cluster, txnID, group, topic string) *kgo.GroupTransactSession {
	t.Helper()
	sess, err := kgo.NewGroupTransactSession(c.Opts(
		kgo.TransactionalID(txnID),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.HeartbeatInterval(100*time.Millisecond),
		kgo.SessionTimeout(3*time.Second),
		kgo.RebalanceTimeout(5*time.Second),
		kgo.TransactionTimeout(10*time.Second),
	)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sess.Close)
	return sess
}

// upper is the transform under test: one output per input, carrying the
// input's id.
func upper(out string) func(context.Context, *kgo.Record) ([]*kgo.Record, error) {
	return func(_ context.Context, in *kgo.Record) ([]*kgo.Record, error) {
		id, _ := kafkatest.Header(in, "id")
		return []*kgo.Record{{
			Topic:   out,
			Key:     in.Key,
			Value:   []byte(strings.ToUpper(string(in.Value))),
			Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(id)}},
		}}, nil
	}
}

// TestTransformExactlyOnceUnderFaultsAndRebalance runs two group members
// over one input; the second joins mid-stream, and the broker fails some
// offset commits (aborting their transactions), drops some produce and
// EndTxn requests. Read with read_committed, the output holds every input
// exactly once.
func TestTransformExactlyOnceUnderFaultsAndRebalance(t *testing.T) {
	c := kafkatest.Start(t)
	in := c.Topic(t, "in", 4)
	out := c.Topic(t, "out", 4)
	group := "g-" + in
	const n = 400

	// On kfake, inject broker faults (a real cluster gets only the
	// rebalance). Two transactions abort: their offset commits fail. Every
	// 5th transactional produce request and the first EndTxn lose their
	// connection before the broker sees them; franz-go retries them.
	var (
		commits  *kfake.FaultHandle
		produces atomic.Int64
	)
	if fake := c.Fake; fake != nil {
		commits = fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.TxnOffsetCommit}, Err: kerr.ConcurrentTransactions, Count: 2})
		fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
			fake.KeepControl()
			if req.(*kmsg.ProduceRequest).TransactionID != nil && produces.Add(1)%5 == 0 {
				return nil, errors.New("injected: connection dropped"), true
			}
			return nil, nil, false
		})
		fake.ControlKey(int16(kmsg.EndTxn), func(kmsg.Request) (kmsg.Response, error, bool) {
			return nil, errors.New("injected: connection dropped"), true
		})
	}

	producer := c.Client(t)
	produceWave := func(from, to int) {
		var recs []*kgo.Record
		for i := from; i < to; i++ {
			recs = append(recs, &kgo.Record{Topic: in, Key: []byte(fmt.Sprint(i)), Value: []byte(fmt.Sprintf("v%d", i)),
				Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(fmt.Sprint(i))}}})
		}
		if err := producer.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Error(err)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		stats []kafka.TransformStats
	)
	member := func(txnID string, handled *atomic.Int64) {
		sess := newSession(t, c, txnID, group, in)
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn := upper(out)
			for ctx.Err() == nil {
				st, err := kafka.Transform(ctx, sess, func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
					handled.Add(1)
					time.Sleep(time.Millisecond) // a transform that takes time, so the join lands mid-stream
					return fn(ctx, r)
				}, kafka.WithTransactionSize(20))
				mu.Lock()
				stats = append(stats, st)
				mu.Unlock()
				if err != nil {
					t.Errorf("%s: %v", txnID, err)
					return
				}
			}
		}()
	}

	var first, second atomic.Int64
	member("tx-1", &first)
	produceWave(0, n/2)
	waitFor(t, 20*time.Second, "the first member to start", func() bool { return first.Load() >= 40 })
	member("tx-2", &second) // joins mid-stream: the group rebalances
	produceWave(n/2, n)

	var counts map[string]int
	waitFor(t, 60*time.Second, "every input in the output", func() bool {
		counts = readCounts(t, c, out, "id")
		return len(counts) == n
	})
	cancel()
	wg.Wait()
	counts = readCounts(t, c, out, "id")
	for i := 0; i < n; i++ {
		if got := counts[fmt.Sprint(i)]; got != 1 {
			t.Errorf("input %d: %d outputs under read_committed, want exactly 1", i, got)
		}
	}
	if len(counts) != n {
		t.Errorf("%d distinct outputs, want %d", len(counts), n)
	}
	if second.Load() == 0 {
		t.Error("the second member processed nothing: no rebalance was exercised")
	}
	if commits != nil && commits.Hits() != 2 {
		t.Errorf("%d offset commits failed, want 2", commits.Hits())
	}
	var total kafka.TransformStats
	for _, st := range stats {
		total.Transactions += st.Transactions
		total.Records += st.Records
		total.Aborted += st.Aborted
	}
	if commits != nil && total.Aborted < 2 {
		t.Errorf("%d aborted transactions, want at least the 2 injected", total.Aborted)
	}
	if total.Records != n {
		t.Errorf("committed transactions consumed %d records, want %d", total.Records, n)
	}
	handled := first.Load() + second.Load()
	t.Logf("%d transactions committed, %d aborted; the transform ran %d times for %d inputs; produce requests %d",
		total.Transactions, total.Aborted, handled, n, produces.Load())
}

// TestTransformAbortsOnError: an error from the transform aborts the
// transaction, nothing of it is visible, and the next Transform consumes
// the same input again.
func TestTransformAbortsOnError(t *testing.T) {
	c := kafkatest.Start(t)
	in := c.Topic(t, "in", 1)
	out := c.Topic(t, "out", 1)
	producer := c.Client(t)
	var recs []*kgo.Record
	for i := 0; i < 3; i++ {
		recs = append(recs, &kgo.Record{Topic: in, Value: []byte(fmt.Sprintf("v%d", i)),
			Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(fmt.Sprint(i))}}})
	}
	if err := producer.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	sess := newSession(t, c, "tx-abort", "g-"+in, in)
	boom := errors.New("boom")
	fn := upper(out)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := kafka.Transform(ctx, sess, func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		if string(r.Value) == "v2" {
			return nil, boom
		}
		return fn(ctx, r)
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Transform = %v, want the transform's error", err)
	}
	if got := readCounts(t, c, out, "id"); len(got) != 0 {
		t.Fatalf("aborted transaction visible under read_committed: %v", got)
	}
	// Run again with a transform that works: all three, once each.
	var seen atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = kafka.Transform(ctx, sess, func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
			seen.Add(1)
			return fn(ctx, r)
		})
	}()
	waitFor(t, 20*time.Second, "the retried input", func() bool { return len(readCounts(t, c, out, "id")) == 3 })
	cancel()
	<-done
	for id, n := range readCounts(t, c, out, "id") {
		if n != 1 {
			t.Errorf("input %s: %d outputs, want 1", id, n)
		}
	}
}

// readCounts counts the records of topic under read_committed by the value
// of header.
func readCounts(t *testing.T, c *kafkatest.Cluster, topic, header string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := c.ReadAll(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, r := range recs {
		v, _ := kafkatest.Header(r, header)
		counts[v]++
	}
	return counts
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
