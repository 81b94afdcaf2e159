package httpkey_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/httpkey"
	"effectively.dev/httpkey/httpkeytest"
)

// harness runs one conformance scenario against one httpkeytest server:
// the server is the backend, kept across Make (a restarted process talks
// to the same API), and so is the journal, when there is one (it is the
// application's database). Each Make builds the effect on a client whose
// connections go through the suite's Faults. Age moves the server's own
// clock (httpkeytest.Server.Age, the key store's) and the journal's.
type harness struct {
	srv     *httpkeytest.Server // nil in a successor process
	url     string
	clock   *agedClock
	p       preset
	opts    []httpkey.Option
	journal *memjournal.Journal // nil: no journal
	keys    *httpkey.Effect[Payment]
	ager    conformance.Ager // nil: the kit's clock and the journal's
}

var (
	_ conformance.Harness[Payment] = (*harness)(nil)
	_ conformance.Restarter        = (*harness)(nil)
	_ conformance.CrashRestarter   = (*harness)(nil)
	_ conformance.Ager             = (*harness)(nil)
	_ conformance.Attacher         = (*attached)(nil)
	_ conformance.Ager             = (*httpkeytest.Server)(nil)
)

// kitLatency makes concurrent requests with one key overlap at the kit,
// so the concurrency scenarios meet its 409 and not only its replays.
const kitLatency = 2 * time.Millisecond

// journalLease is the lease of the journal rows: when the journal's lease
// gates the call (no replay signal), a retry after a lost reply waits for
// it, and the suite retries for 30 seconds.
const journalLease = 2 * time.Second

// callTimeout is the per-call timeout of the effects without a journal,
// so that the slow-reply scenario holds a reply past it.
const callTimeout = time.Second

// newHarness starts a kit playing p's server and builds p's effects, plus
// a journal shared across Make when withJournal.
func newHarness(t testing.TB, p preset, withJournal bool) *harness {
	t.Helper()
	clk := &agedClock{}
	srv := httpkeytest.Start(t, append([]httpkeytest.Option{httpkeytest.WithLatency(kitLatency)}, p.server...)...)
	h := &harness{srv: srv, url: srv.URL, clock: clk, p: p, opts: p.effect}
	if withJournal {
		h.journal = memjournal.New(clk.Now)
	}
	keys, err := httpkey.New(http.DefaultClient, p.builder()(srv.URL), h.effectOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	h.keys = keys
	return h
}

func (h *harness) effectOpts() []httpkey.Option {
	opts := append(append([]httpkey.Option(nil), h.opts...), httpkey.WithTimeout(callTimeout))
	if h.journal == nil {
		return opts
	}
	return append(opts, httpkey.WithJournal(h.journal, journal.WithLease(journalLease)))
}

func (h *harness) Make(_ context.Context, f *conformance.Faults) (effects.Effect[Payment], func(), error) {
	tr := f.Transport(nil)
	if h.srv != nil {
		f.SetAppFaulter(h.appFault)
	}
	e, err := httpkey.New(&http.Client{Transport: tr}, h.p.builder()(h.url), h.effectOpts()...)
	return e, tr.CloseIdleConnections, err
}

// AppFaultCodes are the application errors appFault makes the kit answer
// (conformance.AppFaultCodes).
func (h *harness) AppFaultCodes() []string { return conformance.HTTPAppCodes }

// appFault makes the kit answer the request about to be sent
// (conformance.Faults.SetAppFaulter) as a provider does when the failure is not the
// key's stored response: a 409 for a concurrent request with the key
// (httpkeytest's ConflictNext, the preset's in-flight answer), a 5xx
// from in front of the server before the request reached it
// (FailNextInFront), or after it executed and stored its response
// (FailNextReplyInFront). Nothing else is the kit's to answer.
func (h *harness) appFault(e *conformance.AppError) error {
	switch st := e.HTTPStatus(); {
	case st == http.StatusConflict && !e.Applied:
		h.srv.ConflictNext(1)
	case st >= 500 && !e.Applied:
		h.srv.FailNextInFront(1, st)
	case st >= 500:
		h.srv.FailNextReplyInFront(1, st)
	default:
		return fmt.Errorf("httpkeytest answers no application error %q", e.Code)
	}
	return nil
}

// attached is a harness a successor process can reach: one without a
// journal (a journal in this process's memory is no successor's to
// share).
type attached struct{ *harness }

// Attachment is the kit's URL (conformance.Attacher): a successor process
// calls the same API.
func (h *attached) Attachment() string { return h.url }

// attach builds the harness of p in a successor process: the effect
// without a journal (a journal in this process's memory is no successor's
// to share), calling the test process's kit, which counts.
func attach(p preset) conformance.EffectOption {
	return conformance.WithSuccessorProcess(func(_ context.Context, url string) (conformance.Harness[Payment], error) {
		return &harness{url: url, p: p, opts: p.effect}, nil
	})
}

// Input gives variant 1 another amount, so that reusing the key with it is
// another payload.
func (h *harness) Input(key effects.Key, variant int) Payment {
	return Payment{Amount: 2000 + int64(variant)*500, Currency: "EUR", Reference: string(key)}
}

// Count counts the objects the kit created under the key as the server
// received it.
func (h *harness) Count(_ context.Context, key effects.Key) (int, error) {
	wire, err := h.keys.WireKey(key)
	if err != nil {
		return 0, err
	}
	return h.srv.Count(wire), nil
}

func (h *harness) Total(context.Context) (int, error) { return h.srv.Total(), nil }

// Restart restarts the kit: connections drop, keys and objects stay.
func (h *harness) Restart(context.Context) error { return h.srv.Restart() }

// CrashRestart kills the kit mid-request and starts it again: the vendor's
// key store is durable, the connections and replies in flight are lost.
func (h *harness) CrashRestart(ctx context.Context) error { return h.srv.CrashRestart(ctx) }

// Age makes the kit's keys d older, through its own clock, and moves the
// journal's clock by d.
func (h *harness) Age(ctx context.Context, d time.Duration) error {
	if h.ager != nil {
		return h.ager.Age(ctx, d)
	}
	h.clock.advance(d)
	return h.srv.Age(ctx, d)
}

// preset is one configuration held to the suite: the kit playing the
// server, the effect's options for it, and how its requests are built.
type preset struct {
	name    string
	server  []httpkeytest.Option
	effect  []httpkey.Option
	graphQL bool // the payment goes in a GraphQL mutation's variables.input
	// journalOnly: without a journal the suite cannot pass against an
	// honest server (Braintree answers a reused key as it answers a
	// request in flight, so only a journal's fingerprint tells them apart).
	journalOnly bool
}

func (p preset) builder() func(string) func(context.Context, Payment) (*http.Request, error) {
	if p.graphQL {
		return buildGraphQL
	}
	return buildPayment
}

// presets are httpkey's presets against the kit playing each, plus the
// draft with the replay header most vendors that have one use.
var presets = []preset{
	{name: "httpkey.IETF", server: []httpkeytest.Option{httpkeytest.As(httpkey.IETF)},
		effect: []httpkey.Option{httpkey.IETF, httpkey.WithHorizon(24 * time.Hour)}},
	{name: "httpkey.Adyen", server: []httpkeytest.Option{httpkeytest.As(httpkey.Adyen)},
		effect: []httpkey.Option{httpkey.Adyen}},
	{name: "httpkey.Adyen+409", server: []httpkeytest.Option{httpkeytest.As(httpkey.Adyen), httpkeytest.WithInFlightStatus(http.StatusConflict)},
		effect: []httpkey.Option{httpkey.Adyen}},
	{name: "httpkey.PayPal", server: []httpkeytest.Option{httpkeytest.As(httpkey.PayPal)},
		effect: []httpkey.Option{httpkey.PayPal, httpkey.WithHorizon(24 * time.Hour)}},
	{name: "httpkey.Worldline", server: []httpkeytest.Option{httpkeytest.As(httpkey.Worldline)},
		effect: []httpkey.Option{httpkey.Worldline}},
	{name: "httpkey.Checkout", server: []httpkeytest.Option{httpkeytest.As(httpkey.Checkout)},
		effect: []httpkey.Option{httpkey.Checkout}},
	{name: "httpkey.GoCardless", server: []httpkeytest.Option{httpkeytest.As(httpkey.GoCardless)},
		effect: []httpkey.Option{httpkey.GoCardless, httpkey.WithHorizon(24 * time.Hour), httpkey.WithRef(httpkey.JSONField("id"))}},
	{name: "httpkey.Mollie", server: []httpkeytest.Option{httpkeytest.As(httpkey.Mollie)},
		effect: []httpkey.Option{httpkey.Mollie}},
	{name: "httpkey.Square", server: []httpkeytest.Option{httpkeytest.As(httpkey.Square)},
		effect: []httpkey.Option{httpkey.Square, httpkey.WithHorizon(24 * time.Hour)}},
	{name: "httpkey.RazorpayX", server: []httpkeytest.Option{httpkeytest.As(httpkey.RazorpayX)},
		effect: []httpkey.Option{httpkey.RazorpayX, httpkey.WithHorizon(24 * time.Hour)}},
	{name: "httpkey.Braintree", server: []httpkeytest.Option{httpkeytest.As(httpkey.Braintree)}, graphQL: true, journalOnly: true,
		effect: []httpkey.Option{httpkey.Braintree, httpkey.WithRef(httpkey.JSONField("data", "id"))}},
	{name: "httpkey.IETF+Idempotent-Replayed",
		server: []httpkeytest.Option{httpkeytest.As(httpkey.IETF), httpkeytest.WithReplayHeader("Idempotent-Replayed", "true")},
		effect: []httpkey.Option{httpkey.IETF, httpkey.WithHorizon(24 * time.Hour), httpkey.WithReplayHeader("Idempotent-Replayed", "true")}},
}

// allowKit names what a harness on httpkeytest cannot verify: the kit and
// memjournal evict no key, so 1,000 keys show what 5,000 would; with a
// journal, the journal lives in the test's memory, which a child process
// cannot reach.
var (
	allowKit = conformance.AllowUnverified("httpkeytest and memjournal evict no key, so 1,000 keys show what 5,000 would",
		conformance.ScenarioKeyCapacity)
	allowJournal = conformance.AllowUnverified("httpkeytest and memjournal evict no key, so 1,000 keys show what 5,000 would; "+
		"memjournal lives in the test's memory, which a successor process cannot reach",
		conformance.ScenarioKeyCapacity, conformance.ScenarioProcess)
)

// TestConformance runs the whole suite on every preset against the kit
// playing its provider, without and with a journal, with every capability
// the harness has (restart, crash restart, age through the kit's own
// clock, a successor process without a journal, slow replies), and
// requires every field of each declared contract verified (or not
// applicable), the horizon by the horizon scenario in every
// configuration: without a replay signal it holds the kit's count to one
// object inside the horizon, and past it to a second. The contract each
// declares is checked too:
// effectively-once for the kit's horizon with a replay signal,
// effectively-once until pruned with a journal (the kit's clock moves 400
// days and the journal still replays), at-least-once otherwise, and after
// an unknown outcome for a server that stores only its 2xx answers.
func TestConformance(t *testing.T) {
	for i, p := range presets {
		for _, withJournal := range []bool{false, true} {
			if p.journalOnly && !withJournal {
				continue
			}
			name := p.name
			if withJournal {
				name += "+journal"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				// The keys are kept by the kit (a model of a vendor's key
				// store, whose real capacity no local test shows) and by
				// memjournal: key-capacity at a tenth of its default size
				// keeps CI short.
				opts := []conformance.EffectOption{conformance.WithCapacity(1000), conformance.WithSlowReply(callTimeout + time.Second), allowKit, attach(p)}
				if withJournal {
					opts = []conformance.EffectOption{conformance.WithCapacity(1000), conformance.WithSlowReply(journalLease + time.Second), allowJournal}
				}
				if i > 0 {
					// The presets share the adapter's retry and fault
					// handling and differ in the provider's key and answer
					// conventions: the first preset runs the suite's
					// default budget of generated schedules (8), the others
					// 3 each, which keeps this package's CI time in bounds
					// (fault-schedules is most of it).
					opts = append(opts, conformance.WithSchedules(3))
				}
				rep := conformance.Run(t, name, func(t testing.TB) conformance.Harness[Payment] {
					h := newHarness(t, p, withJournal)
					if withJournal {
						return h
					}
					return &attached{h}
				}, opts...)
				checkDeclared(t, p, withJournal, rep)
			})
		}
	}
}

// checkDeclared checks the contract rep verified against what the
// configuration must declare.
func checkDeclared(t *testing.T, p preset, withJournal bool, rep conformance.Report) {
	c := rep.Contract
	plain, err := httpkey.New(http.DefaultClient, p.builder()("http://127.0.0.1:1"), p.effect...)
	if err != nil {
		t.Fatal(err)
	}
	signal := plain.Contract().Guarantee == effects.EffectivelyOnce
	onlySuccesses := strings.Contains(c.Enforcer, "only 2xx answers stored")
	switch {
	case withJournal && onlySuccesses:
		if c.Guarantee != effects.AtLeastOnce || c.DuplicateWindow.Trigger != effects.AfterUnknownOutcome || c.Horizon != 0 {
			t.Errorf("declared %v, want at-least-once after an unknown outcome, until pruned", c)
		}
	case withJournal:
		if c.Guarantee != effects.EffectivelyOnce || c.Horizon != 0 || !c.DetectsKeyReuse {
			t.Errorf("declared %v, want effectively-once until pruned, detecting key reuse", c)
		}
	case signal:
		if c.Horizon == 0 {
			t.Errorf("declared %v, want the server's horizon", c)
		}
	default:
		if c.Guarantee != effects.AtLeastOnce || c.DuplicateWindow.Trigger != effects.AnyRedelivery {
			t.Errorf("declared %v, want at-least-once with duplicates on any redelivery (no replay signal, no journal)", c)
		}
	}
	for _, f := range rep.Fields {
		switch {
		case f.Status == conformance.Verified:
		case f.Status == conformance.NotVerified && f.Allowed != "":
		case f.Status == conformance.NotApplicable && f.Field != "Guarantee" && f.Field != "DuplicateWindow":
		default:
			t.Errorf("contract field %s", f)
		}
		if f.Field == "Horizon" && !slices.Contains(f.VerifiedBy, conformance.ScenarioHorizon) {
			t.Errorf("horizon not verified through the kit's clock: %s", f)
		}
	}
}
