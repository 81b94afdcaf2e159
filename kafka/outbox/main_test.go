package outbox_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/postgres/pgtest"
)

// TestMain stops the shared PostgreSQL cluster after the tests and, with
// goleak (pgtest.Main), fails the run if any goroutine outlived them.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// published counts the records of topic under read_committed by their
// message id (kafka.KeyHeader).
func published(t *testing.T, c *kafkatest.Cluster, topic string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := c.ReadAll(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for _, r := range recs {
		id, _ := kafkatest.Header(r, kafka.KeyHeader)
		ids[id]++
	}
	return ids
}

// eventually polls cond until it holds or d passed.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// refOf is the ref the relay stores for r: "partition/offset".
func refOf(r *kgo.Record) string {
	return strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
}
