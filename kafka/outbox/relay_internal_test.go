package outbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/postgres/pgtest"
)

// TestRelayCrashAfterAck shows the relay's declared duplicate window: a
// relay that dies after the broker's ack and before the rows are marked
// sent leaves them unsent, and they are published again; nothing else is
// duplicated and nothing is lost.
func TestRelayCrashAfterAck(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	c := kafkatest.New(t)
	topic := c.Topic(t, "crash", 2)
	const n, batch = 30, 10
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if _, err := Enqueue(ctx, tx, Message{ID: effects.Key(fmt.Sprint("m", i)), Topic: topic, Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	crashing, err := NewRelay(pool, c.Client(t), WithBatchSize(batch), WithProduceTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	crash := errors.New("relay process died")
	crashing.afterProduce = func(context.Context) error { return crash }
	if _, err := crashing.RelayBatch(ctx); !errors.Is(err, crash) {
		t.Fatalf("RelayBatch = %v, want the crash", err)
	}

	healthy, err := NewRelay(pool, c.Client(t), WithBatchSize(batch), WithPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- healthy.Run(rctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var unsent int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM effectively_outbox WHERE sent_at IS NULL`).Scan(&unsent); err != nil {
			t.Fatal(err)
		}
		if unsent == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still unsent", unsent)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}

	recs, err := kafkatest.ReadAll(ctx, c.Opts(), topic)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, r := range recs {
		id, _ := kafkatest.Header(r, kafka.KeyHeader)
		counts[id]++
	}
	dups := 0
	for i := 0; i < n; i++ {
		id := fmt.Sprint("m", i)
		switch got := counts[id]; {
		case got == 0:
			t.Errorf("%s lost", id)
		case got == 2 && i < batch:
			dups++ // in the crashed batch: the declared window
		case got != 1:
			t.Errorf("%s published %d times; only the crashed batch may repeat", id, got)
		}
	}
	if dups != batch {
		t.Errorf("%d duplicates, want the %d rows of the crashed batch", dups, batch)
	}
}
