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

func TestPlanRunsInOrderAndReplays(t *testing.T) {
	ctx := context.Background()
	charge, receipt := newRecorder(eo24), newRecorder(eo)
	plan, err := effects.NewPlan("billing",
		effects.Bind("charge", effects.Effect[string](charge), "2000 usd"),
		effects.NewStep("receipt", effects.Effect[string](receipt), func(done effects.Results) (string, error) {
			return "receipt for " + done["charge"].Ref, nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	receipt.fail = effects.Ambiguous("receipt", "", errors.New("lost reply"))
	res, err := plan.Run(ctx, "evt_1")
	var se *effects.StepError
	if !errors.As(err, &se) || se.Step != "receipt" || !effects.Retryable(err) {
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
	res, err = plan.Run(ctx, "evt_1")
	if err != nil {
		t.Fatal(err)
	}
	if res["charge"].Status != effects.Replayed || res["charge"].Ref != "ref-1" || res["receipt"].Status != effects.Applied {
		t.Fatalf("redelivery = %+v", res)
	}
	if len(charge.inputs) != 1 || len(receipt.inputs) != 1 || receipt.inputs[0] != "receipt for ref-1" {
		t.Fatalf("charge inputs %q, receipt inputs %q", charge.inputs, receipt.inputs)
	}
	if _, ok := charge.refs[effects.MustKey("billing", "evt_1", "charge")]; !ok {
		t.Fatal("the charge was not keyed NewKey(scope, messageID, step)")
	}
}

func TestPlanContractNamesTheWeakestStep(t *testing.T) {
	plan, err := effects.NewPlan("s",
		effects.Bind("ledger", effects.Effect[string](newRecorder(eo)), ""),
		effects.Bind("charge", effects.Effect[string](newRecorder(eo24)), ""),
		effects.Bind("mail", effects.Effect[string](newRecorder(alo)), ""),
	)
	if err != nil {
		t.Fatal(err)
	}
	pc := plan.Contract()
	if pc.Weakest != "mail" || pc.Contract.Guarantee != effects.AtLeastOnce || !strings.Contains(pc.Why, "at-least-once") || len(pc.Steps) != 3 {
		t.Fatalf("%+v", pc)
	}
	plan, _ = effects.NewPlan("s",
		effects.Bind("ledger", effects.Effect[string](newRecorder(eo)), ""),
		effects.Bind("charge", effects.Effect[string](newRecorder(eo24)), ""),
	)
	if pc := plan.Contract(); pc.Weakest != "charge" || !strings.Contains(pc.Why, "24h") {
		t.Fatalf("%+v", pc)
	}
}

func TestNewPlanRefusesBadPlans(t *testing.T) {
	ok := effects.Bind("a", effects.Effect[string](newRecorder(eo)), "")
	bad := [][]effects.Step{
		nil,
		{ok, ok},
		{effects.Step{}},
		{effects.Bind("x", effects.Effect[string](newRecorder(effects.Contract{})), "")},
	}
	for i, steps := range bad {
		if _, err := effects.NewPlan("s", steps...); !errors.Is(err, effects.ErrInvalidPlan) {
			t.Errorf("case %d: NewPlan = %v, want ErrInvalidPlan", i, err)
		}
	}
	if _, err := effects.NewPlan("", ok); !errors.Is(err, effects.ErrInvalidPlan) {
		t.Errorf("empty scope accepted")
	}
	// An empty message id cannot make a key: the step fails, nothing runs.
	r := newRecorder(eo)
	plan, _ := effects.NewPlan("s", effects.Bind("a", effects.Effect[string](r), ""))
	if _, err := plan.Run(context.Background(), ""); !errors.Is(err, effects.ErrInvalidKey) || len(r.inputs) != 0 {
		t.Fatalf("Run with an empty id = %v, inputs %q", err, r.inputs)
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
