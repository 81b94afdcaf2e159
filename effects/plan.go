package effects

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Step is one effect of a [Plan], bound to its input under a name. The
// name is part of the step's key, so it must stay the same across
// deployments for as long as messages may be redelivered.
type Step struct {
	name     string
	contract Contract
	apply    func(ctx context.Context, key Key, done Results) (Result, error)
}

// NewStep binds eff to the input that input builds from the results of the
// steps before it (done, by step name): a later step can use an earlier
// step's reference, such as the PaymentIntent id a receipt mentions. On a
// redelivery the earlier steps replay with their recorded references, so
// the input is rebuilt from the same values, not recomputed from new ones.
func NewStep[In any](name string, eff Effect[In], input func(done Results) (In, error)) Step {
	return Step{
		name:     name,
		contract: eff.Contract(),
		apply: func(ctx context.Context, key Key, done Results) (Result, error) {
			in, err := input(done)
			if err != nil {
				return Result{}, fmt.Errorf("building the input: %w", err)
			}
			return eff.Apply(ctx, key, in)
		},
	}
}

// Bind binds eff to a fixed input under name.
func Bind[In any](name string, eff Effect[In], in In) Step {
	return NewStep(name, eff, func(Results) (In, error) { return in, nil })
}

// Name returns the step's name.
func (s Step) Name() string { return s.name }

// Contract returns the contract of the step's effect.
func (s Step) Contract() Contract { return s.contract }

// Results holds the results of a plan's completed steps, by step name.
type Results map[string]Result

// Plan runs effects of different kinds for one message, in order, each
// under a key derived from the message's id and the step's name:
// NewKey(scope, messageID, step). It stops at the first failing step: the
// message is not acked, the broker redelivers it, and the redelivery runs
// the plan again, the completed steps replaying instead of repeating.
//
// A plan promises no more than its weakest step: see [Plan.Contract].
type Plan struct {
	scope string
	steps []Step
	obs   Observer
}

// ErrInvalidPlan is returned by [NewPlan] for a plan that cannot run.
var ErrInvalidPlan = errors.New("invalid plan")

// NewPlan returns a plan running steps in order under scope. It refuses an
// empty scope, no steps, empty or repeated step names, and steps whose
// contracts are invalid.
func NewPlan(scope string, steps ...Step) (*Plan, error) {
	if scope == "" {
		return nil, fmt.Errorf("%w: empty scope", ErrInvalidPlan)
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("%w: no steps", ErrInvalidPlan)
	}
	seen := map[string]bool{}
	for i, s := range steps {
		switch {
		case s.name == "" || s.apply == nil:
			return nil, fmt.Errorf("%w: step %d has no name or no effect (build steps with NewStep or Bind)", ErrInvalidPlan, i)
		case seen[s.name]:
			return nil, fmt.Errorf("%w: step name %q repeated: each step needs its own key", ErrInvalidPlan, s.name)
		}
		if err := s.contract.Validate(); err != nil {
			return nil, fmt.Errorf("%w: step %q: %w", ErrInvalidPlan, s.name, err)
		}
		seen[s.name] = true
	}
	return &Plan{scope: scope, steps: append([]Step(nil), steps...)}, nil
}

// WithObserver returns a copy of the plan that reports every step's
// outcome to o, with Event.Step set to the step's name.
func (p *Plan) WithObserver(o Observer) *Plan {
	q := *p
	q.obs = o
	return &q
}

// StepError is the error of a plan's failing step. It unwraps to the step's
// error, so errors.Is and [Retryable] see through it.
type StepError struct {
	Step string
	Key  Key
	Err  error
}

// Error names the step and its key.
func (e *StepError) Error() string {
	return fmt.Sprintf("plan step %q (key %q): %v", e.Step, e.Key, e.Err)
}

// Unwrap returns the step's error.
func (e *StepError) Unwrap() error { return e.Err }

// Run runs the plan's steps for the message messageID, in order, and
// returns the results of the steps that completed. On the first failure it
// stops and returns a *[StepError]; retry (or let the broker redeliver) the
// same message id to resume: completed steps replay.
func (p *Plan) Run(ctx context.Context, messageID string) (Results, error) {
	done := make(Results, len(p.steps))
	for _, s := range p.steps {
		key, err := NewKey(p.scope, messageID, s.name)
		if err != nil {
			return done, &StepError{Step: s.name, Err: err}
		}
		start := time.Now()
		res, err := s.apply(ctx, key, done)
		if p.obs != nil {
			p.obs.Observe(ctx, Event{Kind: resultKind(res, err), Step: s.name, Key: key, DeliveryID: messageID, Duration: time.Since(start), Err: err})
		}
		if err != nil {
			return done, &StepError{Step: s.name, Key: key, Err: err}
		}
		done[s.name] = res
	}
	return done, nil
}

// PlanContract is what a plan promises as a whole.
type PlanContract struct {
	// Contract is the weakest step's contract, which bounds the plan's.
	Contract Contract
	// Weakest names the step that decides, and Why says why in words.
	Weakest, Why string
	// Steps lists every step's contract, in order.
	Steps []StepContract
}

// StepContract is one step's declared contract.
type StepContract struct {
	Step     string
	Contract Contract
}

// Contract reports the plan's composite contract: the weakest step decides
// (at-least-once below effectively-once; a wider duplicate window, a
// shorter key horizon, no key-reuse detection are weaker), and the report
// names that step and why.
func (p *Plan) Contract() PlanContract {
	pc := PlanContract{Contract: p.steps[0].contract, Weakest: p.steps[0].name}
	for _, s := range p.steps {
		pc.Steps = append(pc.Steps, StepContract{Step: s.name, Contract: s.contract})
		if s.contract.Weaker(pc.Contract) {
			pc.Contract, pc.Weakest = s.contract, s.name
		}
	}
	c := pc.Contract
	switch {
	case c.Guarantee == AtLeastOnce:
		pc.Why = fmt.Sprintf("step %q is at-least-once: duplicates %s (%s)", pc.Weakest, c.DuplicateWindow.Trigger, c.DuplicateWindow.Between)
	case c.Horizon > 0:
		pc.Why = fmt.Sprintf("every step is effectively-once, but step %q remembers keys only %s (%s): a redelivery after that applies again", pc.Weakest, c.Horizon, c.Enforcer)
	default:
		pc.Why = fmt.Sprintf("every step is effectively-once for as long as keys are kept; step %q (%s) is the weakest", pc.Weakest, c.Enforcer)
	}
	return pc
}
