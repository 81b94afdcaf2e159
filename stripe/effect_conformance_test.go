package stripe

import (
	"context"
	"net/http"
	"testing"
	"time"

	stripego "github.com/stripe/stripe-go/v76"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/stripe/stripetest"
)

// customerHarness holds the generic effect over api.Customers.New to the
// suite, as harness (conformance_test.go) does for PaymentIntents: one
// stripetest server kept across Make, a new stripe-go client per Make
// whose traffic goes through the suite's Faults.
type customerHarness struct {
	srv     *stripetest.Server
	clock   *agedClock      // the server's and the journal's: Age moves it
	journal journal.Journal // nil: Stripe's key alone
}

var (
	_ conformance.Harness[*stripego.CustomerParams] = (*customerHarness)(nil)
	_ conformance.Restarter                         = (*customerHarness)(nil)
	_ conformance.Ager                              = (*customerHarness)(nil)
)

// AppFaultCodes are the application errors appFaulter makes the server
// answer (conformance.AppFaultCodes).
func (h *customerHarness) AppFaultCodes() []string { return conformance.HTTPAppCodes }

func (h *customerHarness) Make(ctx context.Context, f *conformance.Faults) (effects.Effect[*stripego.CustomerParams], func(), error) {
	tr := f.Transport(nil)
	f.SetAppFaulter(appFaulter(h.srv))
	api := h.srv.Client(&http.Client{Transport: tr})
	var opts []Option
	if h.journal != nil {
		opts = append(opts, WithJournal(h.journal))
	}
	e, err := New(api.Customers.New, opts...)
	if err != nil {
		return nil, nil, err
	}
	return e, tr.CloseIdleConnections, nil
}

// Input gives variant 1 another name, so reusing the key with it is
// another request.
func (h *customerHarness) Input(key effects.Key, variant int) *stripego.CustomerParams {
	p := &stripego.CustomerParams{Email: stripego.String("customer@example.com"), Name: stripego.String("Ada")}
	if variant == 1 {
		p.Name = stripego.String("Ada Lovelace")
	}
	return p
}

func (h *customerHarness) Count(ctx context.Context, key effects.Key) (int, error) {
	return h.srv.Created(string(key)), nil
}

func (h *customerHarness) Total(ctx context.Context) (int, error) { return h.srv.Total(), nil }

func (h *customerHarness) Restart(ctx context.Context) error { return h.srv.Restart() }

// Age moves the clock of the server (and of the journal) forward by d.
func (h *customerHarness) Age(_ context.Context, d time.Duration) error {
	h.clock.advance(d)
	return nil
}

// The generic effect passes the suite on a resource other than
// PaymentIntents, without and with a journal.
func TestConformanceGenericCustomers(t *testing.T) {
	for name, journaled := range map[string]bool{"stripe.New(Customers.New)": false, "stripe.New(Customers.New)+journal": true} {
		t.Run(name, func(t *testing.T) {
			rep := conformance.Run(t, name, func(t testing.TB) conformance.Harness[*stripego.CustomerParams] {
				clk := &agedClock{}
				h := &customerHarness{srv: stripetest.Start(t, stripetest.WithLatency(serverLatency), stripetest.WithClock(clk.Now)), clock: clk}
				if journaled {
					h.journal = memjournal.New(clk.Now)
				}
				return h
			}, conformance.WithCapacity(1000), conformance.WithSlowReply(300*time.Millisecond), // as TestConformance
				conformance.AllowUnverified("stripetest evicts no key and is a server in the test's memory (see allowStripetest); "+
					"its clients are built from the server value, which a child process lacks",
					conformance.ScenarioKeyCapacity, conformance.ScenarioCrashRestart, conformance.ScenarioProcess))
			for _, row := range rep.Rows {
				// successor-process needs an Attacher: stripetest's clients are
				// built from the server value, which a child process lacks. No
				// CrashRestarter: stripetest and memjournal live in memory.
				// key-scope and key-bytes do not apply to this harness.
				if row.Verdict != conformance.Pass && !row.NotApplicable && row.Scenario != conformance.ScenarioProcess &&
					row.Scenario != conformance.ScenarioCrashRestart {
					t.Errorf("%s: %s, want pass", row.Scenario, row.Verdict)
				}
			}
		})
	}
}
