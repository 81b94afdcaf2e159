package kafkatest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"effectively.dev/kafka/kafkatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func produce(t *testing.T, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func readAll(t *testing.T, c *kafkatest.Cluster, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := c.ReadAll(ctx, topic)
	if err != nil {
		t.Fatalf("ReadAll: %v", err)
	}
	return recs
}

func values(recs []*kgo.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, string(r.Value))
	}
	return out
}

func TestTopicsAreFreshAndUnique(t *testing.T) {
	c := kafkatest.Start(t)
	a, b := c.Topic(t, "payments", 2), c.Topic(t, "payments", 2)
	if a == b || !strings.HasPrefix(a, "payments-") {
		t.Fatalf("topics %q and %q: want two distinct names starting with payments-", a, b)
	}
	if recs := readAll(t, c, a); len(recs) != 0 {
		t.Fatalf("a new topic has %d records", len(recs))
	}
}

// ReadAll returns what a read_committed reader sees: committed records in
// partition order, without aborted ones and without transaction markers.
func TestReadAllSeesOnlyCommittedRecords(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "txn", 1)
	plain := c.Client(t, kgo.DefaultProduceTopic(topic))
	produce(t, plain, &kgo.Record{Value: []byte("plain"), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("p1")}}})

	txn := c.Client(t, kgo.DefaultProduceTopic(topic), kgo.TransactionalID("kafkatest-"+topic))
	ctx := context.Background()
	for _, commit := range []bool{true, false} {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		v := map[bool]string{true: "committed", false: "aborted"}[commit]
		produce(t, txn, &kgo.Record{Value: []byte(v)})
		if err := txn.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	recs := readAll(t, c, topic)
	if got := strings.Join(values(recs), ","); got != "plain,committed" {
		t.Fatalf("ReadAll = %s, want plain,committed", got)
	}
	if id, ok := kafkatest.Header(recs[0], "id"); !ok || id != "p1" {
		t.Errorf("Header(id) = %q, %t", id, ok)
	}
	if _, ok := kafkatest.Header(recs[1], "id"); ok {
		t.Error("Header found a header the record does not have")
	}
}

// ReadAll fails, rather than hangs, on a cluster that is not there.
func TestReadAllFailsOnADeadCluster(t *testing.T) {
	c := kafkatest.Start(t)
	c.RequireFake(t).Close() // the cluster stops listening
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.ReadAll(ctx, "nowhere")
	if err == nil || !strings.Contains(err.Error(), "nowhere") {
		t.Fatalf("ReadAll from a dead address = %v, want an error naming the topic", err)
	}
	if d := time.Since(start); d > 9*time.Second {
		t.Errorf("ReadAll took %v to give up", d)
	}
}

func TestRestartKeepsRecords(t *testing.T) {
	c := kafkatest.StartRestartable(t)
	topic := c.Topic(t, "durable", 1)
	produce(t, c.Client(t, kgo.DefaultProduceTopic(topic)), &kgo.Record{Value: []byte("before")})
	brokers := strings.Join(c.Brokers(), ",")
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Brokers(), ","); got != brokers {
		t.Errorf("brokers moved from %s to %s", brokers, got)
	}
	produce(t, c.Client(t, kgo.DefaultProduceTopic(topic)), &kgo.Record{Value: []byte("after")})
	if got := strings.Join(values(readAll(t, c, topic)), ","); got != "before,after" {
		t.Fatalf("records after a restart: %s, want before,after", got)
	}
}

func TestRestartNeedsStartRestartable(t *testing.T) {
	if err := kafkatest.Start(t).Restart(); err == nil || !strings.Contains(err.Error(), "StartRestartable") {
		t.Fatalf("Restart of a plain cluster = %v, want an error naming StartRestartable", err)
	}
}

// GroupOpts makes a consumer group that a member joins, and leaves, within
// seconds.
func TestGroupOptsConsume(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "group", 3)
	produce(t, c.Client(t, kgo.DefaultProduceTopic(topic)),
		&kgo.Record{Value: []byte("a")}, &kgo.Record{Value: []byte("b")}, &kgo.Record{Value: []byte("c")})
	consumer := c.Client(t, kafkatest.GroupOpts("g-"+topic, topic)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seen := 0
	for seen < 3 {
		fs := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of 3 records: %v", seen, err)
		}
		seen += fs.NumRecords()
	}
}

// KAFKA_BROKERS points New at a running cluster (here another kfake,
// standing in for a real one): no kfake is started, fault injection is not
// offered, and Close leaves the cluster alone.
func TestKafkaBrokersPointsAtARealCluster(t *testing.T) {
	real := kafkatest.Start(t)
	topic := real.Topic(t, "shared", 1)
	t.Setenv("KAFKA_BROKERS", " "+strings.Join(real.Brokers(), ",")+", ")
	if !kafkatest.Real() {
		t.Fatal("Real() is false with KAFKA_BROKERS set")
	}
	c := kafkatest.Start(t)
	if c.Fake != nil {
		t.Fatal("New started kfake although KAFKA_BROKERS is set")
	}
	if got, want := strings.Join(c.Brokers(), ","), strings.Join(real.Brokers(), ","); got != want {
		t.Fatalf("brokers %q, want %q from KAFKA_BROKERS, trimmed", got, want)
	}
	produce(t, c.Client(t, kgo.DefaultProduceTopic(topic)), &kgo.Record{Value: []byte("through the env")})
	c.Close()
	if got := values(readAll(t, real, topic)); len(got) != 1 || got[0] != "through the env" {
		t.Fatalf("the real cluster holds %q", got)
	}
	t.Run("RequireFake skips", func(t *testing.T) {
		c.RequireFake(t)
		t.Fatal("RequireFake did not skip on a real cluster")
	})
}
