package natsjs_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"effectively.dev/effects"

	"example.com/natsjs"
)

// Publish a "charged" event once per payment, however often the payment
// is delivered, within the stream's duplicate window.
func ExampleNew() {
	dir, err := os.MkdirTemp("", "natsjs-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := newServer(dir) // your NATS server; here one embedded in the process
	if err != nil {
		log.Fatal(err)
	}
	defer srv.stop()

	nc, err := nats.Connect(srv.URL())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CHARGES", Subjects: []string{"charges.>"}}); err != nil {
		log.Fatal(err)
	}

	charges, err := natsjs.New(ctx, js, "CHARGES")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(charges.Contract())
	key := effects.MustKey("billing", "evt_1", "charged") // from the event, never random
	msg := natsjs.Message{Subject: "charges.evt_1", Data: []byte(`{"cents":4200}`)}
	for range 2 { // the broker delivers the payment twice
		res, err := charges.Apply(ctx, key, msg)
		fmt.Println(res.Status, res.Ref, err)
	}
	// Output:
	// effectively-once (nats jetstream: Nats-Msg-Id deduplication in stream CHARGES; keys kept 2m0s; detects key reuse)
	// applied CHARGES/1 <nil>
	// replayed CHARGES/1 <nil>
}
