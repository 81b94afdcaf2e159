package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/kafka/outbox"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

func outboxPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := outbox.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestMigrateKeyOrder: Migrate creates the key-order index only when given
// WithKeyOrder (it costs every Enqueue an index entry), again idempotently,
// and Schema returns the SQL Migrate runs for the same options.
func TestMigrateKeyOrder(t *testing.T) {
	pool := outboxPool(t) // migrated without options
	ctx := context.Background()
	hasIndex := func() bool {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE indexname = 'effectively_outbox_unsent_key'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	if hasIndex() {
		t.Fatal("Migrate without WithKeyOrder created the key-order index")
	}
	for range 2 {
		if err := outbox.Migrate(ctx, pool, outbox.WithBatchSize(5), outbox.WithKeyOrder(), nil); err != nil {
			t.Fatal(err)
		}
	}
	if !hasIndex() {
		t.Fatal("Migrate with WithKeyOrder did not create the key-order index")
	}
	plain, keyed := outbox.Schema(), outbox.Schema(outbox.WithKeyOrder())
	if strings.Contains(plain, "effectively_outbox_unsent_key") || !strings.Contains(keyed, "effectively_outbox_unsent_key") ||
		!strings.HasPrefix(keyed, plain) || outbox.Schema(outbox.WithBatchSize(5)) != plain {
		t.Errorf("Schema() has the key-order index: %t; Schema(WithKeyOrder()) has it: %t, extends Schema(): %t; want false, true, true",
			strings.Contains(plain, "effectively_outbox_unsent_key"), strings.Contains(keyed, "effectively_outbox_unsent_key"), strings.HasPrefix(keyed, plain))
	}
}

// inTx runs f in a transaction and commits, or rolls back if rollback.
func inTx(t *testing.T, pool *pgxpool.Pool, rollback bool, f func(tx pgx.Tx) error) error {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := f(tx); err != nil {
		return err
	}
	if rollback {
		return tx.Rollback(ctx)
	}
	return tx.Commit(ctx)
}

func TestOutboxEnqueue(t *testing.T) {
	pool := outboxPool(t)
	ctx := context.Background()
	msg := outbox.Message{ID: effects.MustKey("orders", "o-1", "created"), Topic: "orders", Value: []byte("v1")}
	enqueue := func(m outbox.Message) (bool, error) {
		var inserted bool
		err := inTx(t, pool, false, func(tx pgx.Tx) error {
			var err error
			inserted, err = outbox.Enqueue(ctx, tx, m)
			return err
		})
		return inserted, err
	}
	if ok, err := enqueue(msg); err != nil || !ok {
		t.Fatalf("first Enqueue = %v, %v; want inserted", ok, err)
	}
	if ok, err := enqueue(msg); err != nil || ok {
		t.Fatalf("same message again = %v, %v; want not inserted, no error", ok, err)
	}
	other := msg
	other.Value = []byte("v2")
	if _, err := enqueue(other); !errors.Is(err, effects.ErrKeyReused) {
		t.Fatalf("same id, other payload: %v, want ErrKeyReused", err)
	}
	if _, err := enqueue(outbox.Message{ID: "bad\x00key", Topic: "orders"}); !errors.Is(err, effects.ErrInvalidKey) {
		t.Fatalf("invalid id: %v, want ErrInvalidKey", err)
	}
	// A rolled-back business transaction leaves no row.
	if err := inTx(t, pool, true, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Message{ID: "rolled-back", Topic: "orders"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM effectively_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d outbox rows, want 1", n)
	}
}

// TestOutboxTwoRelays: two relays publish one outbox at once; every
// committed row reaches the topic, none twice, and rows of rolled-back
// business transactions never do.
// With WithDeleteSent the published rows are deleted instead: the outbox
// ends empty, with the same guarantees.
func TestOutboxTwoRelays(t *testing.T) {
	t.Run("mark sent", func(t *testing.T) { testTwoRelays(t, false) })
	t.Run("delete sent", func(t *testing.T) { testTwoRelays(t, true) })
}

func testTwoRelays(t *testing.T, deleteSent bool) {
	pool := outboxPool(t)
	c := kafkatest.Start(t)
	topic := c.Topic(t, "outbox", 3)
	ctx := context.Background()

	const txs, perTx = 40, 10
	want := map[string]bool{}
	for i := 0; i < txs; i++ {
		rollback := i%10 == 9 // some business transactions fail
		err := inTx(t, pool, rollback, func(tx pgx.Tx) error {
			for j := 0; j < perTx; j++ {
				id := fmt.Sprintf("order-%d-%d", i, j)
				if _, err := outbox.Enqueue(ctx, tx, outbox.Message{ID: effects.Key(id), Topic: topic,
					Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "type", Value: []byte("created")}}}); err != nil {
					return err
				}
				if !rollback {
					want[id] = true
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	sent := make([]int, 2)
	relays := make([]*outbox.Relay, 2)
	for i := range relays {
		opts := []outbox.RelayOption{outbox.WithBatchSize(15), outbox.WithPollInterval(20 * time.Millisecond),
			outbox.WithObserver(effects.ObserverFunc(func(_ context.Context, ev effects.Event) { t.Errorf("relay %d: %v", i, ev.Err) }))}
		if deleteSent {
			opts = append(opts, outbox.WithDeleteSent())
		}
		relay, err := outbox.NewRelay(pool, c.Client(t), opts...)
		if err != nil {
			t.Fatal(err)
		}
		relays[i] = relay
	}
	// Each relay takes one batch before any of them races, so that both
	// take batches however the scheduler treats them (without it, one
	// relay can drain the outbox before the other runs, on a loaded
	// machine).
	for i, relay := range relays {
		n, err := relay.RelayBatch(rctx)
		if err != nil || n != 15 {
			t.Fatalf("relay %d: first batch: %d, %v", i, n, err)
		}
		sent[i] += n
	}
	for i, relay := range relays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rctx.Err() == nil {
				n, err := relay.RelayBatch(rctx)
				if err != nil && rctx.Err() == nil {
					t.Errorf("relay %d: %v", i, err)
				}
				sent[i] += n
				if n == 0 {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
	eventually(t, 30*time.Second, "every row marked sent", func() bool {
		var unsent int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM effectively_outbox WHERE sent_at IS NULL`).Scan(&unsent); err != nil {
			t.Fatal(err)
		}
		return unsent == 0
	})
	cancel()
	wg.Wait()

	counts := published(t, c, topic)
	dups := 0
	for id := range want {
		switch n := counts[id]; {
		case n == 0:
			t.Errorf("%s: not published", id)
		case n > 1:
			dups += n - 1
		}
	}
	for id := range counts {
		if !want[id] {
			t.Errorf("%s published, but its business transaction rolled back (or it is unknown)", id)
		}
	}
	if dups != 0 {
		t.Errorf("%d duplicates without a crash, want 0", dups)
	}
	if sent[0] == 0 || sent[1] == 0 {
		t.Errorf("relays sent %v rows: both should have taken batches", sent)
	}
	t.Logf("%d rows, relays sent %v, %d duplicates", len(want), sent, dups)
	if deleteSent {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM effectively_outbox`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left != 0 {
			t.Errorf("%d rows left in the outbox, want every published row deleted", left)
		}
		return
	}

	// The ref stored for a row points at its record.
	var id, ref string
	if err := pool.QueryRow(ctx, `SELECT message_id, ref FROM effectively_outbox ORDER BY id LIMIT 1`).Scan(&id, &ref); err != nil {
		t.Fatal(err)
	}
	recs, err := c.ReadAll(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if h, _ := kafkatest.Header(r, kafka.KeyHeader); h == id {
			if refOf(r) != ref {
				t.Errorf("row %s ref %q, record at %q", id, ref, refOf(r))
			}
			if typ, _ := kafkatest.Header(r, "type"); typ != "created" {
				t.Errorf("header type = %q, want created", typ)
			}
		}
	}
}

func TestPruneOutbox(t *testing.T) {
	pool := outboxPool(t)
	c := kafkatest.Start(t)
	topic := c.Topic(t, "prune", 1)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if err := inTx(t, pool, false, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Message{ID: effects.Key(fmt.Sprint("m", i)), Topic: topic})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	relay, err := outbox.NewRelay(pool, c.Client(t), outbox.WithBatchSize(2))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RelayBatch(ctx); err != nil || n != 2 {
		t.Fatalf("RelayBatch = %d, %v; want 2", n, err)
	}
	n, err := outbox.Prune(ctx, pool, time.Now().Add(time.Hour), 10)
	if err != nil || n != 2 {
		t.Fatalf("PruneOutbox = %d, %v; want the 2 sent rows", n, err)
	}
	if n, err := relay.RelayBatch(ctx); err != nil || n != 1 {
		t.Fatalf("RelayBatch = %d, %v; want the unsent row", n, err)
	}
}

// A batch waits for its records, never for the client's linger: with the
// longest linger franz-go allows (a minute), batches to a topic the client
// does not know yet and to one it knows finish inside a deadline that a
// lingering record would miss (it would fail with the deadline, unsent).
func TestRelayNeverWaitsForLinger(t *testing.T) {
	pool := outboxPool(t)
	c := kafkatest.Start(t)
	topic := c.Topic(t, "linger", 2)
	ctx := context.Background()
	if err := inTx(t, pool, false, func(tx pgx.Tx) error {
		for i := range 6 {
			if _, err := outbox.Enqueue(ctx, tx, outbox.Message{ID: effects.Key(fmt.Sprint("m", i)), Topic: topic}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, c.Client(t, kgo.ProducerLinger(time.Minute)), outbox.WithBatchSize(3))
	if err != nil {
		t.Fatal(err)
	}
	for batch := range 2 {
		bctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		n, err := relay.RelayBatch(bctx)
		cancel()
		if err != nil || n != 3 {
			t.Fatalf("batch %d: RelayBatch = %d, %v; want 3 rows sent without waiting for the linger", batch, n, err)
		}
	}
	if ids := published(t, c, topic); len(ids) != 6 {
		t.Errorf("%d message ids published, want 6", len(ids))
	}
}

func TestRelayAndPruneRefuseBadConfiguration(t *testing.T) {
	pool := outboxPool(t)
	cl := kafkatest.Start(t).Client(t)
	for _, tc := range []struct {
		name, option string
		err          error
	}{
		{"nil db", "db", second(outbox.NewRelay(nil, cl))},
		{"nil client", "client", second(outbox.NewRelay(pool, nil))},
		{"zero batch", "WithBatchSize", second(outbox.NewRelay(pool, cl, outbox.WithBatchSize(0)))},
		{"zero interval", "WithPollInterval", second(outbox.NewRelay(pool, cl, outbox.WithPollInterval(0)))},
		{"prune limit", "limit", second(outbox.Prune(context.Background(), pool, time.Now(), 0))},
		{"migrate nil db", "db", outbox.Migrate(context.Background(), nil)},
	} {
		var ce *effects.ConfigError
		if !errors.As(tc.err, &ce) || ce.Option != tc.option {
			t.Errorf("%s: %v, want a *ConfigError naming %s", tc.name, tc.err, tc.option)
		}
	}
	if _, err := outbox.NewRelay(pool, cl, nil, outbox.WithBatchSize(5), nil); err != nil {
		t.Errorf("nil options: %v, want them ignored", err)
	}
	_, err := outbox.NewRelay(pool, kafkatest.Start(t).Client(t, kgo.DisableIdempotentWrite()))
	if !errors.Is(err, kafka.ErrNotIdempotent) {
		t.Errorf("non-idempotent client: %v, want kafka.ErrNotIdempotent", err)
	}
}

func second[T any](_ T, err error) error { return err }

// TestEnqueueStatementInAPipelinedEffect: the outbox row travels with the
// business row, the key's row and COMMIT (postgres.NewPipelined); it
// commits once per key, a redelivery replays without a second row, and a
// message id already in the outbox fails the whole transaction.
func TestEnqueueStatementInAPipelinedEffect(t *testing.T) {
	pool := outboxPool(t)
	ctx := context.Background()
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, cents bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	type order struct {
		ID    string
		Cents int64
	}
	fx, err := postgres.NewPipelined(pool, "shop", func(_ context.Context, key effects.Key, o order) (string, []postgres.Statement, error) {
		ev, err := outbox.EnqueueStatement(outbox.Message{ID: effects.MustKey("shop", o.ID, "created"), Topic: "orders", Value: []byte(o.ID)})
		return o.ID, []postgres.Statement{{SQL: `INSERT INTO orders (id, cents) VALUES ($1, $2)`, Args: []any{o.ID, o.Cents}}, ev}, err
	})
	if err != nil {
		t.Fatal(err)
	}
	key := effects.MustKey("shop", "o-1", "order")
	for i, want := range []effects.Status{effects.Applied, effects.Replayed, effects.Replayed} {
		res, err := fx.Apply(ctx, key, order{ID: "o-1", Cents: 5})
		if err != nil || res.Status != want || res.Ref != "o-1" {
			t.Fatalf("Apply %d = %+v, %v; want %v with ref o-1", i+1, res, err, want)
		}
	}
	count := func(sql string, args ...any) int {
		var n int
		if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n, m := count(`SELECT count(*) FROM orders`), count(`SELECT count(*) FROM effectively_outbox WHERE message_id = $1`, string(effects.MustKey("shop", "o-1", "created"))); n != 1 || m != 1 {
		t.Fatalf("%d orders, %d outbox rows; want 1, 1", n, m)
	}
	// Another key enqueueing the same message id: the transaction fails,
	// its order row with it.
	if _, err := fx.Apply(ctx, effects.MustKey("shop", "o-1-again", "order"), order{ID: "o-1", Cents: 5}); err == nil {
		t.Fatal("a message id already in the outbox: no error")
	}
	if n := count(`SELECT count(*) FROM effectively_keys WHERE key = $1`, string(effects.MustKey("shop", "o-1-again", "order"))); n != 0 {
		t.Fatalf("%d key rows after the failed transaction, want 0", n)
	}
	if _, err := outbox.EnqueueStatement(outbox.Message{ID: "bad\x00key", Topic: "orders"}); !errors.Is(err, effects.ErrInvalidKey) {
		t.Fatalf("invalid id: %v, want ErrInvalidKey", err)
	}
	if _, err := outbox.EnqueueStatement(outbox.Message{ID: "ok"}); err == nil {
		t.Fatal("empty topic: no error")
	}
}
