package outbox_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/kafka/outbox"
)

// The transactional outbox: the record is enqueued in the business
// transaction, and a relay publishes it.
func Example() {
	var pool *pgxpool.Pool // your database
	var client *kgo.Client // an idempotent acks=all producer
	ctx := context.Background()
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	// ... the business write, e.g. INSERT INTO orders ...
	if _, err := outbox.Enqueue(ctx, tx, outbox.Message{
		ID:    effects.MustKey("shop", "order-7", "order-created"),
		Topic: "order-events",
		Value: []byte(`{"order":7}`),
	}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	relay, err := outbox.NewRelay(pool, client)
	if err != nil {
		log.Fatal(err)
	}
	go relay.Run(ctx) //nolint:errcheck // returns nil when ctx is done
}
