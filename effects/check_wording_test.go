package effects_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"effectively.dev/effects"
)

// unreachable is an effect whose start-up check cannot reach its owner.
type unreachable struct{}

func (unreachable) Apply(context.Context, effects.Key, string) (effects.Result, error) {
	return effects.Result{}, nil
}

func (unreachable) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "test"}
}

func (unreachable) Check(context.Context) error {
	return effects.Transient("db.Check", "", errors.New("connection refused"))
}

// TestPlanCheckReadsAsAStartupError: a failed start-up check names the
// step and says it is the start-up check, with no empty key and no advice
// about retrying a key.
func TestPlanCheckReadsAsAStartupError(t *testing.T) {
	p, err := effects.NewPlan("billing", effects.EventStep[string]("ledger", unreachable{}))
	if err != nil {
		t.Fatal(err)
	}
	err = p.Check(context.Background())
	if err == nil || effects.ClassOf(err) != effects.Retryable {
		t.Fatalf("Check = %v, want a retryable error", err)
	}
	msg := err.Error()
	for _, bad := range []string{`(key "")`, "same key"} {
		if strings.Contains(msg, bad) {
			t.Errorf("Check error %q contains %q", msg, bad)
		}
	}
	if !strings.Contains(msg, `plan step "ledger": start-up check failed`) || !strings.Contains(msg, "connection refused") {
		t.Errorf("Check error %q, want it to name the step, the start-up check and the cause", msg)
	}
}
