package counterexamples_test

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/conformance/internal/counterexamples"
	"effectively.dev/effects"
)

// vendorHarness runs a round 3 vendor client against a fresh Vendor, every
// call a round trip of the suite's Faults.
type vendorHarness struct {
	liar counterexamples.VendorLiar
	v    *counterexamples.Vendor
}

var (
	_ conformance.Ager         = (*vendorHarness)(nil)
	_ conformance.BatchCounter = (*vendorHarness)(nil)
)

func vendorMaker(l counterexamples.VendorLiar) func(testing.TB) conformance.Harness[counterexamples.Order] {
	return func(testing.TB) conformance.Harness[counterexamples.Order] {
		return &vendorHarness{liar: l, v: l.Vendor()}
	}
}

func (h *vendorHarness) Make(_ context.Context, f *conformance.Faults) (effects.Effect[counterexamples.Order], func(), error) {
	return h.liar.Build(h.v, f.RoundTrip), nil, nil
}

func (h *vendorHarness) Input(key effects.Key, variant int) counterexamples.Order {
	return counterexamples.Order{ID: string(key), Cents: int64(1000 + variant), Account: "acct_1"}
}

func (h *vendorHarness) Count(_ context.Context, key effects.Key) (int, error) {
	return h.v.Count(string(key)), nil
}

func (h *vendorHarness) CountBatch(_ context.Context, keys []effects.Key) ([]int, error) {
	out := make([]int, len(keys))
	for i, k := range keys {
		out[i] = h.v.Count(string(k))
	}
	return out, nil
}

func (h *vendorHarness) Total(context.Context) (int, error) { return h.v.Total(), nil }

// Age does nothing: the vendor keeps keys until pruned, and never prunes.
func (h *vendorHarness) Age(context.Context, time.Duration) error { return nil }

// scripted is a round trip whose i-th call (from 0) suffers script(i):
// "" runs it, "cut" does not run it and fails, "lost" runs it and loses
// the reply, a code ("500", "40001", "busy") answers with that
// application error, after applying it when the code is a 5xx, "slow"
// runs it a second late.
type scripted struct {
	mu     sync.Mutex
	n      int
	script func(i int) string
}

func (s *scripted) trip(ctx context.Context, fn func() error) error {
	s.mu.Lock()
	i := s.n
	s.n++
	s.mu.Unlock()
	switch what := s.script(i); what {
	case "":
		return fn()
	case "cut":
		return conformance.ErrInjected
	case "lost":
		_ = fn()
		return conformance.ErrInjected
	case "slow":
		time.Sleep(time.Second)
		return fn()
	default:
		e := &conformance.AppError{Code: what, Applied: strings.HasPrefix(what, "5")}
		if e.Applied {
			_ = fn()
		}
		return e
	}
}

func at(calls map[int]string) func(int) string { return func(i int) string { return calls[i] } }

// crcPair returns two keys of n bytes under prefix with the same CRC-32.
func crcPair(prefix string, n int) (effects.Key, effects.Key) {
	base := (prefix + strings.Repeat("x", n))[:n-8]
	seen := map[uint32]string{}
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for {
		var b [8]byte
		for j := range b {
			b[j] = alphabet[rng.IntN(len(alphabet))]
		}
		s := string(b[:])
		sum := crc32.ChecksumIEEE([]byte(base + s))
		if prev, ok := seen[sum]; ok {
			return effects.Key(base + prev), effects.Key(base + s)
		}
		seen[sum] = s
	}
}

// probe shows one liar's lie directly, without the suite: it returns what
// went wrong, "" when nothing did (the honest vendor's answer to every
// probe).
type probe func(t *testing.T, l counterexamples.VendorLiar) string

// distinctProbe applies a, then b: b must apply on its own.
func distinctProbe(a, b effects.Key) probe {
	return func(t *testing.T, l counterexamples.VendorLiar) string {
		v := l.Vendor()
		c := l.Build(v, nil)
		ctx := context.Background()
		for _, k := range []effects.Key{a, b} {
			res, err := c.Apply(ctx, k, counterexamples.Order{ID: string(k), Cents: 1})
			if err != nil || res.Status != effects.Applied {
				return fmt.Sprintf("%q after %q: (%s, %v), want applied: one key to the vendor", k, a, res.Status, err)
			}
		}
		return ""
	}
}

// retryProbe applies one key under a script of round trips, retrying
// retryable errors up to 6 attempts on the same client, then checks the
// count and every error.
func retryProbe(calls map[int]string, setup func(c *counterexamples.VendorClient, v *counterexamples.Vendor)) probe {
	return func(t *testing.T, l counterexamples.VendorLiar) string {
		v := l.Vendor()
		s := &scripted{script: func(int) string { return "" }}
		c := l.Build(v, s.trip)
		ctx := context.Background()
		o := counterexamples.Order{ID: "k", Cents: 1}
		if setup != nil {
			setup(c, v)
		}
		s.mu.Lock()
		s.n, s.script = 0, at(calls)
		s.mu.Unlock()
		var ok bool
		for attempt := 0; attempt < 6 && !ok; attempt++ {
			before := v.Count("k")
			_, err := c.Apply(ctx, "k", o)
			switch {
			case err == nil:
				ok = true
			case effects.ClassOf(err) != effects.Retryable:
				return fmt.Sprintf("attempt %d: %v is not retryable: a consumer gives up on the key", attempt+1, err)
			case errors.Is(err, effects.ErrTransient) && v.Count("k") != before:
				return fmt.Sprintf("attempt %d: ErrTransient, yet the vendor went from %d to %d effects", attempt+1, before, v.Count("k"))
			default:
				time.Sleep(100 * time.Millisecond) // past a lock a lost claim left
			}
		}
		if n := v.Count("k"); n != 1 {
			return fmt.Sprintf("%d effects for one key after the retries", n)
		}
		return ""
	}
}

// applyOnce applies k once on c (a setup for the probes of duplicates).
func applyOnce(c *counterexamples.VendorClient) {
	_, _ = c.Apply(context.Background(), "k", counterexamples.Order{ID: "k", Cents: 1})
}

var vendorProbes = map[string]probe{
	counterexamples.StripInvisible.Name: distinctProbe("k:x\u200by", "k:xy"),
	counterexamples.WidthFold.Name:      distinctProbe("k:\uff21", "k:A"),
	counterexamples.LikeLookup.Name:     distinctProbe("k:abc", "k:a_c"),
	counterexamples.GlobLookup.Name:     distinctProbe("k:abc", "k:a*c"),
	counterexamples.SlashCollapse.Name:  distinctProbe("k:a//b", "k:a/b"),
	counterexamples.LongKeyCRC.Name: func(t *testing.T, l counterexamples.VendorLiar) string {
		a, b := crcPair("k:", 200)
		return distinctProbe(a, b)(t, l)
	},
	// Lookup is call 0, create call 1.
	counterexamples.TransientOn5xx.Name:          retryProbe(map[int]string{1: "500"}, nil),
	counterexamples.ReplayedOnSerialization.Name: retryProbe(map[int]string{1: "40001"}, nil),
	counterexamples.DeadlockPermanent.Name:       retryProbe(map[int]string{0: "40P01"}, nil),
	// A duplicate whose lookup meets a busy database.
	counterexamples.BusySkipsLookup.Name: retryProbe(map[int]string{0: "busy"}, func(c *counterexamples.VendorClient, _ *counterexamples.Vendor) { applyOnce(c) }),
	// A lost create reply, then a cut lookup: two failures in a row.
	counterexamples.RotateAfterTwoFailures.Name: retryProbe(map[int]string{1: "lost", 2: "cut"}, nil),
	// Two cut requests in a row, then clean.
	counterexamples.BreakerAssumesDone.Name: retryProbe(map[int]string{0: "cut", 2: "cut"}, nil),
	counterexamples.ShortVendorLock.Name:    slowWorkProbe,
	counterexamples.AccountScoped.Name: func(t *testing.T, l counterexamples.VendorLiar) string {
		c := l.Build(l.Vendor(), nil)
		ctx := context.Background()
		_, _ = c.Apply(ctx, "k", counterexamples.Order{ID: "k", Cents: 1, Account: "acct_1"})
		res, err := c.Apply(ctx, "k", counterexamples.Order{ID: "k", Cents: 1, Account: "acct_2"})
		if !errors.Is(err, effects.ErrKeyReused) {
			return fmt.Sprintf("the key reused for another account got (%s, %v), want ErrKeyReused", res.Status, err)
		}
		return ""
	},
	counterexamples.ByteBudget.Name: func(t *testing.T, l counterexamples.VendorLiar) string {
		v := l.Vendor()
		c := l.Build(v, nil)
		ctx := context.Background()
		applyOnce(c)
		for i := range 20 {
			k := effects.Key(fmt.Sprint("big-", i))
			_, _ = c.Apply(ctx, k, counterexamples.Order{ID: string(k), Cents: 1, Note: strings.Repeat("n", 64<<10)})
		}
		applyOnce(c)
		if n := v.Count("k"); n != 1 {
			return fmt.Sprintf("%d effects for one key redelivered after 20 keys of 64 KiB", n)
		}
		return ""
	},
}

// slowWorkProbe: the vendor works for a second under the first attempt's
// claim while a duplicate keeps retrying: one effect, however long the
// work.
func slowWorkProbe(t *testing.T, l counterexamples.VendorLiar) string {
	v := l.Vendor()
	slow := &scripted{script: at(map[int]string{2: "slow"})} // lookup 0, claim 1, work 2
	a, b := l.Build(v, slow.trip), l.Build(v, nil)
	ctx := context.Background()
	o := counterexamples.Order{ID: "k", Cents: 1}
	done := make(chan struct{})
	go func() { defer close(done); _, _ = a.Apply(ctx, "k", o) }()
	time.Sleep(50 * time.Millisecond)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := b.Apply(ctx, "k", o); err == nil {
			break
		}
	}
	<-done
	if n := v.Count("k"); n != 1 {
		return fmt.Sprintf("%d effects for one key: a duplicate got in while the vendor worked", n)
	}
	return ""
}

// TestRound3Probes: each liar of round 3 shows its lie under its probe,
// and the honest vendor (and the honest slow one) shows none under any.
func TestRound3Probes(t *testing.T) {
	if len(counterexamples.VendorLiars) != len(vendorProbes) {
		t.Fatalf("%d liars, %d probes", len(counterexamples.VendorLiars), len(vendorProbes))
	}
	for _, l := range counterexamples.VendorLiars {
		t.Run(l.Name, func(t *testing.T) {
			p := vendorProbes[l.Name]
			if p == nil {
				t.Fatalf("no probe for %s", l.Name)
			}
			lie := p(t, l)
			if lie == "" {
				t.Fatalf("the probe shows no lie")
			}
			t.Logf("the lie: %s", lie)
			for _, honest := range []counterexamples.VendorLiar{counterexamples.Honest, counterexamples.HonestSlow} {
				if l.Name == counterexamples.ShortVendorLock.Name && honest.Name == counterexamples.Honest.Name {
					continue // the slow probe needs a vendor that works in two round trips
				}
				if got := p(t, honest); got != "" {
					t.Errorf("%s fails the probe: %s", honest.Name, got)
				}
			}
		})
	}
}

// The vendor harness's capabilities for the generated scenarios.
var (
	_ conformance.AppFaultCodes                       = (*vendorHarness)(nil)
	_ conformance.KeyScoper[counterexamples.Order]    = (*vendorHarness)(nil)
	_ conformance.PayloadSizer[counterexamples.Order] = (*vendorHarness)(nil)
)

// AppFaultCodes: the in-process vendor answers any code.
func (h *vendorHarness) AppFaultCodes() []string {
	return append(append([]string(nil), conformance.SQLAppCodes...), conformance.HTTPAppCodes...)
}

// KeyScopes: the vendor's orders belong to accounts.
func (h *vendorHarness) KeyScopes() []string { return []string{"account"} }

func (h *vendorHarness) ScopedInput(key effects.Key, scope int) counterexamples.Order {
	o := h.Input(key, 0)
	o.Account = fmt.Sprint("acct_", scope+1)
	return o
}

// The vendor takes notes up to 64 KiB and must keep 2 MiB of stored
// responses.
func (h *vendorHarness) MaxPayload() int  { return 64 << 10 }
func (h *vendorHarness) StoreBudget() int { return 2 << 20 }

func (h *vendorHarness) SizedInput(key effects.Key, variant, bytes int) counterexamples.Order {
	o := h.Input(key, variant)
	o.Note = strings.Repeat("n", bytes)
	return o
}

// round3Seed fixes the generated schedules and hostile pairs of the proof,
// so that it is the same on every run.
const round3Seed = 20261207

// TestRound3Caught is the proof of the generated scenarios: each liar of
// round 3 fails the scenario written for its class, and the honest
// vendors pass every scenario of the effect suite.
func TestRound3Caught(t *testing.T) {
	caught := map[string]string{
		counterexamples.StripInvisible.Name:          conformance.ScenarioHostileKeys,
		counterexamples.WidthFold.Name:               conformance.ScenarioHostileKeys,
		counterexamples.LikeLookup.Name:              conformance.ScenarioHostileKeys,
		counterexamples.GlobLookup.Name:              conformance.ScenarioHostileKeys,
		counterexamples.SlashCollapse.Name:           conformance.ScenarioHostileKeys,
		counterexamples.LongKeyCRC.Name:              conformance.ScenarioHostileKeys,
		counterexamples.TransientOn5xx.Name:          conformance.ScenarioAppFaults,
		counterexamples.ReplayedOnSerialization.Name: conformance.ScenarioAppFaults,
		counterexamples.DeadlockPermanent.Name:       conformance.ScenarioAppFaults,
		counterexamples.BusySkipsLookup.Name:         conformance.ScenarioAppFaults,
		counterexamples.RotateAfterTwoFailures.Name:  conformance.ScenarioSchedules,
		counterexamples.BreakerAssumesDone.Name:      conformance.ScenarioSchedules,
		counterexamples.ShortVendorLock.Name:         conformance.ScenarioSlowBackend,
		counterexamples.AccountScoped.Name:           conformance.ScenarioKeyScope,
		counterexamples.ByteBudget.Name:              conformance.ScenarioKeyBytes,
	}
	opts := []conformance.EffectOption{conformance.WithScheduleSeed(round3Seed), conformance.WithSlowBackend(time.Second)}
	for _, l := range counterexamples.VendorLiars {
		t.Run(l.Name, func(t *testing.T) {
			want := caught[l.Name]
			if want == "" {
				t.Fatalf("no scenario named for %s", l.Name)
			}
			rep := conformance.Run(t, "round3/"+l.Name, vendorMaker(l), append(append(opts, conformance.Only(want)), conformance.ReportOnly())...)
			row, _ := rep.Row(want)
			if row.Verdict != conformance.Fail {
				t.Fatalf("%s: %s, want FAIL (notes %v)", want, row.Verdict, row.Notes)
			}
			t.Logf("caught by %s: %s", want, firstLine(row.Failures))
		})
	}
	for _, l := range []counterexamples.VendorLiar{counterexamples.Honest, counterexamples.HonestSlow} {
		t.Run("control/"+l.Name, func(t *testing.T) {
			rep := conformance.Run(t, "round3/"+l.Name, vendorMaker(l), append(append(opts, conformance.WithLateRedelivery(time.Second)), conformance.ReportOnly())...)
			if failed := rep.Failed(); len(failed) > 0 {
				for _, s := range failed {
					row, _ := rep.Row(s)
					t.Errorf("%s: %s", s, firstLine(row.Failures))
				}
			}
		})
	}
}

func firstLine(failures []string) string {
	if len(failures) == 0 {
		return ""
	}
	return failures[0]
}

// TestRound3JournalsAndPlansCaught: each journal and plan liar of round 3
// fails the scenario written for its class, and the honest journal and
// plan pass every scenario.
func TestRound3JournalsAndPlansCaught(t *testing.T) {
	journals := map[string]string{
		"swallowed-complete": conformance.JournalTripFaults,
		"cached-attempt":     conformance.JournalAttempts,
		"async-complete":     conformance.JournalCrashRestart,
	}
	for _, j := range round3Journals {
		t.Run(j.name, func(t *testing.T) {
			want := journals[j.name]
			rep := conformance.RunJournal(t, "round3/"+j.name, tripJournalMaker(j.wrap), conformance.Only(want), conformance.ReportOnly())
			if row, _ := rep.Row(want); row.Verdict != conformance.Fail {
				t.Fatalf("%s: %s, want FAIL (notes %v)", want, row.Verdict, row.Notes)
			} else {
				t.Logf("caught by %s: %s", want, firstLine(row.Failures))
			}
		})
	}
	t.Run("control/journal", func(t *testing.T) {
		rep := conformance.RunJournal(t, "round3/honest", tripJournalMaker(nil), conformance.ReportOnly())
		for _, s := range rep.Failed() {
			row, _ := rep.Row(s)
			t.Errorf("%s: %s", s, firstLine(row.Failures))
		}
	})
	plans := map[string]string{
		"case-fold-ids":       conformance.PlanDistinctIDs,
		"skip-transient-step": conformance.PlanCut,
		"forgetful-step":      conformance.PlanHorizon,
	}
	for _, p := range round3Plans {
		t.Run(p.name, func(t *testing.T) {
			want := plans[p.name]
			rep := conformance.RunPlan(t, "round3/"+p.name, agingPlanMaker(p.forget, p.build), conformance.Only(want), conformance.ReportOnly())
			if row, _ := rep.Row(want); row.Verdict != conformance.Fail {
				t.Fatalf("%s: %s, want FAIL (notes %v)", want, row.Verdict, row.Notes)
			} else {
				t.Logf("caught by %s: %s", want, firstLine(row.Failures))
			}
		})
	}
	t.Run("control/plan", func(t *testing.T) {
		rep := conformance.RunPlan(t, "round3/honest", agingPlanMaker(false, honestPlan), conformance.ReportOnly())
		for _, s := range rep.Failed() {
			row, _ := rep.Row(s)
			t.Errorf("%s: %s", s, firstLine(row.Failures))
		}
	})
}
