package counterexamples_test

import (
	"context"
	"slices"
	"testing"

	"effectively.dev/conformance"
	"effectively.dev/conformance/internal/counterexamples"
	"effectively.dev/effects"
)

// memPlanHarness runs a plan of MemSteps over one Store shared by every
// instance; build wraps the honest plan into what is under test.
type memPlanHarness struct {
	store *counterexamples.Store
	build func(p *effects.Plan[counterexamples.PlanEvent], steps []counterexamples.MemStep) conformance.PlanRunner[counterexamples.PlanEvent]
}

// memSteps are the steps of the plans under test: two effectively-once
// steps around an at-least-once one.
var memSteps = []struct {
	name string
	once bool
}{{"ledger", true}, {"mail", false}, {"receipt", true}}

func (h *memPlanHarness) Make(_ context.Context, f *conformance.PlanFaults) (conformance.PlanRunner[counterexamples.PlanEvent], func(), error) {
	steps := make([]counterexamples.MemStep, len(memSteps))
	for i, s := range memSteps {
		steps[i] = counterexamples.MemStep{Step: s.name, Once: s.once, Store: h.store, Trip: f.Step(s.name).RoundTrip}
	}
	p, err := counterexamples.NewMemPlan("cx-plan", steps...)
	if err != nil {
		return nil, nil, err
	}
	return h.build(p, steps), nil, nil
}

func (h *memPlanHarness) Event(id string) counterexamples.PlanEvent {
	return counterexamples.PlanEvent{ID: id}
}

func (h *memPlanHarness) Count(_ context.Context, step, id string) (int, error) {
	return h.store.Count(step, id), nil
}

func memPlanMaker(build func(*effects.Plan[counterexamples.PlanEvent], []counterexamples.MemStep) conformance.PlanRunner[counterexamples.PlanEvent]) func(testing.TB) conformance.PlanHarness[counterexamples.PlanEvent] {
	return func(testing.TB) conformance.PlanHarness[counterexamples.PlanEvent] {
		return &memPlanHarness{store: counterexamples.NewStore(), build: build}
	}
}

// TestRunPlanPassesAnHonestPlan is the control: the same steps composed
// by effects.Plan pass every scenario, so the failures below are the lies'.
func TestRunPlanPassesAnHonestPlan(t *testing.T) {
	rep := conformance.RunPlan(t, "honest mem plan", memPlanMaker(func(p *effects.Plan[counterexamples.PlanEvent], _ []counterexamples.MemStep) conformance.PlanRunner[counterexamples.PlanEvent] {
		return p
	}), conformance.AllowUnverified("the Store has no clock to age (TestRound3JournalsAndPlansCaught runs the horizon on an AgingStore)", conformance.PlanHorizon))
	for _, row := range rep.Rows {
		if row.Verdict != conformance.Pass && row.Scenario != conformance.PlanHorizon {
			t.Errorf("%s: %s, want pass (%s)", row.Scenario, row.Verdict, row.Skipped)
		}
	}
}

// TestRunPlanCatchesCounterexamples is RunPlan's proof: each handler that
// lies about its composition fails the scenarios named for it.
func TestRunPlanCatchesCounterexamples(t *testing.T) {
	cases := []struct {
		name   string
		build  func(*effects.Plan[counterexamples.PlanEvent], []counterexamples.MemStep) conformance.PlanRunner[counterexamples.PlanEvent]
		caught []string
	}{
		{"a handler that swallows a step's error", func(p *effects.Plan[counterexamples.PlanEvent], steps []counterexamples.MemStep) conformance.PlanRunner[counterexamples.PlanEvent] {
			return counterexamples.SwallowingHandler{Plan: p, Steps: steps, Logged: func(error) {}}
		}, []string{conformance.PlanLostReply, conformance.PlanCancel, conformance.PlanKill}},
		{"a handler that declares an at-least-once step effectively-once", func(p *effects.Plan[counterexamples.PlanEvent], _ []counterexamples.MemStep) conformance.PlanRunner[counterexamples.PlanEvent] {
			return counterexamples.OverclaimingHandler{Plan: p, Step: "mail"}
		}, []string{conformance.PlanLostReply}},
		{"a plan contract that names the strongest step the weakest", func(p *effects.Plan[counterexamples.PlanEvent], _ []counterexamples.MemStep) conformance.PlanRunner[counterexamples.PlanEvent] {
			return counterexamples.MisnamedWeakest{Plan: p}
		}, []string{conformance.PlanDeclared}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep := conformance.RunPlan(t, tc.name, memPlanMaker(tc.build), conformance.Only(tc.caught...), conformance.ReportOnly())
			failed := rep.Failed()
			for _, sc := range tc.caught {
				if !slices.Contains(failed, sc) {
					t.Errorf("the suite did not catch %s in %s (failed: %v)", tc.name, sc, failed)
				}
			}
		})
	}
}
