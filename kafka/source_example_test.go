package kafka_test

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/kafka"
)

// Tuning a Source for batches of up to 500 records of a partition: twice
// that many per partition may wait, and commits go out at most every
// 250 ms. Options are checked before anything starts.
func ExampleWithMaxPendingPerPartition() {
	client := []kgo.Opt{kgo.SeedBrokers("127.0.0.1:9092"), kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("payments")}
	_, err := kafka.NewSource(client,
		kafka.WithMaxPendingPerPartition(0), // a mistake: nothing could be handed out
		kafka.WithCommitInterval(250*time.Millisecond),
	)
	fmt.Println(errors.Is(err, effects.ErrInvalidConfig), err)

	src, err := kafka.NewSource(client,
		kafka.WithMaxPendingPerPartition(1000),
		kafka.WithCommitInterval(250*time.Millisecond),
		kafka.WithLogger(slog.Default().With("component", "billing")), // failures it retries, rate-limited
	)
	if err != nil {
		panic(err)
	}
	defer src.Close() // fetching starts with the first Next
	fmt.Println("ready")
	// Output:
	// true kafka.NewSource: WithMaxPendingPerPartition: 0 records; need at least 1
	// ready
}
