package stripe

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76/client"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/internal/memjournal"
	"effectively.dev/stripe/stripetest"
)

// harness runs one conformance scenario against one stripetest server: the
// server is the backend, kept across Make (a restarted process talks to the
// same Stripe); each Make builds a new stripe-go client whose HTTP traffic
// goes through the suite's Faults.
type harness struct {
	srv       *stripetest.Server
	newEffect func(api *client.API) effects.Effect[PaymentIntent]
	count     func(key effects.Key) int
}

var (
	_ conformance.Harness[PaymentIntent] = (*harness)(nil)
	_ conformance.Restarter              = (*harness)(nil)
)

// serverLatency makes concurrent attempts overlap while one executes, so
// the concurrent scenario meets Stripe's 409 and not only replays.
const serverLatency = 10 * time.Millisecond

func newHarness(t testing.TB, newEffect func(api *client.API) effects.Effect[PaymentIntent]) *harness {
	srv := stripetest.Start(t, stripetest.WithLatency(serverLatency))
	return &harness{
		srv:       srv,
		newEffect: newEffect,
		count:     func(key effects.Key) int { return srv.Created(string(key)) },
	}
}

func (h *harness) Make(ctx context.Context, f *conformance.Faults) (effects.Effect[PaymentIntent], func(), error) {
	tr := f.Transport(nil)
	api := h.srv.Client(&http.Client{Transport: tr})
	return h.newEffect(api), tr.CloseIdleConnections, nil
}

// Input gives variant 1 another amount, so reusing the key with it is a
// different request. The key also goes into metadata, so harnesses of
// effects that do not send it as the Idempotency-Key can count by it.
func (h *harness) Input(key effects.Key, variant int) PaymentIntent {
	return PaymentIntent{
		Amount:      2000 + int64(variant)*500,
		Currency:    "usd",
		Customer:    "cus_conformance",
		Description: "conformance",
		Metadata:    map[string]string{"effect_key": string(key)},
	}
}

func (h *harness) Count(ctx context.Context, key effects.Key) (int, error) { return h.count(key), nil }

func (h *harness) Total(ctx context.Context) (int, error) { return h.srv.Total(), nil }

// Restart restarts the stripetest server: connections drop, keys and
// objects stay, as across a Stripe deploy.
func (h *harness) Restart(ctx context.Context) error { return h.srv.Restart() }

func TestConformance(t *testing.T) {
	conformance.Run(t, "stripe.PaymentIntents", func(t testing.TB) conformance.Harness[PaymentIntent] {
		return newHarness(t, func(api *client.API) effects.Effect[PaymentIntent] { return must(NewPaymentIntents(api)) })
	})
}

// The journal is kept across Make like the server: it is the
// application's database, which a restarted process finds again.
func TestConformanceWithJournal(t *testing.T) {
	conformance.Run(t, "stripe.PaymentIntents+journal", func(t testing.TB) conformance.Harness[PaymentIntent] {
		j := memjournal.New(nil)
		return newHarness(t, func(api *client.API) effects.Effect[PaymentIntent] {
			return must(NewPaymentIntents(api, WithJournal(j)))
		})
	})
}
