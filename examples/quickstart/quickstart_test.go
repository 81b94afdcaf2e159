package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	stripego "github.com/stripe/stripe-go/v76"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
	"effectively.dev/stripe/stripetest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// clock is a movable clock for stripetest.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off += d
}

// kit is what run needs: a migrated database with the ledger table, a Kafka
// cluster with the topics run names, and a Stripe server.
type kit struct {
	pool    *pgxpool.Pool
	kafka   *kafkatest.Cluster
	adm     *kadm.Client
	prod    *kgo.Client
	stripe  *stripetest.Server
	clock   *clock
	brokers []string
}

func newKit(t *testing.T) *kit {
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
	// No unique index: a second row for an event would show.
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (payment_id text, cents bigint)`); err != nil {
		t.Fatal(err)
	}
	kc := kafkatest.Start(t)
	if kafkatest.Real() {
		t.Skip("run uses the fixed topic names payments and payments-dlq: needs a throwaway kfake cluster")
	}
	adm := kadm.NewClient(kc.Client(t))
	for _, topic := range []string{"payments", "payments-dlq"} {
		resp, err := adm.CreateTopic(ctx, 3, -1, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("creating topic %s: %v", topic, err)
		}
	}
	clk := &clock{}
	return &kit{
		pool:    pool,
		kafka:   kc,
		adm:     adm,
		prod:    kc.Client(t, kgo.DefaultProduceTopic("payments")),
		stripe:  stripetest.Start(t, stripetest.WithClock(clk.now)),
		clock:   clk,
		brokers: kc.Brokers(),
	}
}

// produce sends bodies to "payments" as a webhook relay would: no
// effectively-key header, so each record's delivery id is its offset.
func (k *kit) produce(t *testing.T, bodies ...[]byte) {
	t.Helper()
	for _, b := range bodies {
		if err := k.prod.ProduceSync(context.Background(), &kgo.Record{Value: b}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// start runs the quick start's worker until the test ends, and returns
// where its error goes.
func (k *kit) start(t *testing.T) <-chan error {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, k.pool, k.stripe.Client(nil), k.brokers) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("run: %v", err)
		}
	})
	return done
}

// drained waits until group billing has committed every record of
// "payments", that is, each was handled (or dead-lettered) and acked; it
// fails the test if run returns first.
func (k *kit) drained(t *testing.T, done <-chan error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- k.kafka.WaitConsumed(ctx, "billing", "payments") }()
	select {
	case err := <-done:
		t.Fatalf("run returned before the topic was drained: %v", err)
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	}
}

// fetchCommits returns group billing's committed offsets: none while the
// group does not exist yet.
func (k *kit) fetchCommits(t *testing.T) (kadm.OffsetResponses, error) {
	t.Helper()
	commits, err := k.adm.FetchOffsets(context.Background(), "billing")
	if errors.Is(err, kerr.GroupIDNotFound) {
		return kadm.OffsetResponses{}, nil
	}
	return commits, err
}

func (k *kit) ledger(t *testing.T) map[string]int {
	t.Helper()
	rows, err := k.pool.Query(context.Background(), `SELECT payment_id, count(*) FROM ledger GROUP BY payment_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		got[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

func body(t *testing.T, p Payment) []byte {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// chargeKey is the idempotency key run's plan sends to Stripe for event id.
func chargeKey(id string) string { return string(effects.MustKey("billing", id, "charge")) }

// TestQuickStart runs the README's quick start against the kits with what a
// webhook relay does in its first week: the same event sent twice without
// any id header (two offsets, one event), a body that is no payment, and a
// redrive of a handled event 49 hours later, past Stripe's 24 h key horizon.
// Each distinct event must give one ledger row and one PaymentIntent.
func TestQuickStart(t *testing.T) {
	k := newKit(t)
	events := []Payment{
		{ID: "evt_1", Customer: "cus_a", Cents: 1000},
		{ID: "evt_2", Customer: "cus_b", Cents: 2000},
		{ID: "evt_3", Customer: "cus_a", Cents: 3000},
	}
	poison := []byte(`{"id": "evt_4", "cents": "ten"}`)
	for _, e := range events {
		k.produce(t, body(t, e))
	}
	k.produce(t, body(t, events[0]), poison) // the resend: same event, new offset, no header

	done := k.start(t)
	k.drained(t, done)
	check := func(when string) {
		t.Helper()
		ledger := k.ledger(t)
		if len(ledger) != len(events) {
			t.Errorf("%s: ledger has %d distinct events, want %d: %v", when, len(ledger), len(events), ledger)
		}
		for _, e := range events {
			if ledger[e.ID] != 1 {
				t.Errorf("%s: %d ledger rows for %s, want 1", when, ledger[e.ID], e.ID)
			}
			if n := k.stripe.Created(chargeKey(e.ID)); n != 1 {
				t.Errorf("%s: %d PaymentIntents for %s, want 1", when, n, e.ID)
			}
		}
		if n := k.stripe.Total(); n != len(events) {
			t.Errorf("%s: Stripe holds %d objects, want %d", when, n, len(events))
		}
	}
	check("after the resend")

	dead, err := k.kafka.ReadAll(context.Background(), "payments-dlq")
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || string(dead[0].Value) != string(poison) {
		var got []string
		for _, r := range dead {
			got = append(got, string(r.Value))
		}
		t.Fatalf("payments-dlq holds %q, want only the poison body %q", got, poison)
	}

	// The redrive, 49 h later: Stripe has forgotten the key, the journal
	// has not.
	k.clock.advance(49 * time.Hour)
	k.produce(t, body(t, events[1]))
	k.drained(t, done)
	check("after the redrive past 49 h")

	// Control: Stripe alone would have charged the redrive again, so the
	// check above is the journal's doing, not the clock's.
	p := &stripego.PaymentIntentParams{Amount: stripego.Int64(events[1].Cents), Currency: stripego.String("usd"), Customer: stripego.String(events[1].Customer)}
	p.SetIdempotencyKey(chargeKey(events[1].ID))
	if _, err := k.stripe.Client(nil).PaymentIntents.New(p); err != nil {
		t.Fatal(err)
	}
	if n := k.stripe.Created(chargeKey(events[1].ID)); n != 2 {
		t.Errorf("control: Stripe created %d PaymentIntents for the key 49 h later, want 2 (the clock did not move past its horizon)", n)
	}
}

// TestQuickStartRevokedKey: with a Stripe key that was revoked, run stops
// with a configuration error before it takes any delivery.
func TestQuickStartRevokedKey(t *testing.T) {
	k := newKit(t)
	k.produce(t, body(t, Payment{ID: "evt_1", Customer: "cus_a", Cents: 1000}))
	k.stripe.RevokeKey(stripetest.APIKey)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := run(ctx, k.pool, k.stripe.Client(nil), k.brokers)
	if effects.ClassOf(err) != effects.InvalidConfig {
		t.Fatalf("run = %v, want a configuration error", err)
	}
	var ce *effects.ConfigError
	if !errors.As(err, &ce) {
		t.Errorf("run = %v, want it to carry an *effects.ConfigError naming the setting", err)
	}
	if ledger := k.ledger(t); len(ledger) != 0 {
		t.Errorf("ledger = %v after a refused start, want no rows", ledger)
	}
	if n := k.stripe.Total(); n != 0 {
		t.Errorf("Stripe holds %d objects after a refused start, want 0", n)
	}
	commits, err := k.fetchCommits(t)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := commits.Lookup("payments", 0); ok || len(commits.Offsets()) != 0 {
		t.Errorf("group billing committed %v after a refused start, want nothing", commits)
	}
}
