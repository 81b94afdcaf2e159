package kafka_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/postgres"
)

// exampleCluster starts an in-process Kafka with one topic of one
// partition; call the returned function to stop it.
func exampleCluster(topic string) (*kfake.Cluster, func()) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		log.Fatal(err)
	}
	return c, c.Close
}

// The plain producer: one record per Apply, the key in a header. It is
// at-least-once with any redelivery in its window, and says so.
func ExampleNewProducer() {
	cluster, stop := exampleCluster("payments")
	defer stop()
	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	producer, err := kafka.NewProducer(client, "payments")
	if err != nil {
		log.Fatal(err)
	}
	key := effects.MustKey("billing", "evt_42", "payment-event")
	res, err := producer.Apply(context.Background(), key, kafka.Message{Value: []byte(`{"cents":4200}`)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Status, res.Ref)
	fmt.Println(producer.Contract().DuplicateWindow.Trigger)
	// Output:
	// applied 0/0
	// any redelivery
}

// With a journal, a redelivered key is replayed from the journal instead of
// producing a second record.
func ExampleWithJournal() {
	var pool *pgxpool.Pool // your database
	var client *kgo.Client // an idempotent acks=all producer (franz-go's default)
	ctx := context.Background()

	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	journal, err := postgres.NewJournal(pool, "billing")
	if err != nil {
		log.Fatal(err)
	}
	producer, err := kafka.NewProducer(client, "payments", kafka.WithJournal(journal))
	if err != nil {
		log.Fatal(err)
	}
	key := effects.MustKey("billing", "evt_42", "payment-event")
	res, err := producer.Apply(ctx, key, kafka.Message{Value: []byte(`{"cents":4200}`)})
	switch {
	case effects.ClassOf(err) == effects.Retryable:
		// Leave the message unacked: its redelivery retries the same key.
	case err != nil:
		log.Fatal(err)
	case res.Replayed():
		fmt.Println("already produced at", res.Ref)
	}
}

// A consumer source: side effect first, then Ack, which marks the record
// handled; the group commit stores the partition's offset once every
// earlier delivery was acked.
func ExampleNewSource() {
	cluster, stop := exampleCluster("orders")
	defer stop()
	seeds := kgo.SeedBrokers(cluster.ListenAddrs()...)
	producer, err := kgo.NewClient(seeds)
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	ctx := context.Background()
	rec := &kgo.Record{Topic: "orders", Value: []byte("order 7"),
		Headers: []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte("order-7")}}}
	if err := producer.ProduceSync(ctx, rec).FirstErr(); err != nil {
		log.Fatal(err)
	}

	source, err := kafka.NewSource([]kgo.Opt{seeds, kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders")})
	if err != nil {
		log.Fatal(err)
	}
	defer source.Close()
	d, err := source.Next(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s %s %q\n", d.ID, d.Ordering, d.Body)
	// ... do the side effect under keys derived from d.ID, then:
	if err := source.Ack(ctx, d); err != nil {
		log.Fatal(err)
	}
	// The ack is committed by the next group commit, within 100 ms; Flush
	// commits it now (Close does too).
	if err := source.Flush(ctx); err != nil {
		log.Fatal(err)
	}
	offsets, err := kadm.NewClient(producer).FetchOffsets(ctx, "billing")
	if err != nil {
		log.Fatal(err)
	}
	o, _ := offsets.Lookup("orders", 0)
	fmt.Println("committed", o.At)
	// Output:
	// order-7 orders/0 "order 7"
	// committed 1
}

// Consume-transform-produce in Kafka transactions. Readers of the output
// must use read_committed.
func ExampleTransform() {
	var seeds []string // your brokers
	sess, err := kgo.NewGroupTransactSession(
		kgo.SeedBrokers(seeds...),
		kgo.TransactionalID("enricher-1"), // unique per running instance
		kgo.ConsumerGroup("enricher"),
		kgo.ConsumeTopics("orders"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err = kafka.Transform(ctx, sess, func(_ context.Context, in *kgo.Record) ([]*kgo.Record, error) {
		return []*kgo.Record{{Topic: "orders-upper", Key: in.Key, Value: []byte(strings.ToUpper(string(in.Value)))}}, nil
	})
	if err != nil {
		log.Fatal(err)
	}

	// A reader of orders-upper:
	reader, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics("orders-upper"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		log.Fatal(err)
	}
	defer reader.Close()
}

// Re-feed an offset range through a handler, at most 500 records a second.
func ExampleReplay() {
	cluster, stop := exampleCluster("events")
	defer stop()
	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	for i := range 5 {
		if err := client.ProduceSync(ctx, &kgo.Record{Topic: "events", Value: []byte(fmt.Sprint("event ", i))}).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}

	stats, err := kafka.Replay(ctx, client, "events", func(_ context.Context, recs []*kgo.Record) error {
		r := recs[0] // one record at a time without WithBatchSize
		fmt.Printf("%d: %s\n", r.Offset, r.Value)
		return nil
	}, kafka.WithOffsetRange(1, 4), kafka.WithLimiter(rate.NewLimiter(500, 1)))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(stats.Records, "records, resume at", stats.Next[0])
	// Output:
	// 1: event 1
	// 2: event 2
	// 3: event 3
	// 3 records, resume at 4
}

// Replay from a point in time (e.g. before an incident) to now, at most
// 200 records a second in bursts of up to 20.
func ExampleWithTimeRange() {
	var client *kgo.Client // your client
	incident := time.Date(2025, 3, 1, 14, 0, 0, 0, time.UTC)
	_, err := kafka.Replay(context.Background(), client, "payments", func(ctx context.Context, recs []*kgo.Record) error {
		return nil // your idempotent handler
	}, kafka.WithTimeRange(incident.Add(-10*time.Minute), time.Time{}), kafka.WithLimiter(rate.NewLimiter(200, 20)))
	if err != nil {
		log.Fatal(err)
	}
}
