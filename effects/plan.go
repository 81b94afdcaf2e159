package effects

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Step is one effect of a [Plan] over events of type E, under a name. The
// name is part of the step's key, so it must stay the same across
// deployments for as long as messages may be redelivered. Build steps with
// [NewStep] or [EventStep]; the zero Step is refused by [NewPlan].
type Step[E any] struct {
	name       string
	contract   Contract
	concurrent bool
	apply      func(ctx context.Context, key Key, ev E, done Results) (Result, error)
	check      Checker // eff, when it is one
}

// NewStep makes a step that applies eff to the input that input builds
// from the event and from the results of the steps before it (done, by
// step name): a later step can use an earlier step's reference, such as
// the PaymentIntent id a receipt mentions. On a redelivery the earlier
// steps replay with their recorded references, so the input is rebuilt
// from the same values, not recomputed from new ones.
//
// input must be a pure function of its arguments: it runs on every
// delivery, and a payload that differs between deliveries of one event is
// key reuse ([ErrKeyReused]) for an adapter that detects it, or a
// different effect for one that does not. An error from input fails the
// step before its effect runs (a *[StepError] wrapping it, retryable only
// if input's own error is: the same event builds the same input).
//
// eff's contract is read once, here. A nil eff or input makes a step that
// [NewPlan] refuses.
func NewStep[E, In any](name string, eff Effect[In], input func(ev E, done Results) (In, error)) Step[E] {
	if eff == nil || input == nil {
		return Step[E]{name: name}
	}
	check, _ := any(eff).(Checker)
	return Step[E]{
		name:     name,
		contract: eff.Contract(),
		check:    check,
		apply: func(ctx context.Context, key Key, ev E, done Results) (Result, error) {
			in, err := input(ev, done)
			if err != nil {
				return Result{}, fmt.Errorf("building the input: %w", err)
			}
			return eff.Apply(ctx, key, in)
		},
	}
}

// EventStep makes a step that applies eff to the event itself: [NewStep]
// with the input func(ev E, _ Results) (E, error) { return ev, nil }.
func EventStep[E any](name string, eff Effect[E]) Step[E] {
	return NewStep(name, eff, func(ev E, _ Results) (E, error) { return ev, nil })
}

// run applies the step, recovering a panic as a *PanicError.
func (s Step[E]) run(ctx context.Context, key Key, ev E, done Results) (res Result, err error) {
	defer Recover(fmt.Sprintf("plan step %q", s.name), &err)
	return s.apply(ctx, key, ev, done)
}

// Name returns the step's name.
func (s Step[E]) Name() string { return s.name }

// Concurrent returns a copy of s that runs at the same time as the
// concurrent steps next to it in its plan. Consecutive concurrent steps form
// a group: the group starts once every step before it completed, each of its
// steps' inputs sees the results of the steps before the group (never of
// another step in the group), and the steps after the group start once all
// of it completed. Use it for effects that need only earlier results, not
// each other (a receipt, an event and an email that each need the charge's
// id): the plan then takes as long as the slowest of them, not their sum.
// Keys and the composite contract stay as they are; when steps of a group
// fail, Run waits for the whole group and returns the first failure in plan
// order.
func (s Step[E]) Concurrent() Step[E] {
	s.concurrent = true
	return s
}

// Contract returns the contract of the step's effect.
func (s Step[E]) Contract() Contract { return s.contract }

// Results holds the results of a plan's completed steps, by step name.
type Results map[string]Result

// Plan is a reusable definition of the effects one event causes: steps of
// different kinds, each a function of the event (and of the steps before
// it), run in order by [Plan.Run] (independent ones at the same time, see
// [Step.Concurrent]) under keys derived from the event's id and the step's
// name: NewKey(scope, id, step). Build it once at start-up with
// [NewPlan] and run it for every delivery; its composite contract
// ([Plan.Contract]) is known before the first event arrives, to print or to
// assert.
//
// Run stops at the first failing step: the message is not acked, the
// broker redelivers it, and the redelivery runs the plan again, the
// completed steps replaying instead of repeating. A plan promises no more
// than its weakest step.
//
// A Plan is immutable and safe for concurrent use: any number of
// deliveries may run it at once.
type Plan[E any] struct {
	scope string
	steps []Step[E]
	obs   Observer
}

// NewPlan returns a plan running steps in order under scope. It refuses,
// with a *[ConfigError], an empty scope, no steps, a step without a name or
// built with a nil effect or input, repeated step names, and steps whose
// contracts are invalid. Nothing runs until [Plan.Run].
func NewPlan[E any](scope string, steps ...Step[E]) (*Plan[E], error) {
	const op = "effects.NewPlan"
	if scope == "" {
		return nil, &ConfigError{Op: op, Option: "scope", Reason: "empty: every key of the plan starts with it"}
	}
	if len(steps) == 0 {
		return nil, &ConfigError{Op: op, Option: "steps", Reason: "none given"}
	}
	seen := make(map[string]bool, len(steps))
	for i, s := range steps {
		arg := fmt.Sprintf("steps[%d]", i)
		switch {
		case s.name == "":
			return nil, &ConfigError{Op: op, Option: arg, Reason: "no name (the name is part of the step's key)"}
		case s.apply == nil:
			return nil, &ConfigError{Op: op, Option: arg, Reason: fmt.Sprintf("step %q has a nil effect or input (build steps with NewStep or EventStep)", s.name)}
		case seen[s.name]:
			return nil, &ConfigError{Op: op, Option: arg, Reason: fmt.Sprintf("step name %q repeated: each step needs its own key", s.name)}
		}
		if err := s.contract.Validate(); err != nil {
			return nil, &ConfigError{Op: op, Option: arg, Reason: fmt.Sprintf("step %q: %v", s.name, err)}
		}
		seen[s.name] = true
	}
	return &Plan[E]{scope: scope, steps: append([]Step[E](nil), steps...)}, nil
}

// WithObserver returns a copy of the plan that reports every step's
// outcome to o, with Event.Step set to the step's name; when o is a
// [Tracer], each run is a [SpanPlan] span and each step a [SpanStep] span
// inside it. A nil o observes nothing.
func (p *Plan[E]) WithObserver(o Observer) *Plan[E] {
	q := *p
	q.obs = o
	return &q
}

// Scope returns the scope every key of the plan starts with.
func (p *Plan[E]) Scope() string { return p.scope }

// Key returns the key of the step named step for the event id, as Run
// derives it: NewKey(scope, id, step). Readers use it to find an effect (an
// S3 object, a journal record) that a plan wrote.
func (p *Plan[E]) Key(id, step string) (Key, error) { return NewKey(p.scope, id, step) }

// StepError is the error of a plan's failing step. It unwraps to the step's
// error, so errors.Is and [ClassOf] see through it.
type StepError struct {
	Step string
	Key  Key
	Err  error
}

// Error names the step and its key (when it has one: a [Plan.Check]
// failure has none).
func (e *StepError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("plan step %q: %v", e.Step, e.Err)
	}
	return fmt.Sprintf("plan step %q (key %q): %v", e.Step, e.Key, e.Err)
}

// Unwrap returns the step's error.
func (e *StepError) Unwrap() error { return e.Err }

// Run runs the plan's steps for the event ev whose identity is id (a
// [Delivery]'s ID: stable across redeliveries), in order, and returns the
// results of the steps that completed. On the first failure it stops and
// returns a *[StepError]; retry (or let the broker redeliver) the same id
// and event to resume: completed steps replay.
//
// Every step's key is derived before the first step runs, so an id that
// cannot make keys (an empty one: [ErrInvalidKey]) fails before any
// effect.
//
// A panic in a step, concurrent ones included, is recovered and returned
// as the step's *[PanicError] (permanent): the process and the other
// deliveries go on.
func (p *Plan[E]) Run(ctx context.Context, id string, ev E) (_ Results, err error) {
	if p.obs != nil {
		var end func(Event)
		ctx, end = startSpan(ctx, p.obs, SpanPlan, Event{Component: "plan " + p.scope, DeliveryID: id})
		start := time.Now()
		defer func() {
			end(Event{Kind: planKind(err), Component: "plan " + p.scope, DeliveryID: id, Duration: time.Since(start), Err: err})
		}()
	}
	keys := make([]Key, len(p.steps))
	for i, s := range p.steps {
		key, err := NewKey(p.scope, id, s.name)
		if err != nil {
			return Results{}, &StepError{Step: s.name, Err: err}
		}
		keys[i] = key
	}
	done := make(Results, len(p.steps))
	for i := 0; i < len(p.steps); {
		n := 1 // the steps that run now: one, or a group of concurrent ones
		for p.steps[i].concurrent && i+n < len(p.steps) && p.steps[i+n].concurrent {
			n++
		}
		if err := p.runGroup(ctx, id, ev, keys[i:i+n], p.steps[i:i+n], done); err != nil {
			return done, err
		}
		i += n
	}
	return done, nil
}

// runGroup applies steps (one, or a group of concurrent ones) under keys,
// adds the results of those that succeeded to done, and returns the first
// failure in plan order. The steps only read done while they run.
func (p *Plan[E]) runGroup(ctx context.Context, id string, ev E, keys []Key, steps []Step[E], done Results) error {
	results := make([]Result, len(steps))
	errs := make([]error, len(steps))
	one := func(i int) {
		if p.obs == nil {
			results[i], errs[i] = steps[i].run(ctx, keys[i], ev, done)
			return
		}
		sctx, end := startSpan(ctx, p.obs, SpanStep, Event{Step: steps[i].name, Key: keys[i], DeliveryID: id})
		start := time.Now()
		results[i], errs[i] = steps[i].run(sctx, keys[i], ev, done)
		out := Event{Kind: resultKind(results[i], errs[i]), Step: steps[i].name, Key: keys[i], DeliveryID: id, Duration: time.Since(start), Err: errs[i]}
		p.obs.Observe(sctx, out)
		end(out)
	}
	if len(steps) == 1 {
		one(0)
	} else {
		// The first step runs on this goroutine, which would only wait.
		var wg sync.WaitGroup
		for i := range steps[1:] {
			wg.Go(func() { one(i + 1) })
		}
		one(0)
		wg.Wait()
	}
	var first error
	for i, s := range steps {
		if errs[i] != nil {
			if first == nil {
				first = &StepError{Step: s.name, Key: keys[i], Err: errs[i]}
			}
			continue
		}
		done[s.name] = results[i]
	}
	return first
}

// PlanContract is what a plan promises as a whole.
type PlanContract struct {
	// Scope is the plan's scope.
	Scope string
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

// String renders the plan's contract for a start-up log: a first line with
// the plan's guarantee and why, then one line per step.
func (pc PlanContract) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "plan %q is %s: %s", pc.Scope, pc.Contract.Guarantee, pc.Why)
	width := 0
	for _, s := range pc.Steps {
		width = max(width, len(s.Step))
	}
	for _, s := range pc.Steps {
		fmt.Fprintf(&b, "\n  %-*s  %s", width, s.Step, s.Contract)
	}
	return b.String()
}

// Contract reports the plan's composite contract: the weakest step decides
// (at-least-once below effectively-once; a wider duplicate window, a
// shorter key horizon, no key-reuse detection are weaker), and the report
// names that step and why. It depends only on the steps, never on an
// event, so it can be printed or asserted at start-up.
func (p *Plan[E]) Contract() PlanContract {
	pc := PlanContract{Scope: p.scope, Contract: p.steps[0].contract, Weakest: p.steps[0].name}
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

// planKind is the outcome kind of a whole run, for its span's end.
func planKind(err error) EventKind {
	if err == nil {
		return EventApplied
	}
	return resultKind(Result{}, err)
}
