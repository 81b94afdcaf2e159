package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/kafka/outbox"
	"effectively.dev/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func runCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, &out, &errOut)
	return out.String() + errOut.String(), err
}

// TestRedriveCommand: a dry run prints the selected dead letter and moves
// nothing; the redrive moves it, with its delivery id in the id header,
// and leaves the other class alone.
func TestRedriveCommand(t *testing.T) {
	c := kafkatest.Start(t)
	src, dlq := c.Topic(t, "src", 1), c.Topic(t, "dlq", 1)
	ctx := context.Background()
	poison := kafka.DeadLetterRecord(dlq, effects.Delivery{ID: "a", Body: []byte("A")}, effects.ErrPoison, time.Now())
	refused := kafka.DeadLetterRecord(dlq, effects.Delivery{ID: "b", Body: []byte("B")}, effects.ErrRefused, time.Now())
	if err := c.Client(t).ProduceSync(ctx, poison, refused).FirstErr(); err != nil {
		t.Fatal(err)
	}
	brokers := strings.Join(c.Brokers(), ",")
	out, err := runCmd(t, "redrive", "-brokers", brokers, "-dlq", dlq, "-topic", src, "-class", "poison", "-dry-run")
	if err != nil || !strings.Contains(out, "would move 1 of 2 dead letters") || !strings.Contains(out, `delivery "a" class poison`) {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	if recs, err := c.ReadAll(ctx, src); err != nil || len(recs) != 0 {
		t.Fatalf("source topic after the dry run: %d records, %v", len(recs), err)
	}
	out, err = runCmd(t, "redrive", "-brokers", brokers, "-dlq", dlq, "-topic", src, "-class", "poison", "-yes")
	if err != nil || !strings.Contains(out, "moved 1 of 2 dead letters") {
		t.Fatalf("redrive: %v\n%s", err, out)
	}
	recs, err := c.ReadAll(ctx, src)
	if err != nil || len(recs) != 1 {
		t.Fatalf("source topic: %d records, %v", len(recs), err)
	}
	if id, _ := kafkatest.Header(recs[0], kafka.KeyHeader); id != "a" || string(recs[0].Value) != "A" {
		t.Errorf("redriven record %q, id header %q; want A, a", recs[0].Value, id)
	}
	for _, h := range recs[0].Headers {
		if strings.HasPrefix(h.Key, kafka.DeadLetterHeaderPrefix) {
			t.Errorf("redriven record kept dead-letter header %s", h.Key)
		}
	}
	if _, err := runCmd(t, "redrive", "-dlq", dlq); !errors.Is(err, errUsage) {
		t.Errorf("redrive without -brokers: %v, want a usage error", err)
	}
	if _, err := runCmd(t, "bogus"); !errors.Is(err, errUsage) {
		t.Errorf("unknown command: %v, want a usage error", err)
	}
}

// TestOutboxCommand lists, dry-runs, retries and drops parked rows.
func TestOutboxCommand(t *testing.T) {
	url, pool := outboxDB(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []effects.Key{"m-1", "m-2"} {
		if _, err := outbox.Enqueue(ctx, tx, outbox.Message{ID: id, Topic: "orders", Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// As a relay parks a row the broker refused.
	if _, err := pool.Exec(ctx, `UPDATE effectively_outbox SET parked_at = now(), error_class = 'permanent', attempts = 1, last_error = 'MESSAGE_TOO_LARGE'`); err != nil {
		t.Fatal(err)
	}
	out, err := runCmd(t, "outbox", "list", "-db", url)
	if err != nil || !strings.Contains(out, "2 parked rows") || !strings.Contains(out, "MESSAGE_TOO_LARGE") {
		t.Fatalf("list: %v\n%s", err, out)
	}
	out, err = runCmd(t, "outbox", "retry", "-db", url, "-message-id", "m-1", "-dry-run")
	if err != nil || !strings.Contains(out, "would retry 1 parked rows") {
		t.Fatalf("retry -dry-run: %v\n%s", err, out)
	}
	if n, _ := (outbox.ParkedFilter{}).Count(ctx, pool); n != 2 {
		t.Fatalf("%d parked after a dry run, want 2", n)
	}
	out, err = runCmd(t, "outbox", "retry", "-db", url, "-message-id", "m-1")
	if err != nil || !strings.Contains(out, "returned 1 parked rows") {
		t.Fatalf("retry: %v\n%s", err, out)
	}
	if out, err := runCmd(t, "outbox", "drop", "-db", url); !errors.Is(err, errUsage) || !strings.Contains(out, "-all") {
		t.Fatalf("drop without a selection: %v\n%s; want a usage error naming -all", err, out)
	}
	if out, err := runCmd(t, "outbox", "retry", "-db", url); !errors.Is(err, errUsage) {
		t.Fatalf("retry without a selection: %v\n%s; want a usage error", err, out)
	}
	if n, _ := (outbox.ParkedFilter{}).Count(ctx, pool); n != 1 {
		t.Fatalf("%d parked after drop and retry without a selection, want 1 (nothing changed)", n)
	}
	out, err = runCmd(t, "outbox", "drop", "-db", url, "-class", "permanent")
	if err != nil || !strings.Contains(out, "dropped 1 parked rows") {
		t.Fatalf("drop: %v\n%s", err, out)
	}
	var left []string
	rows, err := pool.Query(ctx, `SELECT message_id FROM effectively_outbox WHERE parked_at IS NULL`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if len(left) != 1 || left[0] != "m-1" {
		t.Errorf("rows left %v, want m-1 pending", left)
	}
	if _, err := runCmd(t, "outbox", "list", "-db", url, "-id", "x"); !errors.Is(err, errUsage) {
		t.Errorf("-id x: %v, want a usage error", err)
	}
}

// outboxDB returns the URL of a fresh database with the outbox's tables,
// and a pool on it.
func outboxDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := pgtest.DB(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return url, pool
}
