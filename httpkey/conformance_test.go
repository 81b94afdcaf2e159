package httpkey_test

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/httpkey"
	"effectively.dev/httpkey/httpkeytest"
)

// harness runs one conformance scenario against one httpkeytest server:
// the server is the backend, kept across Make (a restarted process talks
// to the same API), and so is the journal, when there is one (it is the
// application's database). Each Make builds the effect on a client whose
// connections go through the suite's Faults. The server and the journal
// read a clock that Age moves forward, so the horizon scenario runs.
type harness struct {
	srv     *httpkeytest.Server
	clock   *agedClock
	opts    []httpkey.Option
	journal *memjournal.Journal // nil: no journal
	keys    *httpkey.Effect[Payment]
}

var (
	_ conformance.Harness[Payment] = (*harness)(nil)
	_ conformance.Restarter        = (*harness)(nil)
	_ conformance.Ager             = (*harness)(nil)
)

// kitLatency makes concurrent requests with one key overlap at the kit,
// so the concurrency scenarios meet its 409 and not only its replays.
const kitLatency = 2 * time.Millisecond

// journalLease is the lease of the journal rows: when the journal's lease
// gates the call (no replay signal), a retry after a lost reply waits for
// it, and the suite retries for 30 seconds.
const journalLease = 2 * time.Second

// newHarness starts a kit with server and builds effects with opts, plus
// a journal shared across Make when withJournal.
func newHarness(t testing.TB, server []httpkeytest.Option, opts []httpkey.Option, withJournal bool) *harness {
	t.Helper()
	clk := &agedClock{}
	srv := httpkeytest.Start(t, append([]httpkeytest.Option{httpkeytest.WithLatency(kitLatency), httpkeytest.WithClock(clk.Now)}, server...)...)
	h := &harness{srv: srv, clock: clk, opts: opts}
	if withJournal {
		h.journal = memjournal.New(clk.Now)
	}
	keys, err := httpkey.New(http.DefaultClient, buildPayment(srv.URL), h.effectOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	h.keys = keys
	return h
}

func (h *harness) effectOpts() []httpkey.Option {
	if h.journal == nil {
		return h.opts
	}
	return append(append([]httpkey.Option(nil), h.opts...), httpkey.WithJournal(h.journal), httpkey.WithLease(journalLease))
}

func (h *harness) Make(_ context.Context, f *conformance.Faults) (effects.Effect[Payment], func(), error) {
	tr := f.Transport(nil)
	e, err := httpkey.New(&http.Client{Transport: tr}, buildPayment(h.srv.URL), h.effectOpts()...)
	return e, tr.CloseIdleConnections, err
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

// Age moves the clock of the kit (and of the journal) forward by d.
func (h *harness) Age(_ context.Context, d time.Duration) error {
	h.clock.advance(d)
	return nil
}

// preset is one configuration held to the suite: the kit playing the
// server, and the effect's options for it.
type preset struct {
	name   string
	server []httpkeytest.Option
	effect []httpkey.Option
}

// presets are httpkey's presets against the kit playing each, plus the
// draft with the replay header most vendors that have one use.
var presets = []preset{
	{"httpkey.IETF", []httpkeytest.Option{httpkeytest.IETF()},
		[]httpkey.Option{httpkey.IETF(), httpkey.WithHorizon(httpkeytest.DefaultHorizon)}},
	{"httpkey.Adyen", []httpkeytest.Option{httpkeytest.Adyen()},
		[]httpkey.Option{httpkey.Adyen()}},
	{"httpkey.PayPal", []httpkeytest.Option{httpkeytest.PayPal()},
		[]httpkey.Option{httpkey.PayPal(), httpkey.WithHorizon(httpkeytest.DefaultHorizon)}},
	{"httpkey.Worldline", []httpkeytest.Option{httpkeytest.Worldline()},
		[]httpkey.Option{httpkey.Worldline()}},
	{"httpkey.IETF+Idempotent-Replayed",
		[]httpkeytest.Option{httpkeytest.IETF(), httpkeytest.WithReplayHeader("Idempotent-Replayed", "true")},
		[]httpkey.Option{httpkey.IETF(), httpkey.WithHorizon(httpkeytest.DefaultHorizon), httpkey.WithReplayHeader("Idempotent-Replayed", "true")}},
}

// allowKit names what a harness on httpkeytest cannot verify: the kit is
// a server in the test's memory (a child process cannot reach the keys it
// holds for the harness, and a crash has nothing to lose that a restart
// keeps), and it evicts no key, as memjournal evicts none, so 1,000 keys
// show what 5,000 would. The slow replies are held 300 ms, under the
// HTTP client's timeout: the adapter waits for them.
var allowKit = conformance.AllowUnverified("httpkeytest is a server in the test's memory, which a child process cannot reach and a crash cannot "+
	"tell from a restart; it and memjournal evict no key, so 1,000 keys show what 5,000 would; its FailNext stores the injected failure "+
	"as the key's response, which every retry of the key then replays, so the suite's application faults cannot be retried through",
	conformance.ScenarioProcess, conformance.ScenarioCrashRestart, conformance.ScenarioKeyCapacity, conformance.ScenarioAppFaults)

// TestConformance runs the whole suite on every preset, without and with
// a journal, and requires every field of each declared contract verified
// (or not applicable: an at-least-once contract with duplicates on any
// redelivery claims no horizon). The contract each declares is checked
// too: effectively-once for the kit's horizon with a replay signal,
// effectively-once until pruned with a journal (the kit's clock moves 400
// days and the journal still replays), at-least-once otherwise.
func TestConformance(t *testing.T) {
	for _, p := range presets {
		for _, withJournal := range []bool{false, true} {
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
				rep := conformance.Run(t, name, func(t testing.TB) conformance.Harness[Payment] {
					return newHarness(t, p.server, p.effect, withJournal)
				}, conformance.WithCapacity(1000), conformance.WithSlowReply(300*time.Millisecond), allowKit)
				c := rep.Contract
				signal := newHarness(t, p.server, p.effect, false).keys.Contract().Guarantee == effects.EffectivelyOnce
				switch {
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
					if f.Field == "Horizon" && (withJournal || signal) && !slices.Contains(f.VerifiedBy, conformance.ScenarioHorizon) {
						t.Errorf("horizon not verified through the kit's clock: %s", f)
					}
				}
			})
		}
	}
}
