package stripe

import (
	"context"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"effectively.dev/effects"
)

// Refund is the input of [Refunds]: what to refund. Name the payment by
// PaymentIntent or by Charge, not both.
type Refund struct {
	// PaymentIntent is the id ("pi_...") of the PaymentIntent to refund.
	PaymentIntent string
	// Charge is the id ("ch_...") of the charge to refund.
	Charge string
	// Amount to refund in the currency's smallest unit; 0 refunds what
	// is left of the payment.
	Amount int64
	// Reason is "duplicate", "fraudulent", "requested_by_customer" or
	// empty.
	Reason string
	// Metadata is stored on the Refund.
	Metadata map[string]string
}

func (in Refund) params() *stripego.RefundParams {
	rp := &stripego.RefundParams{}
	if in.PaymentIntent != "" {
		rp.PaymentIntent = stripego.String(in.PaymentIntent)
	}
	if in.Charge != "" {
		rp.Charge = stripego.String(in.Charge)
	}
	if in.Amount != 0 {
		rp.Amount = stripego.Int64(in.Amount)
	}
	if in.Reason != "" {
		rp.Reason = stripego.String(in.Reason)
	}
	for k, v := range in.Metadata {
		rp.AddMetadata(k, v)
	}
	return rp
}

// Refunds creates Stripe Refunds effectively once per key: POST
// /v1/refunds with the key as Idempotency-Key. Result.Ref is the Refund's
// id ("re_..."). Without a key, a retried partial refund would refund
// twice; with one, it refunds once. It is the typed form of
// [New](api.Refunds.New). It is safe for concurrent use.
type Refunds struct {
	e *Effect[*stripego.RefundParams]
}

var _ effects.Effect[Refund] = (*Refunds)(nil)

// NewRefunds returns the Refund effect over api, stripe-go's client with
// the caller's key and backends (see [NewPaymentIntents] about stripe-go's
// own retries). It returns a *[effects.ConfigError] for a nil api or an
// invalid option.
func NewRefunds(api *client.API, opts ...Option) (*Refunds, error) {
	const ctor = "stripe.NewRefunds"
	if api == nil || api.Refunds == nil {
		return nil, &effects.ConfigError{Op: ctor, Option: "api", Reason: "nil or uninitialised *client.API; build it with client.New"}
	}
	e, err := newGeneric(ctor, "stripe.Refunds.Apply", api.Refunds.New, withCheck(opts, api))
	if err != nil {
		return nil, err
	}
	return &Refunds{e: e}, nil
}

// Contract declares EffectivelyOnce, enforced by Stripe's Idempotency-Key
// with a 24 h horizon and key-reuse detection; with [WithJournal], the
// horizon is 0 (until the journal prunes).
func (r *Refunds) Contract() effects.Contract { return r.e.Contract() }

// Apply creates the Refund in under key, or finds it created: Applied with
// the new id the first time, Replayed with the same id afterwards. A
// refund of more than is left is a permanent [RequestError].
func (r *Refunds) Apply(ctx context.Context, key effects.Key, in Refund) (effects.Result, error) {
	return r.e.apply(ctx, key, in.params())
}
