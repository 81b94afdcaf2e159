package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
)

// PlanRunner is what the plan suite ([RunPlan]) holds to its declared
// composite contract: an [*effects.Plan] is one, and so is a handler built
// on several effects that declares its steps' contracts.
type PlanRunner[E any] interface {
	// Contract declares every step's contract and names the weakest.
	Contract() effects.PlanContract
	// Run does every step for the event ev whose identity is id, stopping
	// at the first failure; it returns the results of the steps that
	// completed, by step name.
	Run(ctx context.Context, id string, ev E) (effects.Results, error)
}

// PlanHarness connects the plan suite ([RunPlan]) to a composed plan (or a
// handler built on several effects) and the backends of its steps.
type PlanHarness[E any] interface {
	// Make builds a new instance of the plan, as a process would at
	// start-up, with every connection of a step's effect going through
	// f.Step(name) for that step's name (its journal's too, when the
	// effect has one: give each step a journal of its own over the shared
	// backend). The close function releases the instance; the suite calls
	// it before it runs an event again on a new instance (a successor
	// process). Round trips that Make makes itself are not swept.
	Make(ctx context.Context, f *PlanFaults) (PlanRunner[E], func(), error)
	// Event returns the event whose identity is id: the same id gives the
	// same event.
	Event(id string) E
	// Count returns how many times the effect of step for the event id is
	// visible in that step's backend itself (rows, charges, objects
	// versions, messages received), never from the adapter's bookkeeping.
	Count(ctx context.Context, step, id string) (int, error)
}

// PlanFaults holds one [Faults] per step of a plan, so that the suite can
// fault each step's round trips in turn. A zero PlanFaults is not usable;
// the suite makes them.
type PlanFaults struct {
	mu    sync.Mutex
	steps map[string]*Faults
}

func newPlanFaults() *PlanFaults { return &PlanFaults{steps: map[string]*Faults{}} }

// Step returns the Faults that the step named name connects through (made
// on first use).
func (p *PlanFaults) Step(name string) *Faults {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.steps[name]
	if f == nil {
		f = new(Faults)
		p.steps[name] = f
	}
	return f
}

// Sever severs every step's Faults: the process died.
func (p *PlanFaults) Sever() {
	p.mu.Lock()
	all := make([]*Faults, 0, len(p.steps))
	for _, f := range p.steps {
		all = append(all, f)
	}
	p.mu.Unlock()
	for _, f := range all {
		f.Sever()
	}
}

// trips returns the round trips each step's Faults has seen.
func (p *PlanFaults) trips() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.steps))
	for name, f := range p.steps {
		out[name] = f.RoundTrips()
	}
	return out
}

func planTable[E any]() []scenario[PlanHarness[E]] {
	type s = pscene[E]
	p := func(name, doc string, verifies, options, proofs []string, fn func(*s)) scenario[PlanHarness[E]] {
		return rec(suitePlan, name, doc, nil, verifies, options, proofs, pscenario(fn))
	}
	steps, sweep := list(FieldSteps), list("WithMaxSweep")
	return []scenario[PlanHarness[E]]{
		p(PlanDeclared, "Contract() names the weakest step, and a run does exactly the declared steps",
			list(FieldPlanContract), nil, list("MisnamedWeakest"), (*s).declared),
		p(PlanRedelivery, "the event run three times more and once on a new instance",
			steps, nil, nil, (*s).redelivery),
		p(PlanLostReply, "each round trip of each step in turn loses its reply; the event is retried on the same instance",
			steps, sweep, list("SwallowingHandler", "OverclaimingHandler"), func(s *s) { s.sweep(planLost) }),
		p(PlanCancel, "each round trip of each step in turn has the run's context cancelled once its request was sent; retried on the same instance",
			steps, sweep, list("SwallowingHandler"), func(s *s) { s.sweep(planCancel) }),
		p(PlanKill, "each round trip of each step in turn is the instance's last (connections cut, context cancelled); a successor runs the event",
			steps, sweep, list("SwallowingHandler"), func(s *s) { s.sweep(planKill) }),
		p(PlanCut, "each round trip of each step in turn never reaches its backend (the request cut); the event is retried on the same instance",
			steps, sweep, list("SkipTransientStep"), func(s *s) { s.sweep(planCut) }),
		p(PlanDistinctIDs, "events whose ids differ only in case, normalization, width or an invisible rune, each pair in both orders: every step done once for each",
			steps, nil, list("CaseFoldIDs"), (*s).distinctIDs),
		rec(suitePlan, PlanHorizon, "age every step's backend to just inside the plan's declared horizon (400 days for 0) and run the event again: every step replays; no step declares a shorter horizon than the plan",
			[]capability{capAger}, list(FieldPlanContract, FieldSteps), nil, list("ForgetfulStep"), pscenario((*s).horizon)),
	}
}

// RunPlan holds a composed plan (or a handler built on several effects)
// to the composite contract it declares, as a subtest of t per scenario
// ([PlanScenarios]):
//
//   - plan-contract: Contract() names the weakest step (no step's
//     contract is weaker than the plan's), and a run does exactly the
//     declared steps;
//   - redelivery: the event run three times more and once on a new
//     instance;
//   - lost-reply: each round trip of each step in turn loses its reply,
//     and the event is retried on the same instance;
//   - cancel-mid-plan: each round trip of each step in turn has the run's
//     context cancelled once its request was sent, and the event is
//     retried on the same instance;
//   - kill-mid-plan: each round trip of each step in turn is the last the
//     instance makes (every connection of every step cut, its context
//     cancelled), and a successor instance runs the event.
//
// After every run the suite counts each step's effects in its backend: an
// effectively-once step exactly once, an at-least-once step more than
// once only when the declared window covers it (after an unknown outcome:
// only the step whose round trip was faulted), no step skipped (a run that
// returned no error has a result for, and an effect of, every step), and
// an error must be retryable. Every failed check fails t. The report is
// returned and, with CONFORMANCE_REPORT set, written for the matrix.
// mk returns a fresh harness for each scenario, cleaning up with
// t.Cleanup; a backend that cannot be had fails t.
func RunPlan[E any](t *testing.T, name string, mk func(t testing.TB) PlanHarness[E], opts ...PlanOption) Report {
	t.Helper()
	return runSuite(t, suitePlan, name, planTable[E](), mk, configure("conformance.RunPlan", opts, PlanOption.planOption))
}

// pscene is one plan scenario's run.
type pscene[E any] struct {
	*checker
	h  PlanHarness[E]
	pc effects.PlanContract
}

// pinst is one instance of the plan: a process, to the suite.
type pinst[E any] struct {
	r     PlanRunner[E]
	close func()
	f     *PlanFaults
	base  map[string]int
	done  bool
}

func (i *pinst[E]) Close() {
	if !i.done {
		i.done = true
		i.close()
	}
}

// pscenario adapts a plan scenario to the table: it learns the declared
// contract from a first instance and refuses an invalid one.
func pscenario[E any](fn func(s *pscene[E])) func(c *checker, h PlanHarness[E]) {
	return func(c *checker, h PlanHarness[E]) {
		s := &pscene[E]{checker: c, h: h}
		inst := s.open()
		s.pc = inst.r.Contract()
		inst.Close()
		if len(s.pc.Steps) == 0 {
			s.fatalf("Contract() declares no step")
		}
		seen := map[string]bool{}
		for _, st := range s.pc.Steps {
			if st.Step == "" || seen[st.Step] {
				s.fatalf("Contract() declares a step with an empty or repeated name %q", st.Step)
			}
			seen[st.Step] = true
			if err := st.Contract.Validate(); err != nil {
				s.fatalf("step %q declares an invalid contract: %v", st.Step, err)
			}
		}
		fn(s)
	}
}

func (s *pscene[E]) open() *pinst[E] {
	f := newPlanFaults()
	r, closeFn, err := s.h.Make(s.ctx, f)
	if err != nil {
		s.t.Fatalf("conformance: harness Make: %v", err)
	}
	if r == nil {
		s.t.Fatalf("conformance: harness Make returned a nil plan")
	}
	if closeFn == nil {
		closeFn = func() {}
	}
	i := &pinst[E]{r: r, close: closeFn, f: f, base: f.trips()}
	s.t.Cleanup(i.Close)
	return i
}

// id returns an event id unique to this scenario run.
func (s *pscene[E]) id(parts ...string) string {
	return "conformance-" + s.run + "-" + strings.Join(parts, "-")
}

// runOnce runs the event id once on inst, bounded by the apply timeout.
func (s *pscene[E]) runOnce(ctx context.Context, inst *pinst[E], id, what string) (effects.Results, error) {
	return timed(s.checker, nil, 0, fmt.Sprintf("Run(%q) in %s", id, what), func(cctx context.Context) (effects.Results, error) {
		if ctx != s.ctx {
			var stop context.CancelFunc
			cctx, stop = mergeCancel(cctx, ctx)
			defer stop()
		}
		return inst.r.Run(cctx, id, s.h.Event(id))
	})
}

// runUntilDone runs id until it succeeds, retrying errors that
// effects.ClassOf calls Retryable, with backoff for up to the retry bound.
func (s *pscene[E]) runUntilDone(inst *pinst[E], id, what string) (effects.Results, error) {
	deadline := time.Now().Add(s.cfg.retryFor)
	b := retry.Backoff{Min: 5 * time.Millisecond, Max: 250 * time.Millisecond}
	for attempt := 1; ; attempt++ {
		res, err := s.runOnce(s.ctx, inst, id, what)
		if err == nil || effects.ClassOf(err) != effects.Retryable || s.ctx.Err() != nil || time.Now().After(deadline) {
			return res, err
		}
		if retry.Sleep(s.ctx, b.Delay(attempt)) != nil {
			return res, err
		}
	}
}

// mustRun runs id until done and fails the scenario if it cannot.
func (s *pscene[E]) mustRun(inst *pinst[E], id, what string) effects.Results {
	res, err := s.runUntilDone(inst, id, what)
	if err != nil {
		s.fatalf("%s: Run: %v", what, err)
	}
	s.complete(res, what)
	return res
}

// complete checks that a run that returned no error has a result for
// every declared step and none for a step it did not declare.
func (s *pscene[E]) complete(res effects.Results, what string) {
	for _, st := range s.pc.Steps {
		_, ok := res[st.Step]
		s.check(ok, "%s: Run returned no error but has no result for step %q: the step was skipped", what, st.Step)
	}
	for name := range res {
		s.check(s.isStep(name), "%s: Run returned a result for step %q, which Contract() does not declare", what, name)
	}
}

func (s *pscene[E]) isStep(name string) bool {
	for _, st := range s.pc.Steps {
		if st.Step == name {
			return true
		}
	}
	return false
}

// counts counts every step's effects for id and judges each against its
// step's contract: the step faulted (if any) may have had an unknown
// outcome, no other step. done says the event's run has succeeded, so
// every step must show its effect.
func (s *pscene[E]) counts(id, faulted string, done bool, what string) {
	for _, st := range s.pc.Steps {
		n, err := s.h.Count(s.ctx, st.Step, id)
		if err != nil {
			s.fatalf("%s: harness Count(%q): %v", what, st.Step, err)
		}
		s.row.observe(n)
		w := fmt.Sprintf("%s: step %q", what, st.Step)
		s.check(!(done && n == 0), "%s: 0 effects in its backend after the plan succeeded: the step was skipped", w)
		class := cleanRepeat
		if st.Step == faulted {
			class = unknownOutcome
		}
		switch {
		case st.Contract.Guarantee == effects.EffectivelyOnce:
			s.check(n <= 1, "%s: %d effects for one event, its contract says effectively-once", w, n)
		default:
			s.check(n <= 1 || covers(st.Contract.DuplicateWindow.Trigger, class),
				"%s: %d effects for one event without an unknown outcome in that step, outside its declared window (%s)", w, n, st.Contract.DuplicateWindow.Trigger)
		}
	}
}

// replayed checks that a run of an event done before replayed every step
// whose contract records keys, with the first run's refs.
func (s *pscene[E]) replayed(first, res effects.Results, what string) {
	for _, st := range s.pc.Steps {
		c := st.Contract
		if c.Guarantee != effects.EffectivelyOnce && c.DuplicateWindow.Trigger == effects.AnyRedelivery {
			continue // nothing records the first run: a repeat may apply again
		}
		r := res[st.Step]
		s.check(r.Status == effects.Replayed, "%s: step %q returned %s, want replayed", what, st.Step, r.Status)
		s.check(r.Ref == first[st.Step].Ref, "%s: step %q ref %q, want the first run's %q", what, st.Step, r.Ref, first[st.Step].Ref)
	}
}

// declared checks that Contract() names the weakest step, then runs one
// event and checks that it did exactly the declared steps.
func (s *pscene[E]) declared() {
	pc := s.pc
	weakest := -1
	for i, st := range pc.Steps {
		if st.Step == pc.Weakest {
			weakest = i
		}
		s.check(!st.Contract.Weaker(pc.Contract), "Contract() says the plan is %s (step %q), but step %q is weaker: %s",
			pc.Contract.Guarantee, pc.Weakest, st.Step, st.Contract)
	}
	if s.check(weakest >= 0, "Contract() names %q the weakest step, which it does not declare", pc.Weakest) {
		s.check(pc.Steps[weakest].Contract == pc.Contract, "Contract() is %s, but the step it names weakest (%q) declares %s",
			pc.Contract, pc.Weakest, pc.Steps[weakest].Contract)
	}
	s.notef("%d steps; weakest %q: %s", len(pc.Steps), pc.Weakest, pc.Contract.Guarantee)
	inst := s.open()
	id := s.id("declared")
	s.mustRun(inst, id, "a first run")
	inst.Close()
	s.counts(id, "", true, "a first run")
}

// redelivery runs an event, runs it again three times on the same
// instance and once on a new one.
func (s *pscene[E]) redelivery() {
	inst := s.open()
	id := s.id("redelivery")
	first := s.mustRun(inst, id, "the first run")
	s.counts(id, "", true, "the first run")
	for i := 1; i <= 3; i++ {
		what := fmt.Sprintf("redelivery %d", i)
		res := s.mustRun(inst, id, what)
		s.replayed(first, res, what)
	}
	inst.Close()
	next := s.open()
	res := s.mustRun(next, id, "a redelivery to a new instance")
	next.Close()
	s.replayed(first, res, "a redelivery to a new instance")
	s.counts(id, "", true, "after four redeliveries")
}

// planFault is what a sweep does at the round trip it faults.
type planFault int

const (
	planLost   planFault = iota // the reply is lost; retried on the same instance
	planCancel                  // the run's context is cancelled once the request was sent; retried on the same instance
	planKill                    // the instance dies once the request was sent; a successor runs the event
	planCut                     // the request never reaches the step's backend; retried on the same instance
)

func (k planFault) String() string {
	return [...]string{"lost reply", "cancel after send", "kill after send", "cut request"}[k]
}

// sweep counts each step's round trips in a clean run, then faults each
// in turn, in a subtest per round trip (<step>-trip-NN).
func (s *pscene[E]) sweep(kind planFault) {
	inst := s.open()
	id := s.id("clean")
	s.mustRun(inst, id, "the clean run that counts round trips")
	trips := inst.f.trips()
	inst.Close()
	s.counts(id, "", true, "the clean run")
	left, swept := 0, 0
	var killed []*zombie
	defer func() { s.bury(killed) }()
	for _, st := range s.pc.Steps {
		n := trips[st.Step] - inst.base[st.Step]
		if !s.check(n > 0, "step %q made no round trip through f.Step(%q) after Make returned: its faults cannot be swept; "+
			"wire its effect's connections (and its journal's) through that Faults", st.Step, st.Step) {
			continue
		}
		if n > s.cfg.maxSweep {
			s.notef("step %q takes %d round trips; swept the first %d", st.Step, n, s.cfg.maxSweep)
			n = s.cfg.maxSweep
		}
		swept += n
		for trip := 1; trip <= n; trip++ {
			ran := s.sub(fmt.Sprintf("%s-trip-%02d", unsafeName.ReplaceAllString(st.Step, "_"), trip), func(c *checker) {
				ps := &pscene[E]{checker: c, h: s.h, pc: s.pc}
				if z := ps.faultAt(kind, st.Step, trip); z != nil {
					killed = append(killed, z)
				}
			})
			if !ran {
				left++
			}
		}
	}
	s.notef("%s at each of the %d round trips of the steps of a clean run", kind, swept)
	if left > 0 {
		s.skip(notSelectedRun+": %d of %d faulted runs left out, the sweep is incomplete", left, swept)
	}
}

// zombie is the run of a killed instance: its process is dead (every
// connection cut, its context cancelled), but the goroutine may still be
// returning, on its own time (an adapter retrying its journal record for
// seconds against cut connections). The suite does not wait for it before
// the successor runs: a dead process holds nothing up.
type zombie struct {
	what string
	out  chan runResult
	inst interface{ Close() }
}

type runResult struct {
	res effects.Results
	err error
}

// bury waits for the runs of killed instances, which must return within
// the apply timeout, and checks what they returned: a run whose step
// failed must not return nil.
func (s *pscene[E]) bury(killed []*zombie) {
	s.t.Helper()
	limit := time.NewTimer(s.cfg.applyTimeout + hangGrace)
	defer limit.Stop()
	for _, z := range killed {
		select {
		case r := <-z.out:
			z.inst.Close()
			if r.err == nil {
				s.complete(r.res, z.what+": the killed run")
			}
		case <-limit.C:
			s.failf("hang: %s: the killed run did not return within %v after its connections were cut and its context cancelled", z.what, s.cfg.applyTimeout+hangGrace)
			return
		}
	}
}

// faultAt runs a new event on a new instance with kind at round trip trip
// of step, then holds the outcome and the retry to every step's contract.
// For a kill it returns the killed run, if it had not returned.
func (s *pscene[E]) faultAt(kind planFault, step string, trip int) *zombie {
	inst := s.open()
	id := s.id(strings.ReplaceAll(kind.String(), " ", "-"), step, fmt.Sprint(trip))
	what := fmt.Sprintf("%s at round trip %d of step %q", kind, trip, step)
	f := inst.f.Step(step)
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	at := inst.base[step] + trip
	switch kind {
	case planLost:
		f.Arm(at, DropReply, nil)
	case planCancel:
		f.Arm(at, CancelAfterSend, cancel)
	case planCut:
		f.Arm(at, CutRequest, nil)
	case planKill:
		return s.kill(ctx, cancel, inst, step, at, id, what)
	}
	res, err := s.runOnce(ctx, inst, id, what)
	fired := f.Fired()
	f.Disarm()
	faulted := s.fired(fired, step, what)
	s.judgeFaulted(res, err, id, faulted, what)
	s.mustRun(inst, id, what+", retried on the same instance")
	inst.Close()
	s.counts(id, faulted, true, what+", retried on the same instance")
	return nil
}

// fired notes a fault that did not fire and returns the step whose
// outcome it may have left unknown ("" if none).
func (s *pscene[E]) fired(fired bool, step, what string) string {
	if !fired {
		s.notef("%s: did not fire (the run took fewer round trips)", what)
		return ""
	}
	return step
}

// kill runs id on inst until the armed round trip of step has sent its
// request, then kills the instance (every connection of every step cut,
// the run's context cancelled) and runs id on a successor.
func (s *pscene[E]) kill(ctx context.Context, cancel context.CancelFunc, inst *pinst[E], step string, at int, id, what string) *zombie {
	f := inst.f.Step(step)
	dead := make(chan struct{})
	f.Arm(at, CancelAfterSend, func() { inst.f.Sever(); cancel(); close(dead) })
	ev := s.h.Event(id)
	out := make(chan runResult, 1)
	go func() {
		res, err := inst.r.Run(ctx, id, ev)
		out <- runResult{res, err}
	}()
	limit := time.NewTimer(s.cfg.applyTimeout)
	defer limit.Stop()
	var z *zombie
	faulted := step
	select {
	case r := <-out: // it ended before the kill: an ordinary run
		faulted = s.fired(f.Fired(), step, what)
		s.judgeFaulted(r.res, r.err, id, faulted, what)
		inst.Close()
	case <-dead:
		z = &zombie{what: what, out: out, inst: inst}
	case <-limit.C:
		inst.f.Sever()
		s.fatalf("hang: Run(%q) in %s did not return within %v", id, what, s.cfg.applyTimeout)
	}
	again := what + ", run by a successor instance"
	next := s.open()
	s.mustRun(next, id, again)
	next.Close()
	s.counts(id, faulted, true, again)
	return z
}

// judgeFaulted holds the outcome of a faulted run to the contracts.
func (s *pscene[E]) judgeFaulted(res effects.Results, err error, id, faulted, what string) {
	switch {
	case err == nil:
		s.complete(res, what+": the faulted run")
		s.counts(id, faulted, true, what+": after the faulted run returned no error")
	case effects.ClassOf(err) != effects.Retryable:
		s.failf("%s: Run returned an error that is not retryable (effects.ClassOf), so a consumer would give up on an event whose steps may have been applied: %v", what, err)
	case errors.Is(err, effects.ErrTransient):
		s.counts(id, "", false, what+": after ErrTransient, which promises that the failing step applied nothing")
		var se *effects.StepError
		if errors.As(err, &se) {
			n, cerr := s.h.Count(s.ctx, se.Step, id)
			s.check(cerr == nil && n == 0, "%s: step %q returned ErrTransient but shows %d effects (%v)", what, se.Step, n, cerr)
		}
	default:
		s.counts(id, faulted, false, what+": after the faulted run")
	}
}
