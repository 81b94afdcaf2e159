package effects_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
)

// recorder is an effectively-once toy effect that records its keys and
// inputs and can be told to fail.
type recorder struct {
	mu       sync.Mutex
	contract effects.Contract
	refs     map[effects.Key]string
	inputs   []string
	fail     error
}

func newRecorder(c effects.Contract) *recorder {
	return &recorder{contract: c, refs: map[effects.Key]string{}}
}

func (r *recorder) Contract() effects.Contract { return r.contract }

func (r *recorder) Apply(_ context.Context, key effects.Key, in string) (effects.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return effects.Result{}, r.fail
	}
	if ref, ok := r.refs[key]; ok {
		return effects.Result{Status: effects.Replayed, Ref: ref}, nil
	}
	ref := fmt.Sprintf("ref-%d", len(r.refs)+1)
	r.refs[key] = ref
	r.inputs = append(r.inputs, in)
	return effects.Result{Status: effects.Applied, Ref: ref}, nil
}

var (
	eo   = effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "db", DetectsKeyReuse: true}
	eo24 = effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "stripe", Horizon: 24 * time.Hour, DetectsKeyReuse: true}
	alo  = effects.Contract{Guarantee: effects.AtLeastOnce, Enforcer: "smtp", DuplicateWindow: effects.Window{Trigger: effects.AfterUnknownOutcome, Between: "after 250, before the record"}}
)

// payment is the event the test plans run on.
type payment struct {
	ID    string
	Cents int
}

func TestPlanRunsInOrderAndReplays(t *testing.T) {
	ctx := context.Background()
	charge, receipt := newRecorder(eo24), newRecorder(eo)
	plan, err := effects.NewPlan("billing",
		effects.NewStep("charge", effects.Effect[string](charge), func(ev payment, _ effects.Results) (string, error) {
			return fmt.Sprintf("%d usd", ev.Cents), nil
		}),
		effects.NewStep("receipt", effects.Effect[string](receipt), func(ev payment, done effects.Results) (string, error) {
			return fmt.Sprintf("receipt for %s: %s", ev.ID, done["charge"].Ref), nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	ev := payment{ID: "evt_1", Cents: 2000}
	receipt.fail = effects.Ambiguous("receipt", "", errors.New("lost reply"))
	res, err := plan.Run(ctx, ev.ID, ev)
	var se *effects.StepError
	if !errors.As(err, &se) || se.Step != "receipt" || effects.ClassOf(err) != effects.Retryable {
		t.Fatalf("Run = %v; want a retryable StepError at receipt", err)
	}
	if se.Key != effects.MustKey("billing", "evt_1", "receipt") {
		t.Fatalf("step key %q", se.Key)
	}
	if res["charge"].Status != effects.Applied {
		t.Fatalf("charge = %+v", res["charge"])
	}
	// Redelivery: the charge replays with its recorded ref, which feeds the
	// receipt.
	receipt.fail = nil
	res, err = plan.Run(ctx, ev.ID, ev)
	if err != nil {
		t.Fatal(err)
	}
	if res["charge"].Status != effects.Replayed || res["charge"].Ref != "ref-1" || res["receipt"].Status != effects.Applied {
		t.Fatalf("redelivery = %+v", res)
	}
	if len(charge.inputs) != 1 || charge.inputs[0] != "2000 usd" || len(receipt.inputs) != 1 || receipt.inputs[0] != "receipt for evt_1: ref-1" {
		t.Fatalf("charge inputs %q, receipt inputs %q", charge.inputs, receipt.inputs)
	}
	if _, ok := charge.refs[effects.MustKey("billing", "evt_1", "charge")]; !ok {
		t.Fatal("the charge was not keyed NewKey(scope, id, step)")
	}
	if k, err := plan.Key("evt_1", "receipt"); err != nil || k != se.Key {
		t.Fatalf("plan.Key = %q, %v; want the key Run used, %q", k, err, se.Key)
	}
}

// One plan, defined once, serves every event: each run builds its inputs
// from its own event, also when runs overlap.
func TestPlanIsReusedAcrossEvents(t *testing.T) {
	ledger := newRecorder(eo)
	plan, err := effects.NewPlan("billing", effects.NewStep("ledger", effects.Effect[string](ledger),
		func(ev payment, _ effects.Results) (string, error) { return fmt.Sprintf("%s:%d", ev.ID, ev.Cents), nil }))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ev := payment{ID: fmt.Sprintf("evt_%d", i), Cents: 100 * i}
			for range 2 { // delivered twice
				if _, err := plan.Run(context.Background(), ev.ID, ev); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if len(ledger.inputs) != 20 {
		t.Fatalf("%d effects applied, want one per event (20)", len(ledger.inputs))
	}
	for i := range 20 {
		key := effects.MustKey("billing", fmt.Sprintf("evt_%d", i), "ledger")
		if _, ok := ledger.refs[key]; !ok {
			t.Errorf("no effect under %q", key)
		}
	}
	want := map[string]bool{}
	for i := range 20 {
		want[fmt.Sprintf("evt_%d:%d", i, 100*i)] = true
	}
	for _, in := range ledger.inputs {
		if !want[in] {
			t.Errorf("input %q was not built from its own event", in)
		}
		delete(want, in)
	}
}

func TestEventStepAppliesTheEventItself(t *testing.T) {
	r := newRecorder(eo)
	plan, err := effects.NewPlan("notes", effects.EventStep("note", effects.Effect[string](r)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plan.Run(context.Background(), "msg-1", "hello"); err != nil {
		t.Fatal(err)
	}
	if len(r.inputs) != 1 || r.inputs[0] != "hello" {
		t.Fatalf("inputs %q, want [hello]", r.inputs)
	}
}

func TestPlanInputErrorStopsBeforeTheEffect(t *testing.T) {
	r := newRecorder(eo)
	bad := errors.New("no customer")
	plan, _ := effects.NewPlan("s", effects.NewStep("a", effects.Effect[string](r),
		func(payment, effects.Results) (string, error) { return "", bad }))
	_, err := plan.Run(context.Background(), "evt", payment{})
	var se *effects.StepError
	if !errors.As(err, &se) || se.Step != "a" || !errors.Is(err, bad) || effects.ClassOf(err) == effects.Retryable {
		t.Fatalf("Run = %v; want a non-retryable StepError wrapping the input's error", err)
	}
	if len(r.inputs) != 0 {
		t.Fatalf("the effect ran with inputs %q", r.inputs)
	}
}

func TestPlanContractNamesTheWeakestStep(t *testing.T) {
	step := func(name string, c effects.Contract) effects.Step[string] {
		return effects.EventStep(name, effects.Effect[string](newRecorder(c)))
	}
	plan, err := effects.NewPlan("s", step("ledger", eo), step("charge", eo24), step("mail", alo))
	if err != nil {
		t.Fatal(err)
	}
	pc := plan.Contract()
	if pc.Weakest != "mail" || pc.Scope != "s" || pc.Contract.Guarantee != effects.AtLeastOnce || !strings.Contains(pc.Why, "at-least-once") || len(pc.Steps) != 3 {
		t.Fatalf("%+v", pc)
	}
	out := pc.String()
	if lines := strings.Split(out, "\n"); len(lines) != 4 || !strings.HasPrefix(lines[0], `plan "s" is at-least-once: step "mail"`) ||
		!strings.HasPrefix(lines[1], "  ledger  effectively-once (db") || !strings.HasPrefix(lines[3], "  mail    at-least-once (smtp") {
		t.Fatalf("String() =\n%s", out)
	}
	plan, _ = effects.NewPlan("s", step("ledger", eo), step("charge", eo24))
	if pc := plan.Contract(); pc.Weakest != "charge" || !strings.Contains(pc.Why, "24h") {
		t.Fatalf("%+v", pc)
	}
}

func TestNewPlanRefusesBadPlans(t *testing.T) {
	ok := effects.EventStep("a", effects.Effect[string](newRecorder(eo)))
	cases := map[string]struct {
		scope  string
		steps  []effects.Step[string]
		option string
	}{
		"empty scope":      {"", []effects.Step[string]{ok}, "scope"},
		"no steps":         {"s", nil, "steps"},
		"repeated name":    {"s", []effects.Step[string]{ok, ok}, "steps[1]"},
		"zero step":        {"s", []effects.Step[string]{ok, {}}, "steps[1]"},
		"nil effect":       {"s", []effects.Step[string]{effects.EventStep[string]("b", nil)}, "steps[0]"},
		"nil input":        {"s", []effects.Step[string]{effects.NewStep[string, string]("b", newRecorder(eo), nil)}, "steps[0]"},
		"invalid contract": {"s", []effects.Step[string]{effects.EventStep("x", effects.Effect[string](newRecorder(effects.Contract{})))}, "steps[0]"},
		"unnamed with eff": {"s", []effects.Step[string]{effects.EventStep("", effects.Effect[string](newRecorder(eo)))}, "steps[0]"},
	}
	for name, c := range cases {
		_, err := effects.NewPlan(c.scope, c.steps...)
		var ce *effects.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, effects.ErrInvalidConfig) || ce.Op != "effects.NewPlan" || ce.Option != c.option {
			t.Errorf("%s: NewPlan = %v, want a ConfigError about %s", name, err, c.option)
		}
	}
}

// An id that cannot make a key (an empty one) fails before the first
// effect, so no plan is left half done.
func TestPlanRunRefusesAnEmptyIDBeforeAnyEffect(t *testing.T) {
	first, second := newRecorder(eo), newRecorder(eo)
	plan, _ := effects.NewPlan("s",
		effects.EventStep("a", effects.Effect[string](first)),
		effects.EventStep("b", effects.Effect[string](second)))
	_, err := plan.Run(context.Background(), "", "payload")
	var se *effects.StepError
	if !errors.Is(err, effects.ErrInvalidKey) || !errors.As(err, &se) || se.Step != "a" {
		t.Errorf("Run with an empty id = %v, want a StepError at the first step with ErrInvalidKey", err)
	}
	if len(first.inputs)+len(second.inputs) != 0 {
		t.Fatalf("effects ran: %q, %q", first.inputs, second.inputs)
	}
}

func TestObserve(t *testing.T) {
	r := newRecorder(eo)
	if got := effects.Observe("x", effects.Effect[string](r), nil); got != effects.Effect[string](r) {
		t.Fatal("Observe with a nil observer must return the effect itself")
	}
	var mu sync.Mutex
	var kinds []string
	obs := effects.ObserverFunc(func(_ context.Context, ev effects.Event) {
		mu.Lock()
		defer mu.Unlock()
		kinds = append(kinds, ev.Effect+":"+ev.Kind.String())
	})
	eff := effects.Observe("ledger", effects.Effect[string](r), obs)
	key := effects.MustKey("k")
	eff.Apply(context.Background(), key, "a")
	eff.Apply(context.Background(), key, "a")
	r.fail = &effects.Error{Kind: effects.ErrKeyReused}
	eff.Apply(context.Background(), key, "b")
	r.fail = &effects.Error{Kind: effects.ErrInFlight}
	eff.Apply(context.Background(), key, "a")
	r.fail = errors.New("boom")
	eff.Apply(context.Background(), key, "a")
	want := "ledger:applied ledger:replayed ledger:key_reused ledger:in_flight ledger:failed"
	if got := strings.Join(kinds, " "); got != want {
		t.Fatalf("events %q, want %q", got, want)
	}
}

// BenchmarkPlan compares one plan defined at start-up and run per event
// (reused) with the shape the old API forced, a plan built per event
// (per-event: NewPlan, which validates every step's contract, then Run),
// side by side in each round. Both run the same two in-memory steps; the
// difference is the cost of building a plan per delivery.
//
//	go test -run '^$' -bench BenchmarkPlan -benchmem ./effects/
func BenchmarkPlan(b *testing.B) {
	ctx := context.Background()
	ledger, receipt := newRecorder(eo), newRecorder(eo24)
	steps := []effects.Step[payment]{
		effects.NewStep("ledger", effects.Effect[string](ledger), func(ev payment, _ effects.Results) (string, error) { return ev.ID, nil }),
		effects.NewStep("receipt", effects.Effect[string](receipt), func(ev payment, done effects.Results) (string, error) { return done["ledger"].Ref, nil }),
	}
	ev := payment{ID: "evt_bench", Cents: 100}
	reused, err := effects.NewPlan("bench", steps...)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := reused.Run(ctx, ev.ID, ev); err != nil { // every later run replays
		b.Fatal(err)
	}
	// Rounds interleave the two, so machine noise hits both alike; compare
	// medians over the rounds.
	for round := 1; round <= 5; round++ {
		b.Run(fmt.Sprintf("round=%d/reused", round), func(b *testing.B) {
			for b.Loop() {
				if _, err := reused.Run(ctx, ev.ID, ev); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("round=%d/per-event", round), func(b *testing.B) {
			for b.Loop() {
				p, err := effects.NewPlan("bench", steps...)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := p.Run(ctx, ev.ID, ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// barrier is an effect whose Apply returns only once n Applies are running
// at the same time (or fails after a second): it proves that steps ran
// concurrently.
type barrier struct {
	n       int
	mu      sync.Mutex
	waiting int
	all     chan struct{}
	fail    map[string]error // by input
}

func (b *barrier) Contract() effects.Contract { return eo }

func (b *barrier) Apply(_ context.Context, key effects.Key, in string) (effects.Result, error) {
	b.mu.Lock()
	b.waiting++
	if b.waiting == b.n {
		close(b.all)
	}
	b.mu.Unlock()
	select {
	case <-b.all:
	case <-time.After(time.Second):
		return effects.Result{}, fmt.Errorf("%s ran alone: the group did not run concurrently", in)
	}
	if err := b.fail[in]; err != nil {
		return effects.Result{}, err
	}
	return effects.Result{Status: effects.Applied, Ref: "ref-" + in}, nil
}

func TestPlanConcurrentStepsRunTogetherAfterTheStepsBeforeThem(t *testing.T) {
	ctx := context.Background()
	charge, after := newRecorder(eo), newRecorder(eo)
	group := &barrier{n: 3, all: make(chan struct{})}
	fromCharge := func(name string) func(payment, effects.Results) (string, error) {
		return func(_ payment, done effects.Results) (string, error) {
			if _, ok := done["charge"]; !ok {
				return "", errors.New(name + " started before the charge completed")
			}
			for _, other := range []string{"receipt", "event", "mail"} {
				if _, ok := done[other]; ok {
					return "", fmt.Errorf("%s saw the result of %s, a step of its own group", name, other)
				}
			}
			return name, nil
		}
	}
	plan, err := effects.NewPlan("billing",
		effects.NewStep("charge", charge, func(p payment, _ effects.Results) (string, error) { return p.ID, nil }),
		effects.NewStep("receipt", group, fromCharge("receipt")).Concurrent(),
		effects.NewStep("event", group, fromCharge("event")).Concurrent(),
		effects.NewStep("mail", group, fromCharge("mail")).Concurrent(),
		effects.NewStep("audit", after, func(_ payment, done effects.Results) (string, error) {
			return done["receipt"].Ref + "," + done["event"].Ref + "," + done["mail"].Ref, nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	res, err := plan.Run(ctx, "evt-1", payment{ID: "evt-1", Cents: 5})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(res) != 5 {
		t.Errorf("results %v, want 5", res)
	}
	if want := []string{"ref-receipt,ref-event,ref-mail"}; strings.Join(after.inputs, "|") != want[0] {
		t.Errorf("the step after the group got %q, want %q", after.inputs, want)
	}
}

func TestPlanConcurrentGroupReportsTheFirstFailureInPlanOrder(t *testing.T) {
	ctx := context.Background()
	errEvent, errMail := errors.New("event failed"), errors.New("mail failed")
	group := &barrier{n: 3, all: make(chan struct{}), fail: map[string]error{"event": errEvent, "mail": errMail}}
	after := newRecorder(eo)
	in := func(name string) func(payment, effects.Results) (string, error) {
		return func(payment, effects.Results) (string, error) { return name, nil }
	}
	plan, err := effects.NewPlan("billing",
		effects.NewStep("mail", group, in("mail")).Concurrent(),
		effects.NewStep("event", group, in("event")).Concurrent(),
		effects.NewStep("receipt", group, in("receipt")).Concurrent(),
		effects.NewStep("audit", after, in("audit")),
	)
	if err != nil {
		t.Fatal(err)
	}
	res, err := plan.Run(ctx, "evt-1", payment{ID: "evt-1"})
	var se *effects.StepError
	if !errors.As(err, &se) || se.Step != "mail" || !errors.Is(err, errMail) {
		t.Fatalf("Run error = %v, want the mail step's (first in plan order)", err)
	}
	if _, ok := res["receipt"]; !ok || len(res) != 1 {
		t.Errorf("results %v, want just the receipt that succeeded", res)
	}
	if len(after.inputs) != 0 {
		t.Errorf("the step after a failed group ran: %v", after.inputs)
	}
}
