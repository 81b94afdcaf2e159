package stripe

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76/client"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/stripe/stripetest"
)

// harness runs one conformance scenario against one stripetest server: the
// server is the backend, kept across Make (a restarted process talks to the
// same Stripe); each Make builds a new stripe-go client whose HTTP traffic
// goes through the suite's Faults. The server reads a clock the harness
// can move forward (Age), so the horizon scenario runs: Stripe forgets a
// key 24 hours after its first request.
type harness struct {
	srv       *stripetest.Server // nil in a successor process (attach)
	url       string             // the server's
	clock     *agedClock
	newEffect func(api *client.API) effects.Effect[PaymentIntent]
	count     func(key effects.Key) int
}

var (
	_ conformance.Harness[PaymentIntent] = (*harness)(nil)
	_ conformance.Restarter              = (*harness)(nil)
	_ conformance.Ager                   = (*harness)(nil)
)

// agedClock is the wall clock plus an offset that Age moves forward. The
// stripetest server and, with a journal, the in-memory journal read it:
// everything that holds keys ages together.
type agedClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *agedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *agedClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// serverLatency makes concurrent attempts overlap while one executes, so
// the concurrent scenario meets Stripe's 409 and not only replays.
const serverLatency = 10 * time.Millisecond

// newHarness starts the server; newEffect builds the effect under test
// from a client and the harness's clock (for a journal's leases).
func newHarness(t testing.TB, newEffect func(api *client.API, now func() time.Time) effects.Effect[PaymentIntent]) *harness {
	clk := &agedClock{}
	srv := stripetest.Start(t, stripetest.WithLatency(serverLatency), stripetest.WithClock(clk.Now))
	return &harness{
		srv:       srv,
		url:       srv.URL,
		clock:     clk,
		newEffect: func(api *client.API) effects.Effect[PaymentIntent] { return newEffect(api, clk.Now) },
		count:     func(key effects.Key) int { return srv.Created(string(key)) },
	}
}

func (h *harness) Make(ctx context.Context, f *conformance.Faults) (effects.Effect[PaymentIntent], func(), error) {
	tr := f.Transport(nil)
	if h.srv != nil {
		f.SetAppFaulter(appFaulter(h.srv))
	}
	api := stripetest.ClientAt(h.url, &http.Client{Transport: tr})
	return h.newEffect(api), tr.CloseIdleConnections, nil
}

// AppFaultCodes are the application errors appFaulter makes the server
// answer (conformance.AppFaultCodes).
func (h *harness) AppFaultCodes() []string { return conformance.HTTPAppCodes }

// appFaulter makes srv answer the request about to be sent
// (conformance.Faults.SetAppFaulter) with a failure Stripe does not store under
// the idempotency key: 409 idempotency_key_in_use for a concurrent
// request with the key (ConflictNext), a 5xx from in front of the API
// before the request reached it (FailNextInFront), or after the API
// executed it and stored its response (FailNextReplyInFront). A 500 of
// Stripe's own is stored and replayed to every retry (FailNext), so it is
// no fault a retry can get through.
func appFaulter(srv *stripetest.Server) func(e *conformance.AppError) error {
	return func(e *conformance.AppError) error {
		switch st := e.HTTPStatus(); {
		case st == http.StatusConflict && !e.Applied:
			srv.ConflictNext(1)
		case st >= 500 && !e.Applied:
			srv.FailNextInFront(1, st)
		case st >= 500:
			srv.FailNextReplyInFront(1, st)
		default:
			return fmt.Errorf("stripetest answers no application error %q", e.Code)
		}
		return nil
	}
}

// Attachment is the server's URL (conformance.Attacher): a successor
// process calls the same Stripe.
func (h *harness) Attachment() string { return h.url }

// attach builds the harness in a successor process, for the effect
// newEffect makes, on the wall clock: it calls the test process's
// server; the test process counts.
func attach(newEffect func(api *client.API, now func() time.Time) effects.Effect[PaymentIntent]) conformance.EffectOption {
	return conformance.WithSuccessorProcess(func(_ context.Context, url string) (conformance.Harness[PaymentIntent], error) {
		return &harness{url: url, newEffect: func(api *client.API) effects.Effect[PaymentIntent] { return newEffect(api, time.Now) }}, nil
	})
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

// Age moves the clock of the server (and of the journal) forward by d.
func (h *harness) Age(_ context.Context, d time.Duration) error {
	h.clock.advance(d)
	return nil
}

// TestConformance: without a journal the contract's horizon is Stripe's
// 24 hours, and a redelivery just inside it replays.
func TestConformance(t *testing.T) {
	plain := func(api *client.API, _ func() time.Time) effects.Effect[PaymentIntent] {
		return must(NewPaymentIntents(api))
	}
	rep := conformance.Run(t, "stripe.PaymentIntents", func(t testing.TB) conformance.Harness[PaymentIntent] {
		return newHarness(t, plain)
	}, attach(plain), conformance.WithCapacity(1000), conformance.WithSlowReply(300*time.Millisecond), allowStripetest)
	requireVerified(t, rep)
}

// The journal is kept across Make like the server: it is the
// application's database, which a restarted process finds again. With it
// the horizon is 0 (until the journal prunes), and a redelivery 400 days
// later, long after Stripe forgot the key, replays from the journal.
func TestConformanceWithJournal(t *testing.T) {
	rep := conformance.Run(t, "stripe.PaymentIntents+journal", func(t testing.TB) conformance.Harness[PaymentIntent] {
		var j *memjournal.Journal
		return newHarness(t, func(api *client.API, now func() time.Time) effects.Effect[PaymentIntent] {
			if j == nil {
				j = memjournal.New(now)
			}
			return must(NewPaymentIntents(api, WithJournal(j)))
		})
	}, attach(func(api *client.API, now func() time.Time) effects.Effect[PaymentIntent] {
		// A new process has a new in-memory journal: Stripe's key, kept
		// 24 hours, is what a successor process finds.
		return must(NewPaymentIntents(api, WithJournal(memjournal.New(now))))
	}), conformance.WithCapacity(1000), conformance.WithSlowReply(300*time.Millisecond), allowStripetest) // as TestConformance
	requireVerified(t, rep)
}

// allowStripetest names what a harness on stripetest cannot verify:
// stripetest stands for Stripe's key store, which keeps every key for 24
// hours (1,000 keys show what 5,000 would: it evicts none) and which no
// local test can crash (the in-process server has nothing a crash would
// lose that a restart keeps). The slow replies are held 300 ms, far under
// stripe-go's 80 s timeout: the adapter waits for them.
var allowStripetest = conformance.AllowUnverified("stripetest stands for Stripe's own key store: it evicts no key, so 1,000 keys show what 5,000 would, "+
	"and it is a server in the test's memory, with nothing a crash loses that a restart keeps",
	conformance.ScenarioKeyCapacity, conformance.ScenarioCrashRestart)

// requireVerified requires every field verified, or left unverified only
// with the reason the harness gave.
func requireVerified(t *testing.T, rep conformance.Report) {
	t.Helper()
	for _, f := range rep.Fields {
		if f.Status != conformance.Verified && f.Allowed == "" {
			t.Errorf("contract field %s", f)
		}
	}
}
