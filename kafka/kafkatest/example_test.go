package kafkatest_test

import (
	"context"
	"fmt"
	"log"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/kafka/kafkatest"
)

// A cluster, a fresh topic, a produce and what a read_committed reader then
// sees. In a test, kafkatest.Start(t) and c.Topic(t, ...) do the same and
// clean up when the test ends.
func ExampleNew() {
	c, err := kafkatest.New() // kfake in process, or KAFKA_BROKERS
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	topic, err := c.CreateTopic(ctx, "payments", 3)
	if err != nil {
		log.Fatal(err)
	}
	cl, err := kgo.NewClient(c.Opts(kgo.DefaultProduceTopic(topic))...)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	rec := &kgo.Record{Key: []byte("evt_1"), Value: []byte("charged"), Headers: []kgo.RecordHeader{{Key: "event-id", Value: []byte("evt_1")}}}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		log.Fatal(err)
	}

	recs, err := c.ReadAll(ctx, topic)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range recs {
		id, _ := kafkatest.Header(r, "event-id")
		fmt.Println(id, string(r.Value))
	}
	// Output: evt_1 charged
}
