package stripe

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/stripe/stripetest"
)

var order = PaymentIntent{Amount: 2000, Currency: "usd", Customer: "cus_123", Metadata: map[string]string{"order": "o-1"}}

func TestContract(t *testing.T) {
	srv := stripetest.Start(t)
	api := newAPI(t, srv, nil)
	for _, tc := range []struct {
		name    string
		c       effects.Contract
		horizon time.Duration
	}{
		{"payment intents", newPI(t, api).Contract(), 24 * time.Hour},
		{"refunds", newRefunds(t, api).Contract(), 24 * time.Hour},
		{"payment intents with journal", newPI(t, api, WithJournal(memjournal.New(nil))).Contract(), 0},
		{"refunds with journal", newRefunds(t, api, WithJournal(memjournal.New(nil))).Contract(), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.c.Validate(); err != nil {
				t.Fatal(err)
			}
			if tc.c.Guarantee != effects.EffectivelyOnce || tc.c.Horizon != tc.horizon || !tc.c.DetectsKeyReuse ||
				!strings.HasPrefix(tc.c.Enforcer, "stripe: Idempotency-Key, kept by Stripe for at least 24h") {
				t.Errorf("contract %s", tc.c)
			}
		})
	}
}

func TestApplyThenReplay(t *testing.T) {
	srv := stripetest.Start(t)
	charges := newPI(t, newAPI(t, srv, nil))
	key := effects.MustKey("test", "evt_1", "charge")
	first, err := charges.Apply(context.Background(), key, order)
	if err != nil {
		t.Fatal(err)
	}
	if first.Status != effects.Applied || !strings.HasPrefix(first.Ref, "pi_") {
		t.Fatalf("first Apply: %+v", first)
	}
	again, err := newPI(t, newAPI(t, srv, nil)).Apply(context.Background(), key, order) // a restarted process
	if err != nil {
		t.Fatal(err)
	}
	if again.Status != effects.Replayed || again.Ref != first.Ref {
		t.Errorf("redelivery: %+v, want replayed %s", again, first.Ref)
	}
	// The Idempotency-Key Stripe saw is the effect key itself.
	if n := srv.Created(string(key)); n != 1 || srv.Total() != 1 {
		t.Errorf("Created(key) %d, Total %d, want 1, 1", n, srv.Total())
	}
}

func TestInvalidKeysAreRefusedBeforeAnyRequest(t *testing.T) {
	srv := stripetest.Start(t)
	charges := newPI(t, newAPI(t, srv, nil))
	for name, key := range map[string]effects.Key{
		"empty":              "",
		"256 bytes":          effects.Key(strings.Repeat("k", 256)),
		"NUL":                "a\x00b",
		"invalid UTF-8":      "a\xffb",
		"leading space":      " k",
		"trailing space":     "k ",
		"trailing NBSP":      "k\u00a0",
		"leading ideographs": "\u3000k",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := charges.Apply(context.Background(), key, order)
			if !errors.Is(err, effects.ErrInvalidKey) || effects.ClassOf(err) == effects.Retryable {
				t.Errorf("got %v, want a permanent ErrInvalidKey", err)
			}
		})
	}
	if srv.Requests() != 0 {
		t.Errorf("%d requests reached Stripe", srv.Requests())
	}
	if _, err := charges.Apply(context.Background(), effects.Key(strings.Repeat("k", 255)), order); err != nil {
		t.Errorf("255-byte key: %v", err)
	}
}

func TestKeyReusedWithOtherPayload(t *testing.T) {
	srv := stripetest.Start(t)
	charges := newPI(t, newAPI(t, srv, nil))
	key := effects.MustKey("test", "evt_1", "charge")
	if _, err := charges.Apply(context.Background(), key, order); err != nil {
		t.Fatal(err)
	}
	other := order
	other.Amount++
	_, err := charges.Apply(context.Background(), key, other)
	var se *stripego.Error
	if !errors.Is(err, effects.ErrKeyReused) || effects.ClassOf(err) == effects.Retryable || !errors.As(err, &se) || se.Type != stripego.ErrorTypeIdempotency {
		t.Errorf("got %v, want ErrKeyReused wrapping Stripe's idempotency_error", err)
	}
	// Refunds under a PaymentIntent's key: another endpoint, also reuse.
	_, err = newRefunds(t, newAPI(t, srv, nil)).Apply(context.Background(), key, &stripego.RefundParams{PaymentIntent: stripego.String("pi_x")})
	if !errors.Is(err, effects.ErrKeyReused) || srv.Created(string(key)) != 1 {
		t.Errorf("refund under a PaymentIntent's key: %v", err)
	}
}

func TestConcurrentAttemptIsInFlight(t *testing.T) {
	srv := stripetest.Start(t, stripetest.WithLatency(300*time.Millisecond))
	charges := newPI(t, newAPI(t, srv, nil))
	key := effects.MustKey("test", "evt_1", "charge")
	var (
		wg    sync.WaitGroup
		first effects.Result
		ferr  error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		first, ferr = charges.Apply(context.Background(), key, order)
	}()
	time.Sleep(100 * time.Millisecond)
	_, err := charges.Apply(context.Background(), key, order)
	if !errors.Is(err, effects.ErrInFlight) || effects.ClassOf(err) != effects.Retryable {
		t.Errorf("concurrent attempt: %v, want a retryable ErrInFlight", err)
	}
	wg.Wait()
	if ferr != nil || first.Status != effects.Applied {
		t.Fatalf("first attempt: %+v, %v", first, ferr)
	}
	again, err := charges.Apply(context.Background(), key, order)
	if err != nil || again.Status != effects.Replayed || again.Ref != first.Ref {
		t.Errorf("retry after ErrInFlight: %+v, %v", again, err)
	}
}

func TestLostReplyIsAmbiguousAndTheRetryReplays(t *testing.T) {
	srv := stripetest.Start(t)
	f := new(conformance.Faults)
	charges := newPI(t, newAPI(t, srv, f.Transport))
	key := effects.MustKey("test", "evt_1", "charge")
	f.Arm(1, conformance.DropReply, nil)
	_, err := charges.Apply(context.Background(), key, order)
	if !errors.Is(err, effects.ErrAmbiguous) || effects.ClassOf(err) != effects.Retryable || !errors.Is(err, conformance.ErrInjected) {
		t.Fatalf("lost reply: %v, want ErrAmbiguous wrapping the transport's error", err)
	}
	if srv.Created(string(key)) != 1 {
		t.Fatalf("the server did not process the request")
	}
	res, err := charges.Apply(context.Background(), key, order)
	if err != nil || res.Status != effects.Replayed {
		t.Errorf("retry: %+v, %v, want replayed", res, err)
	}
	if n := srv.Created(string(key)); n != 1 {
		t.Errorf("%d PaymentIntents, want 1", n)
	}
}

func TestCancelledContext(t *testing.T) {
	srv := stripetest.Start(t)
	charges := newPI(t, newAPI(t, srv, nil))
	key := effects.MustKey("test", "evt_1", "charge")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := charges.Apply(ctx, key, order); !errors.Is(err, context.Canceled) || effects.ClassOf(err) != effects.Retryable {
		t.Errorf("cancelled before the call: %v", err)
	}
	if srv.Requests() != 0 {
		t.Errorf("a cancelled Apply sent %d requests", srv.Requests())
	}

	// Cancelled after the request left: the outcome is unknown.
	f := new(conformance.Faults)
	charges = newPI(t, newAPI(t, srv, f.Transport))
	ctx, cancel = context.WithCancel(context.Background())
	f.Arm(1, conformance.CancelAfterSend, cancel)
	_, err := charges.Apply(ctx, key, order)
	if !errors.Is(err, effects.ErrAmbiguous) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled after send: %v, want ErrAmbiguous and context.Canceled", err)
	}
}

func TestRefusedConnectionIsTransient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens here now
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	b := stripego.GetBackendWithConfig(stripego.APIBackend, &stripego.BackendConfig{
		URL:               stripego.String("http://" + addr),
		HTTPClient:        &http.Client{Transport: tr},
		MaxNetworkRetries: stripego.Int64(0),
		LeveledLogger:     &stripego.LeveledLogger{Level: stripego.LevelNull},
	})
	charges := newPI(t, client.New(stripetest.APIKey, &stripego.Backends{API: b, Connect: b, Uploads: b}))
	_, err = charges.Apply(context.Background(), "k", order)
	if !errors.Is(err, effects.ErrTransient) {
		t.Errorf("refused connection: %v, want ErrTransient", err)
	}
}

func TestServerErrors(t *testing.T) {
	srv := stripetest.Start(t)
	charges := newPI(t, newAPI(t, srv, nil))

	t.Run("first 500 is ambiguous, the replayed 500 is permanent", func(t *testing.T) {
		key := effects.Key("k500")
		srv.FailNext(1, 500)
		_, err := charges.Apply(context.Background(), key, order)
		if !errors.Is(err, effects.ErrAmbiguous) || effects.ClassOf(err) != effects.Retryable {
			t.Fatalf("first 500: %v, want a retryable ErrAmbiguous", err)
		}
		_, err = charges.Apply(context.Background(), key, order)
		var se *stripego.Error
		if !errors.Is(err, ErrReplayedServerError) || effects.ClassOf(err) == effects.Retryable || !errors.As(err, &se) || se.HTTPStatusCode != 500 {
			t.Fatalf("replayed 500: %v, want a permanent ErrReplayedServerError wrapping the 500", err)
		}
	})
	t.Run("a 500 after the object was created stays unresolved", func(t *testing.T) {
		key := effects.Key("k500created")
		srv.FailNextAfterCreate(1, 500)
		if _, err := charges.Apply(context.Background(), key, order); !errors.Is(err, effects.ErrAmbiguous) {
			t.Fatalf("first 500: %v", err)
		}
		if _, err := charges.Apply(context.Background(), key, order); !errors.Is(err, ErrReplayedServerError) {
			t.Fatalf("retry: %v", err)
		}
		if n := srv.Created(string(key)); n != 1 {
			t.Errorf("%d PaymentIntents behind the stored 500, want 1", n)
		}
	})
	t.Run("429 is transient and not stored", func(t *testing.T) {
		key := effects.Key("k429")
		srv.FailNext(1, 429)
		if _, err := charges.Apply(context.Background(), key, order); !errors.Is(err, effects.ErrTransient) {
			t.Fatalf("429: %v, want ErrTransient", err)
		}
		res, err := charges.Apply(context.Background(), key, order)
		if err != nil || res.Status != effects.Applied {
			t.Errorf("retry after 429: %+v, %v", res, err)
		}
	})
}

func TestStripeRefusalsArePermanent(t *testing.T) {
	srv := stripetest.Start(t)
	charges := newPI(t, newAPI(t, srv, nil))

	declined := PaymentIntent{Amount: 2000, Currency: "usd", PaymentMethod: "pm_card_chargeDeclined", Confirm: true}
	_, err := charges.Apply(context.Background(), "decline", declined)
	var (
		re *RequestError
		ce *stripego.CardError
	)
	if !errors.As(err, &re) || !errors.As(err, &ce) || effects.ClassOf(err) == effects.Retryable || re.Err.Code != stripego.ErrorCodeCardDeclined {
		t.Errorf("decline: %v, want a permanent *RequestError wrapping a *stripe.CardError", err)
	}
	if !strings.Contains(err.Error(), "card_declined") {
		t.Errorf("message %q does not say why", err)
	}

	// A validation failure is not stored by Stripe: the corrected input
	// with the same key executes.
	_, err = charges.Apply(context.Background(), "fixme", PaymentIntent{Amount: 2000})
	if !errors.As(err, &re) || re.Err.Param != "currency" || effects.ClassOf(err) == effects.Retryable {
		t.Fatalf("missing currency: %v", err)
	}
	res, err := charges.Apply(context.Background(), "fixme", PaymentIntent{Amount: 2000, Currency: "usd"})
	if err != nil || res.Status != effects.Applied {
		t.Errorf("corrected input under the same key: %+v, %v", res, err)
	}
}

func TestRefunds(t *testing.T) {
	srv := stripetest.Start(t)
	api := newAPI(t, srv, nil)
	paid, err := newPI(t, api).Apply(context.Background(), "pay",
		PaymentIntent{Amount: 1000, Currency: "usd", PaymentMethod: "pm_card_visa", Confirm: true})
	if err != nil {
		t.Fatal(err)
	}
	refunds := newRefunds(t, api)
	in := &stripego.RefundParams{PaymentIntent: stripego.String(paid.Ref), Amount: stripego.Int64(300), Reason: stripego.String("requested_by_customer")}
	first, err := refunds.Apply(context.Background(), "refund-1", in)
	if err != nil || first.Status != effects.Applied || !strings.HasPrefix(first.Ref, "re_") {
		t.Fatalf("refund: %+v, %v", first, err)
	}
	// A partial refund retried without a key would refund 300 again.
	for i := 0; i < 3; i++ {
		again, err := refunds.Apply(context.Background(), "refund-1", in)
		if err != nil || again.Status != effects.Replayed || again.Ref != first.Ref {
			t.Errorf("retry %d: %+v, %v", i, again, err)
		}
	}
	if n := srv.Created("refund-1"); n != 1 {
		t.Errorf("%d refunds, want 1", n)
	}
	_, err = refunds.Apply(context.Background(), "refund-2", &stripego.RefundParams{PaymentIntent: stripego.String(paid.Ref), Amount: stripego.Int64(800)})
	var re *RequestError
	if !errors.As(err, &re) || re.Err.Code != stripego.ErrorCodeAmountTooLarge {
		t.Errorf("refund of more than is left: %v", err)
	}
}

// Stripe forgets keys after 24 h; the journal remembers.
func TestPastStripesHorizon(t *testing.T) {
	clk := newClock()
	key := effects.MustKey("test", "evt_1", "charge")

	t.Run("without a journal a late redelivery charges again", func(t *testing.T) {
		srv := stripetest.Start(t, stripetest.WithClock(clk.Now))
		charges := newPI(t, newAPI(t, srv, nil))
		if _, err := charges.Apply(context.Background(), key, order); err != nil {
			t.Fatal(err)
		}
		clk.Advance(horizon)
		res, err := charges.Apply(context.Background(), key, order)
		if err != nil || res.Status != effects.Applied || srv.Created(string(key)) != 2 {
			t.Errorf("after the horizon: %+v, %v, %d objects; the contract's 24h Horizon says this happens", res, err, srv.Created(string(key)))
		}
	})
	t.Run("with a journal it replays without calling Stripe", func(t *testing.T) {
		srv := stripetest.Start(t, stripetest.WithClock(clk.Now))
		j := memjournal.New(clk.Now)
		charges := newPI(t, newAPI(t, srv, nil), WithJournal(j))
		first, err := charges.Apply(context.Background(), key, order)
		if err != nil {
			t.Fatal(err)
		}
		if rec := j.Get(key); !rec.Done || rec.Ref != first.Ref {
			t.Fatalf("journal record %+v, want done with %s", rec, first.Ref)
		}
		clk.Advance(30 * 24 * time.Hour)
		before := srv.Requests()
		res, err := charges.Apply(context.Background(), key, order)
		if err != nil || res.Status != effects.Replayed || res.Ref != first.Ref {
			t.Errorf("after the horizon: %+v, %v, want replayed %s", res, err, first.Ref)
		}
		if srv.Requests() != before || srv.Created(string(key)) != 1 {
			t.Errorf("the replay called Stripe (%d requests) or created %d objects", srv.Requests()-before, srv.Created(string(key)))
		}
		// Key reuse is still detected, by the journal's fingerprint.
		other := order
		other.Amount++
		if _, err := charges.Apply(context.Background(), key, other); !errors.Is(err, effects.ErrKeyReused) || srv.Requests() != before {
			t.Errorf("reuse past the horizon: %v", err)
		}
	})
}

// With a journal, the effect takes no lease (Stripe's key guards the call,
// so a lease would add a journal write and nothing else): a lost reply
// leaves no record behind, and the retry reaches Stripe at once, which
// replays, and the journal records the id.
func TestJournalLostReplyRetriedAtOnce(t *testing.T) {
	srv := stripetest.Start(t)
	j := memjournal.New(nil)
	f := new(conformance.Faults)
	charges := newPI(t, newAPI(t, srv, f.Transport), WithJournal(j))
	key := effects.MustKey("test", "evt_1", "charge")
	f.Arm(1, conformance.DropReply, nil)
	if _, err := charges.Apply(context.Background(), key, order); !errors.Is(err, effects.ErrAmbiguous) {
		t.Fatalf("lost reply: %v", err)
	}
	if rec := j.Get(key); rec.Done || rec.Attempt != 0 {
		t.Fatalf("journal after the lost reply: %+v, want no record (no lease taken, nothing confirmed)", rec)
	}
	res, err := charges.Apply(context.Background(), key, order)
	if err != nil || res.Status != effects.Replayed {
		t.Fatalf("immediate retry: %+v, %v, want replayed by Stripe", res, err)
	}
	if rec := j.Get(key); !rec.Done || rec.Ref != res.Ref {
		t.Errorf("journal after the retry: %+v, want done with %s", rec, res.Ref)
	}
	if n := srv.Created(string(key)); n != 1 {
		t.Errorf("%d PaymentIntents, want 1", n)
	}
}

// A refused request (429) and one Stripe may have executed (500) leave
// no record and release nothing, since no lease was taken; after the 429
// the retry creates the object.
func TestJournalFailureLeavesNoRecord(t *testing.T) {
	srv := stripetest.Start(t)
	j := memjournal.New(nil)
	charges := newPI(t, newAPI(t, srv, nil), WithJournal(j))
	srv.FailNext(1, http.StatusTooManyRequests)
	if _, err := charges.Apply(context.Background(), "k", order); !errors.Is(err, effects.ErrTransient) {
		t.Fatalf("429: %v", err)
	}
	if rec := j.Get("k"); rec.Done || rec.Attempt != 0 {
		t.Errorf("journal after a 429: %+v, want no record", rec)
	}
	if res, err := charges.Apply(context.Background(), "k", order); err != nil || res.Status != effects.Applied {
		t.Errorf("retry after the 429: %+v, %v, want applied", res, err)
	}
	srv.FailNext(1, 500)
	if _, err := charges.Apply(context.Background(), "k2", order); !errors.Is(err, effects.ErrAmbiguous) {
		t.Fatalf("500: %v", err)
	}
	if rec := j.Get("k2"); rec.Done || j.Releases() != 0 {
		t.Errorf("journal after a 500: %+v after %d releases, want nothing recorded or released", rec, j.Releases())
	}
}
