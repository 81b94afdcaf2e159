package counterexamples

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"effectively.dev/effects"
)

// Plans of round 3, over [AgingStore] steps ([AgingStep]), each call a
// round trip through the suite's Faults:
//
//   - [CaseFoldIDs]: a handler that folds the event id to lower case
//     before it runs the plan (ids taken for case-insensitive), so two
//     events whose ids differ in case share every step's key.
//   - [SkipTransientStep]: a handler that runs its steps in order and
//     skips a step that failed with ErrTransient ("nothing was applied,
//     so there is nothing to do"), then acks: a step whose request never
//     reached its backend is never done.
//   - [ForgetfulStep]: an effectively-once step that declares keys kept
//     until pruned (Horizon 0), so the plan declares the same, but whose
//     store forgets them after a day.

// AgingStore is an in-process backend for plan steps whose records can be
// aged (the harness's Ager), shared by every instance of a plan.
type AgingStore struct {
	mu      sync.Mutex
	effects map[[2]string]int
	refs    map[effects.Key]agingRec
	seq     int
	aged    time.Duration
}

type agingRec struct {
	ref string
	at  time.Duration // when it was written, on the store's aged clock
}

// NewAgingStore returns an empty store.
func NewAgingStore() *AgingStore {
	return &AgingStore{effects: map[[2]string]int{}, refs: map[effects.Key]agingRec{}}
}

// Count returns how many times step's effect was done for the event id.
func (s *AgingStore) Count(step, id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[[2]string{step, id}]
}

// Age makes every record d older.
func (s *AgingStore) Age(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aged += d
}

// AgingStep is an effectively-once step on an AgingStore: it records its
// key and does its effect in one call. A step with Forget set forgets
// keys older than Forget, whatever it declares. A call that never reached
// the store (the request was cut) is ErrTransient; any other failure of
// a call is an unknown outcome.
type AgingStep struct {
	Step   string
	Store  *AgingStore
	Forget time.Duration
	// Trip runs one call to the store as a round trip (the suite's
	// Faults.RoundTrip); nil runs it directly.
	Trip func(ctx context.Context, fn func() error) error
}

// Contract declares an effectively-once step that keeps keys until
// pruned: for a step with Forget set, a lie.
func (a AgingStep) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "counterexamples.AgingStore: key recorded with the effect", DetectsKeyReuse: false}
}

// Apply does the step's effect for ev under key, once.
func (a AgingStep) Apply(ctx context.Context, key effects.Key, ev PlanEvent) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	var ref string
	var seen, ran bool
	call := func() error {
		a.Store.mu.Lock()
		defer a.Store.mu.Unlock()
		ran = true
		rec, ok := a.Store.refs[key]
		if ok && a.Forget > 0 && a.Store.aged-rec.at > a.Forget {
			ok = false
		}
		if ok {
			ref, seen = rec.ref, true
			return nil
		}
		a.Store.seq++
		a.Store.effects[[2]string{a.Step, ev.ID}]++
		ref = a.Step + "-" + itoa(a.Store.seq)
		a.Store.refs[key] = agingRec{ref: ref, at: a.Store.aged}
		return nil
	}
	var err error
	if a.Trip == nil {
		err = call()
	} else {
		err = a.Trip(ctx, call)
	}
	switch {
	case err != nil && !ran:
		return effects.Result{}, effects.Transient("counterexamples.AgingStep", key, err)
	case err != nil:
		return effects.Result{}, effects.Ambiguous("counterexamples.AgingStep", key, err)
	}
	return result(ref, seen), nil
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// NewAgingPlan returns the honest plan over steps under scope.
func NewAgingPlan(scope string, steps ...AgingStep) (*effects.Plan[PlanEvent], error) {
	ss := make([]effects.Step[PlanEvent], len(steps))
	for i, a := range steps {
		ss[i] = effects.EventStep[PlanEvent](a.Step, a)
	}
	return effects.NewPlan(scope, ss...)
}

// CaseFoldIDs runs its plan under the event id folded to lower case.
type CaseFoldIDs struct{ Plan *effects.Plan[PlanEvent] }

// Contract is the plan's.
func (h CaseFoldIDs) Contract() effects.PlanContract { return h.Plan.Contract() }

// Run runs the plan under the lower-cased id.
func (h CaseFoldIDs) Run(ctx context.Context, id string, ev PlanEvent) (effects.Results, error) {
	return h.Plan.Run(ctx, strings.ToLower(id), ev)
}

// SkipTransientStep runs Steps in order under the keys the plan would
// use, and skips a step that failed with ErrTransient. Its Contract is
// its plan's, which is the lie.
type SkipTransientStep struct {
	Plan  *effects.Plan[PlanEvent]
	Scope string
	Steps []AgingStep
}

// Contract is the plan's.
func (h SkipTransientStep) Contract() effects.PlanContract { return h.Plan.Contract() }

// Run does each step, skipping those that failed with ErrTransient.
func (h SkipTransientStep) Run(ctx context.Context, id string, ev PlanEvent) (effects.Results, error) {
	out := effects.Results{}
	for _, st := range h.Steps {
		key, err := effects.NewKey(h.Scope, id, st.Step)
		if err != nil {
			return out, err
		}
		res, err := st.Apply(ctx, key, ev)
		switch {
		case errors.Is(err, effects.ErrTransient):
			continue // nothing was applied: nothing to do
		case err != nil:
			return out, err
		}
		out[st.Step] = res
	}
	return out, nil
}

// ForgetfulStepAfter is how long a [ForgetfulStep] keeps keys.
const ForgetfulStepAfter = 24 * time.Hour

// ForgetfulStep returns the step named name over store that forgets keys
// after ForgetfulStepAfter while declaring them kept until pruned.
func ForgetfulStep(name string, store *AgingStore) AgingStep {
	return AgingStep{Step: name, Store: store, Forget: ForgetfulStepAfter}
}
