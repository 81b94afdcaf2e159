package stripe_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	stripego "github.com/stripe/stripe-go/v76"

	"effectively.dev/effects"
	"effectively.dev/stripe"
	"effectively.dev/stripe/stripetest"
)

// A webhook delivered twice charges once: the key comes from the event, so
// the redelivery replays the first PaymentIntent.
func Example() {
	srv, err := stripetest.New() // a local Stripe; in production: client.New(secretKey, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	charges, err := stripe.NewPaymentIntents(srv.Client(nil))
	if err != nil {
		log.Fatal(err)
	}

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

// Any stripe-go POST becomes an effect: here, creating a Customer per
// sign-up event, and a Checkout Session per order.
func ExampleNew() {
	srv, err := stripetest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	api := srv.Client(nil) // in production: client.New(secretKey, nil)
	ctx := context.Background()

	customers, err := stripe.New(api.Customers.New)
	if err != nil {
		log.Fatal(err)
	}
	key := effects.MustKey("accounts", "evt_signup_42", "customer")
	for range 2 { // the sign-up event, delivered twice
		res, err := customers.Apply(ctx, key, &stripego.CustomerParams{Email: stripego.String("ada@example.com")})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.Status, res.Ref[:4])
	}

	sessions, err := stripe.New(api.CheckoutSessions.New)
	if err != nil {
		log.Fatal(err)
	}
	res, err := sessions.Apply(ctx, effects.MustKey("shop", "order-7", "checkout"), &stripego.CheckoutSessionParams{
		Mode:       stripego.String("payment"),
		SuccessURL: stripego.String("https://shop.example/thanks"),
		LineItems:  []*stripego.CheckoutSessionLineItemParams{{Price: stripego.String("price_123"), Quantity: stripego.Int64(1)}},
	})
	if err != nil {
		log.Fatal(err)
	}
	session, err := api.CheckoutSessions.Get(res.Ref, nil) // the id is the Ref; fetch the rest when needed
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(session.Status, session.URL != "")
	// Output:
	// applied cus_
	// replayed cus_
	// open true
}

// A call with an id in its path takes a params type of its own that
// embeds stripe-go's, so the id is part of the effect's input.
func ExampleNew_pathParameter() {
	srv, err := stripetest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	api := srv.Client(nil)

	type Transfer struct {
		Order string // not sent; part of the fingerprint
		stripego.TransferParams
	}
	payouts, err := stripe.New(func(t *Transfer) (*stripego.Transfer, error) {
		return api.Transfers.New(&t.TransferParams)
	})
	if err != nil {
		log.Fatal(err)
	}
	in := &Transfer{Order: "order-7", TransferParams: stripego.TransferParams{
		Amount: stripego.Int64(1500), Currency: stripego.String("usd"), Destination: stripego.String("acct_seller"),
	}}
	res, err := payouts.Apply(context.Background(), effects.MustKey("marketplace", "order-7", "payout"), in)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Status, res.Ref[:3])
	// Output: applied tr_
}

// A retried partial refund refunds once: refunds are New(api.Refunds.New).
func ExampleNew_refunds() {
	srv, err := stripetest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	api := srv.Client(nil)
	ctx := context.Background()

	charges, err := stripe.NewPaymentIntents(api)
	if err != nil {
		log.Fatal(err)
	}
	paid, err := charges.Apply(ctx, effects.MustKey("shop", "order-7", "charge"),
		stripe.PaymentIntent{Amount: 5000, Currency: "eur", PaymentMethod: "pm_card_visa", Confirm: true})
	if err != nil {
		log.Fatal(err)
	}
	refunds, err := stripe.New(api.Refunds.New, stripe.WithCheckClient(api))
	if err != nil {
		log.Fatal(err)
	}
	key := effects.MustKey("shop", "order-7", "refund-damaged-item")
	for i := 0; i < 3; i++ { // a consumer retrying after timeouts
		res, err := refunds.Apply(ctx, key, &stripego.RefundParams{PaymentIntent: stripego.String(paid.Ref), Amount: stripego.Int64(1500)})
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
	srv, err := stripetest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	charges, err := stripe.NewPaymentIntents(srv.Client(nil))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	key := effects.MustKey("billing", "evt_123", "charge")

	if _, err := charges.Apply(ctx, key, stripe.PaymentIntent{Amount: 2000, Currency: "usd"}); err != nil {
		log.Fatal(err)
	}
	_, err = charges.Apply(ctx, key, stripe.PaymentIntent{Amount: 9900, Currency: "usd"})
	fmt.Println(errors.Is(err, effects.ErrKeyReused), effects.ClassOf(err) == effects.Retryable)

	declined := stripe.PaymentIntent{Amount: 2000, Currency: "usd", PaymentMethod: "pm_card_chargeDeclined", Confirm: true}
	_, err = charges.Apply(ctx, effects.MustKey("billing", "evt_124", "charge"), declined)
	var refused *stripe.RequestError
	if errors.As(err, &refused) {
		fmt.Println(refused.Err.Code, effects.ClassOf(err) == effects.Retryable)
	}
	// Output:
	// true false
	// card_declined false
}
