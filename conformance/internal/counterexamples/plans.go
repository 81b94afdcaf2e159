package counterexamples

import (
	"context"
	"fmt"
	"sync"

	"effectively.dev/effects"
)

// Plans and handlers built on several effects that claim more than they
// do, to prove conformance.RunPlan. Their steps are [MemStep] effects over
// one [Store] in process memory, each call a round trip through Trip (the
// suite's Faults.RoundTrip), and honest: the lie is in the composition.
//
//   - [SwallowingHandler]: runs its steps in order but swallows a step's
//     error, logs it and goes on, returning nil: the step is skipped and
//     the delivery acked. Caught by lost-reply, cancel-mid-plan and
//     kill-mid-plan.
//   - [OverclaimingHandler]: a correct plan whose Contract() declares an
//     at-least-once step effectively-once. Caught by lost-reply, after
//     which the step's retry applies again.
//   - [MisnamedWeakest]: a correct plan whose Contract() names its
//     strongest step as the weakest, and the plan effectively-once.
//     Caught by plan-contract.

// PlanEvent is the event the plan counterexamples handle.
type PlanEvent struct{ ID string }

// Store is an in-process backend shared by every instance of a plan
// counterexample: the effects done, by step and event, and the records
// that remember keys.
type Store struct {
	mu      sync.Mutex
	effects map[[2]string]int
	refs    map[effects.Key]string
	seq     int
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{effects: map[[2]string]int{}, refs: map[effects.Key]string{}}
}

// Count returns how many times step's effect was done for the event id.
func (s *Store) Count(step, id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[[2]string{step, id}]
}

// do records one effect of step for id and returns its ref.
func (s *Store) do(step, id string) string {
	s.seq++
	s.effects[[2]string{step, id}]++
	return fmt.Sprintf("%s-%d", step, s.seq)
}

// MemStep is an honest effect on a Store, named Step. With Once, it
// records the key and does the effect in one call (effectively-once);
// without, it looks the key up, does the effect and records the key in
// three calls, so an unknown outcome of the last two may repeat it
// (at-least-once, after an unknown outcome), as an email does.
type MemStep struct {
	Step  string
	Once  bool
	Store *Store
	// Trip runs one call to the store as a round trip (the suite's
	// Faults.RoundTrip); nil runs it directly.
	Trip func(ctx context.Context, fn func() error) error
}

// Contract declares what the step does.
func (m MemStep) Contract() effects.Contract {
	if m.Once {
		return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "counterexamples.Store: key recorded with the effect"}
	}
	return effects.Contract{Guarantee: effects.AtLeastOnce, Enforcer: "counterexamples.Store: key recorded after the effect",
		DuplicateWindow: effects.Window{Trigger: effects.AfterUnknownOutcome, Between: "the effect and the record of its key"}}
}

func (m MemStep) trip(ctx context.Context, key effects.Key, fn func()) error {
	call := func() error { m.Store.mu.Lock(); defer m.Store.mu.Unlock(); fn(); return nil }
	if m.Trip == nil {
		return call()
	}
	if err := m.Trip(ctx, call); err != nil {
		return effects.Ambiguous("counterexamples.MemStep", key, err)
	}
	return nil
}

// Apply does the step's effect for ev under key.
func (m MemStep) Apply(ctx context.Context, key effects.Key, ev PlanEvent) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	var ref string
	var seen bool
	if m.Once {
		err := m.trip(ctx, key, func() {
			if ref, seen = m.Store.refs[key]; !seen {
				ref = m.Store.do(m.Step, ev.ID)
				m.Store.refs[key] = ref
			}
		})
		return result(ref, seen), err
	}
	if err := m.trip(ctx, key, func() { ref, seen = m.Store.refs[key] }); err != nil || seen {
		return result(ref, seen), err
	}
	if err := m.trip(ctx, key, func() { ref = m.Store.do(m.Step, ev.ID) }); err != nil {
		return effects.Result{}, err
	}
	return result(ref, false), m.trip(ctx, key, func() { m.Store.refs[key] = ref })
}

func result(ref string, replayed bool) effects.Result {
	if replayed {
		return effects.Result{Status: effects.Replayed, Ref: ref}
	}
	return effects.Result{Status: effects.Applied, Ref: ref}
}

// NewMemPlan returns the honest plan over steps (each a MemStep as
// an event step) under scope.
func NewMemPlan(scope string, steps ...MemStep) (*effects.Plan[PlanEvent], error) {
	ss := make([]effects.Step[PlanEvent], len(steps))
	for i, m := range steps {
		ss[i] = effects.EventStep[PlanEvent](m.Step, m)
	}
	return effects.NewPlan(scope, ss...)
}

// SwallowingHandler does its steps in order under the plan's keys, but a
// step that fails is logged and skipped, and Run returns nil: the delivery
// is acked with the step never done. Its Contract is its plan's, which is
// the lie.
type SwallowingHandler struct {
	Plan  *effects.Plan[PlanEvent]
	Steps []MemStep
	// Logged receives the errors swallowed.
	Logged func(error)
}

// Contract reports the plan's composite contract.
func (h SwallowingHandler) Contract() effects.PlanContract { return h.Plan.Contract() }

// Run does every step, swallowing their errors.
func (h SwallowingHandler) Run(ctx context.Context, id string, ev PlanEvent) (effects.Results, error) {
	done := effects.Results{}
	for _, st := range h.Steps {
		key, err := h.Plan.Key(id, st.Step)
		if err != nil {
			return done, err
		}
		res, err := st.Apply(ctx, key, ev)
		if err != nil {
			if h.Logged != nil {
				h.Logged(err) // "best effort": logged, then on to the next step
			}
			continue
		}
		done[st.Step] = res
	}
	return done, nil
}

// OverclaimingHandler runs an honest plan but declares the step named
// Step effectively-once, whatever it is.
type OverclaimingHandler struct {
	Plan *effects.Plan[PlanEvent]
	Step string
}

// Contract declares Step effectively-once, and the plan accordingly.
func (h OverclaimingHandler) Contract() effects.PlanContract {
	pc := h.Plan.Contract()
	steps := append([]effects.StepContract(nil), pc.Steps...)
	for i := range steps {
		if steps[i].Step == h.Step {
			steps[i].Contract = effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "counterexample: claimed, not done"}
		}
	}
	return recompose(pc, steps)
}

// Run runs the plan.
func (h OverclaimingHandler) Run(ctx context.Context, id string, ev PlanEvent) (effects.Results, error) {
	return h.Plan.Run(ctx, id, ev)
}

// recompose returns pc with steps and the weakest of them, as
// effects.Plan.Contract would compute it.
func recompose(pc effects.PlanContract, steps []effects.StepContract) effects.PlanContract {
	pc.Steps = steps
	pc.Contract, pc.Weakest = steps[0].Contract, steps[0].Step
	for _, s := range steps {
		if s.Contract.Weaker(pc.Contract) {
			pc.Contract, pc.Weakest = s.Contract, s.Step
		}
	}
	return pc
}

// MisnamedWeakest runs an honest plan but names its first step the
// weakest and the plan as strong as that step.
type MisnamedWeakest struct{ Plan *effects.Plan[PlanEvent] }

// Contract names the first step the weakest.
func (h MisnamedWeakest) Contract() effects.PlanContract {
	pc := h.Plan.Contract()
	pc.Contract, pc.Weakest = pc.Steps[0].Contract, pc.Steps[0].Step
	pc.Why = "every step is effectively-once"
	return pc
}

// Run runs the plan.
func (h MisnamedWeakest) Run(ctx context.Context, id string, ev PlanEvent) (effects.Results, error) {
	return h.Plan.Run(ctx, id, ev)
}
