package stripe

import (
	"context"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"effectively.dev/effects"
)

// PaymentIntent is the input of [PaymentIntents]: what to create. The
// same key must always come with the same PaymentIntent; Stripe refuses a
// key reused with other parameters ([effects.ErrKeyReused]).
type PaymentIntent struct {
	// Amount in the currency's smallest unit (cents for usd). Required.
	Amount int64
	// Currency is a three-letter ISO code in lower case, e.g. "usd".
	// Required.
	Currency string
	// Customer is the id of the customer ("cus_..."), if any.
	Customer string
	// PaymentMethod is the id of the payment method ("pm_..."), if any.
	PaymentMethod string
	// Confirm confirms the PaymentIntent on creation; it needs a
	// PaymentMethod. A decline is then a permanent [RequestError].
	Confirm bool
	// OffSession says the customer is not present (with Confirm).
	OffSession bool
	// CaptureMethod is "automatic" (Stripe's default when empty),
	// "automatic_async" or "manual".
	CaptureMethod string
	// Description is shown in the Dashboard.
	Description string
	// ReceiptEmail is where Stripe sends the receipt, if set.
	ReceiptEmail string
	// Metadata is stored on the PaymentIntent. Putting the message's id
	// here lets an operator find the object when reconciling.
	Metadata map[string]string
}

func (in PaymentIntent) params() *stripego.PaymentIntentParams {
	pp := &stripego.PaymentIntentParams{
		Amount:   stripego.Int64(in.Amount),
		Currency: stripego.String(in.Currency),
	}
	if in.Customer != "" {
		pp.Customer = stripego.String(in.Customer)
	}
	if in.PaymentMethod != "" {
		pp.PaymentMethod = stripego.String(in.PaymentMethod)
	}
	if in.Confirm {
		pp.Confirm = stripego.Bool(true)
	}
	if in.OffSession {
		pp.OffSession = stripego.Bool(true)
	}
	if in.CaptureMethod != "" {
		pp.CaptureMethod = stripego.String(in.CaptureMethod)
	}
	if in.Description != "" {
		pp.Description = stripego.String(in.Description)
	}
	if in.ReceiptEmail != "" {
		pp.ReceiptEmail = stripego.String(in.ReceiptEmail)
	}
	for k, v := range in.Metadata {
		pp.AddMetadata(k, v)
	}
	return pp
}

// PaymentIntents creates Stripe PaymentIntents effectively once per key:
// POST /v1/payment_intents with the key as Idempotency-Key. Result.Ref is
// the PaymentIntent's id ("pi_..."). It is the typed form of
// [New](api.PaymentIntents.New): the same protocol, errors and contract,
// with a [PaymentIntent] as input. It is safe for concurrent use.
type PaymentIntents struct {
	e *Effect[*stripego.PaymentIntentParams]
}

var _ effects.Effect[PaymentIntent] = (*PaymentIntents)(nil)

// NewPaymentIntents returns the PaymentIntent effect over api, stripe-go's
// client with the caller's key and backends. api's network retries
// (stripe-go's BackendConfig.MaxNetworkRetries, 2 by default) are safe, since
// every retry carries the same key, but a call then lasts as long as
// stripe-go's backoff, and a success after an internal retry reports
// Replayed. It returns a *[effects.ConfigError] for a nil api or an
// invalid option.
func NewPaymentIntents(api *client.API, opts ...Option) (*PaymentIntents, error) {
	const ctor = "stripe.NewPaymentIntents"
	if api == nil || api.PaymentIntents == nil {
		return nil, &effects.ConfigError{Op: ctor, Option: "api", Reason: "nil or uninitialised *client.API; build it with client.New"}
	}
	e, err := newGeneric(ctor, "stripe.PaymentIntents.Apply", api.PaymentIntents.New, withCheck(opts, api))
	if err != nil {
		return nil, err
	}
	return &PaymentIntents{e: e}, nil
}

// Contract declares EffectivelyOnce, enforced by Stripe's Idempotency-Key
// with a 24 h horizon and key-reuse detection; with [WithJournal], the
// horizon is 0 (until the journal prunes).
func (p *PaymentIntents) Contract() effects.Contract { return p.e.Contract() }

// Apply creates the PaymentIntent in under key, or finds it created: it
// returns Applied with the new id the first time and Replayed with the same
// id afterwards. Errors are classified as the package doc describes.
func (p *PaymentIntents) Apply(ctx context.Context, key effects.Key, in PaymentIntent) (effects.Result, error) {
	return p.e.apply(ctx, key, in.params())
}
