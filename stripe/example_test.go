package stripe_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"effectively.dev/effects"
	"effectively.dev/stripe"
	"effectively.dev/stripe/stripetest"
)

// A webhook delivered twice charges once: the key comes from the event, so
// the redelivery replays the first PaymentIntent.
func Example() {
	srv := stripetest.NewServer() // a local Stripe; in production: client.New(secretKey, nil)
	defer srv.Close()
	charges := stripe.NewPaymentIntents(srv.Client(nil))

	key := effects.MustKey("billing", "evt_123", "charge") // from the message, never random
	in := stripe.PaymentIntent{Amount: 2000, Currency: "usd", Customer: "cus_123"}
	first, err := charges.Apply(context.Background(), key, in)
	if err != nil {
		log.Fatal(err)
	}
	again, err := charges.Apply(context.Background(), key, in) // the redelivery
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(first.Status, again.Status, again.Ref == first.Ref, srv.Created(string(key)))
	// Output: applied replayed true 1
}

// A retried partial refund refunds once.
func ExampleRefunds() {
	srv := stripetest.NewServer()
	defer srv.Close()
	api := srv.Client(nil)
	ctx := context.Background()

	paid, err := stripe.NewPaymentIntents(api).Apply(ctx, effects.MustKey("shop", "order-7", "charge"),
		stripe.PaymentIntent{Amount: 5000, Currency: "eur", PaymentMethod: "pm_card_visa", Confirm: true})
	if err != nil {
		log.Fatal(err)
	}
	refunds := stripe.NewRefunds(api)
	key := effects.MustKey("shop", "order-7", "refund-damaged-item")
	for i := 0; i < 3; i++ { // a consumer retrying after timeouts
		res, err := refunds.Apply(ctx, key, stripe.Refund{PaymentIntent: paid.Ref, Amount: 1500})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.Status)
	}
	// Output:
	// applied
	// replayed
	// replayed
}

// Errors say what to do next: a key reused with another payload is a bug
// upstream and permanent; an unknown outcome is retried with the same key.
func Example_errors() {
	srv := stripetest.NewServer()
	defer srv.Close()
	charges := stripe.NewPaymentIntents(srv.Client(nil))
	ctx := context.Background()
	key := effects.MustKey("billing", "evt_123", "charge")

	if _, err := charges.Apply(ctx, key, stripe.PaymentIntent{Amount: 2000, Currency: "usd"}); err != nil {
		log.Fatal(err)
	}
	_, err := charges.Apply(ctx, key, stripe.PaymentIntent{Amount: 9900, Currency: "usd"})
	fmt.Println(errors.Is(err, effects.ErrKeyReused), effects.Retryable(err))

	declined := stripe.PaymentIntent{Amount: 2000, Currency: "usd", PaymentMethod: "pm_card_chargeDeclined", Confirm: true}
	_, err = charges.Apply(ctx, effects.MustKey("billing", "evt_124", "charge"), declined)
	var refused *stripe.RequestError
	if errors.As(err, &refused) {
		fmt.Println(refused.Err.Code, effects.Retryable(err))
	}
	// Output:
	// true false
	// card_declined false
}
