package stripetest_test

import (
	"errors"
	"fmt"
	"log"

	stripego "github.com/stripe/stripe-go/v76"

	"effectively.dev/stripe/stripetest"
)

// The server follows Stripe's idempotency rules, seen through stripe-go.
func ExampleServer() {
	srv, err := stripetest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	api := srv.Client(nil)

	create := func(amount int64) (*stripego.PaymentIntent, error) {
		p := &stripego.PaymentIntentParams{Amount: stripego.Int64(amount), Currency: stripego.String("usd")}
		p.SetIdempotencyKey("order-42")
		return api.PaymentIntents.New(p)
	}
	first, err := create(2000)
	if err != nil {
		log.Fatal(err)
	}
	again, err := create(2000)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(again.ID == first.ID, again.LastResponse.Header.Get("Idempotent-Replayed"))

	_, err = create(2500)
	var se *stripego.Error
	if errors.As(err, &se) {
		fmt.Println(se.HTTPStatusCode, se.Type)
	}
	fmt.Println(srv.Created("order-42"))
	// Output:
	// true true
	// 400 idempotency_error
	// 1
}

// An injected 500 is stored and replayed, as Stripe does.
func ExampleServer_FailNext() {
	srv, err := stripetest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	api := srv.Client(nil)
	srv.FailNext(1, 500)
	for i := 0; i < 2; i++ {
		p := &stripego.PaymentIntentParams{Amount: stripego.Int64(2000), Currency: stripego.String("usd")}
		p.SetIdempotencyKey("k")
		_, err := api.PaymentIntents.New(p)
		var se *stripego.Error
		if errors.As(err, &se) {
			fmt.Println(se.HTTPStatusCode, se.LastResponse.Header.Get("Idempotent-Replayed") == "true")
		}
	}
	// Output:
	// 500 false
	// 500 true
}
