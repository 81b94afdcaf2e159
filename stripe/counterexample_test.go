package stripe

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"effectively.dev/conformance"
	"effectively.dev/effects"
)

// freshKeyPerAttempt is the bug this package exists to prevent, kept here
// so the suite can prove it catches it. Its first attempt carries the
// effect key, like PaymentIntents; but when the network fails it retries
// at once with freshly built params, and stripe-go gives params without a
// key a random one. Any retry after a request that Stripe did process
// charges again. It claims EffectivelyOnce anyway.
type freshKeyPerAttempt struct {
	api *client.API
	e   effect
}

func (c *freshKeyPerAttempt) Contract() effects.Contract { return c.e.contract }

func (c *freshKeyPerAttempt) Apply(ctx context.Context, key effects.Key, in PaymentIntent) (effects.Result, error) {
	if err := c.e.validate(key); err != nil {
		return effects.Result{}, err
	}
	params := in.params()
	params.Context = ctx
	params.SetIdempotencyKey(string(key))
	for attempt := 1; ; attempt++ {
		pi, err := c.api.PaymentIntents.New(params)
		if err == nil {
			res := effects.Result{Status: effects.Applied, Ref: pi.ID}
			if pi.LastResponse.Header.Get(replayedHeader) == "true" {
				res.Status = effects.Replayed
			}
			return res, nil
		}
		var se *stripego.Error
		if errors.As(err, &se) || ctx.Err() != nil || attempt == 3 {
			return effects.Result{}, c.e.classify(ctx, key, err)
		}
		params = in.params() // the bug: no key, so a random one
		params.Context = ctx
	}
}

// The counterexample must fail the suite where its bug shows: whenever an
// attempt fails on the network and the internal retry succeeds under a
// random key, the PaymentIntent exists under a key nobody will send again.
//
//   - lost-reply: Stripe created the PaymentIntent, the reply was lost,
//     the internal retry creates a second one.
//   - cut-request: Stripe never got the whole request; the internal retry
//     creates the PaymentIntent under a random key, Apply reports success,
//     and the redelivery that follows (the suite re-applies every key after
//     a fault, as a broker would after a crash before the ack) finds the
//     real key unused and creates a second one.
//
// A cancelled context stops the internal retry, so cancel-mid-apply
// retries with the real key and passes; redeliveries, concurrent
// duplicates and storms never meet a network error and pass. A backend
// restart may catch it too, when the client reuses a connection the
// restart closed (its network error triggers the fresh-key retry).
func TestCounterexampleFreshKeyPerAttemptFails(t *testing.T) {
	rep := conformance.Run(t, "counterexample: fresh key per attempt", func(t testing.TB) conformance.Harness[PaymentIntent] {
		h := newHarness(t, func(api *client.API, _ func() time.Time) effects.Effect[PaymentIntent] {
			return &freshKeyPerAttempt{api: api, e: must(newEffect("counterexample", "freshKeyPerAttempt.Apply", nil))}
		})
		// The retries' PaymentIntents carry random keys: count them by the
		// effect key in their metadata instead.
		h.count = func(key effects.Key) int { return h.srv.CreatedWithMetadata("effect_key", string(key)) }
		return h
	}, conformance.WithLateRedelivery(time.Second), conformance.ReportOnly())
	failed := rep.Failed()
	t.Logf("caught by: %v\n%s", failed, rep.Markdown())
	want := []string{conformance.ScenarioLostReply, conformance.ScenarioCut}
	for _, name := range want {
		if !slices.Contains(failed, name) {
			t.Errorf("failed scenarios %v, want %s among them", failed, name)
		}
	}
	for _, name := range want {
		if row, _ := rep.Row(name); row.MaxEffects < 2 {
			t.Errorf("%s saw at most %d effects per key, want a duplicate", name, row.MaxEffects)
		}
	}
}

// foreverWithoutJournal is PaymentIntents without a journal, declared with
// Horizon 0 ("kept until pruned"): the lie a team tells when it forgets
// that Stripe keeps keys for 24 hours only. A redelivery a day later
// creates a second PaymentIntent.
type foreverWithoutJournal struct{ *PaymentIntents }

func (e foreverWithoutJournal) Contract() effects.Contract {
	c := e.PaymentIntents.Contract()
	c.Horizon = 0
	c.Enforcer = "stripe: Idempotency-Key (claimed kept until pruned, without a journal)"
	return c
}

// The horizon scenario ages stripetest's clock by 400 days and redelivers:
// Stripe has forgotten the key and creates a second PaymentIntent. The
// immediate and the late redelivery (seconds later) still replay: only
// the horizon tells the lie from the truth.
func TestCounterexampleHorizonWithoutJournalFails(t *testing.T) {
	rep := conformance.Run(t, "counterexample: stripe without journal declared horizon 0", func(t testing.TB) conformance.Harness[PaymentIntent] {
		return newHarness(t, func(api *client.API, _ func() time.Time) effects.Effect[PaymentIntent] {
			return foreverWithoutJournal{must(NewPaymentIntents(api))}
		})
	}, conformance.Only(conformance.ScenarioHorizon, conformance.ScenarioRedelivery, conformance.ScenarioLateRedelivery),
		conformance.WithLateRedelivery(time.Second), conformance.ReportOnly())
	t.Logf("caught by: %v\n%s", rep.Failed(), rep.Markdown())
	if !slices.Equal(rep.Failed(), []string{conformance.ScenarioHorizon}) {
		t.Errorf("failed scenarios %v, want just %s", rep.Failed(), conformance.ScenarioHorizon)
	}
	if row, _ := rep.Row(conformance.ScenarioHorizon); row.MaxEffects < 2 {
		t.Errorf("horizon saw at most %d PaymentIntents per key, want the second one counted", row.MaxEffects)
	}
	if f, _ := rep.Field("Horizon"); f.Status != conformance.Failed {
		t.Errorf("Horizon field: %s, want FAILED", f)
	}
}

// newKeyOnConflict takes Stripe's 409 idempotency_key_in_use for a key
// that is stuck and sends the request again at once under a new key
// derived from it: when the conflicting request was a duplicate that
// goes on to create the PaymentIntent (or the suite's redelivery sends
// the real key), the customer is charged twice.
type newKeyOnConflict struct {
	api *client.API
	e   effect
}

func (c *newKeyOnConflict) Contract() effects.Contract { return c.e.contract }

func (c *newKeyOnConflict) Apply(ctx context.Context, key effects.Key, in PaymentIntent) (effects.Result, error) {
	if err := c.e.validate(key); err != nil {
		return effects.Result{}, err
	}
	params := in.params()
	params.Context = ctx
	params.SetIdempotencyKey(string(key))
	pi, err := c.api.PaymentIntents.New(params)
	var se *stripego.Error
	if errors.As(err, &se) && se.HTTPStatusCode == 409 {
		params = in.params()
		params.Context = ctx
		params.SetIdempotencyKey(string(key) + ":retry") // the bug
		pi, err = c.api.PaymentIntents.New(params)
	}
	if err != nil {
		return effects.Result{}, c.e.classify(ctx, key, err)
	}
	return effects.Result{Status: effects.Applied, Ref: pi.ID}, nil
}

// app-faults answers an Apply with Stripe's 409 idempotency_key_in_use
// (stripetest's ConflictNext, nothing stored): the liar creates the
// PaymentIntent under its new key, and the retry with the real key
// creates a second one.
func TestCounterexampleNewKeyOnConflictFails(t *testing.T) {
	rep := conformance.Run(t, "counterexample: new key on 409", func(t testing.TB) conformance.Harness[PaymentIntent] {
		h := newHarness(t, func(api *client.API, _ func() time.Time) effects.Effect[PaymentIntent] {
			return &newKeyOnConflict{api: api, e: must(newEffect("counterexample", "newKeyOnConflict.Apply", nil))}
		})
		h.count = func(key effects.Key) int { return h.srv.CreatedWithMetadata("effect_key", string(key)) }
		return h
	}, conformance.Only(conformance.ScenarioAppFaults), conformance.ReportOnly())
	row, _ := rep.Row(conformance.ScenarioAppFaults)
	if row.Verdict != conformance.Fail || row.MaxEffects < 2 {
		t.Fatalf("app-faults: %s with at most %d PaymentIntents per key, want FAIL with a duplicate (notes %v)", row.Verdict, row.MaxEffects, row.Notes)
	}
	t.Logf("caught: %s", row.Failures[0])
}
