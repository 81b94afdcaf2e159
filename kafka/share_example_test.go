package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// A share group consumed by an consume.Consumer: more handlers than
// partitions, each record accepted after its handler returned nil. A
// failed attempt goes back to the broker (Release) and comes back with
// its delivery count, the consumer's attempt number, raised.
func ExampleNewShareSource() {
	cluster, err := kafkatest.New(kfake.SeedTopics(1, "jobs"), kafkatest.ShareBrokerConfigs(30*time.Second, 0))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	seeds := kgo.SeedBrokers(cluster.Brokers()...)
	admin, err := kgo.NewClient(seeds)
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close()
	ctx := context.Background()
	// A share group starts at the latest offset unless its config
	// (share.auto.offset.reset) says otherwise.
	if err := cluster.SetShareFromEarliest(ctx, "workers"); err != nil {
		log.Fatal(err)
	}
	for _, id := range []string{"job-1", "job-2", "job-3"} {
		rec := &kgo.Record{Topic: "jobs", Value: []byte(id), Headers: []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte(id)}}}
		if err := admin.ProduceSync(ctx, rec).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}

	source, err := kafka.NewShareSource([]kgo.Opt{seeds, kgo.ShareGroup("workers"), kgo.ConsumeTopics("jobs")})
	if err != nil {
		log.Fatal(err)
	}
	defer source.Close()
	var (
		mu   sync.Mutex
		seen []string
		done = make(chan struct{})
	)
	consumer, err := consume.New(source, func(ctx context.Context, d effects.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%s attempt %d", d.ID, d.Attempt))
		if d.ID == "job-2" && d.Attempt == 1 {
			return errors.New("downstream busy") // released, delivered again
		}
		// ... the effect, under keys derived from d.ID ...
		if len(seen) == 4 {
			close(done)
		}
		return nil
	}, consume.WithConcurrency(16), consume.WithBackoff(time.Millisecond, 10*time.Millisecond),
		consume.WithoutDeadLetter()) // a failing job stays in the share group
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- consumer.Run(runCtx) }()
	<-done
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
	sort.Strings(seen)
	for _, s := range seen {
		fmt.Println(s)
	}
	fmt.Println("released:", consumer.Stats().Released)
	// Output:
	// job-1 attempt 1
	// job-2 attempt 1
	// job-2 attempt 2
	// job-3 attempt 1
	// released: 1
}
