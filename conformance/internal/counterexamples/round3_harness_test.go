package counterexamples_test

import (
	"context"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/conformance/internal/counterexamples"
	"effectively.dev/effects"
	"effectively.dev/effects/journal"
)

// tripJournalHarness opens instances over one AsyncBackend, every call of
// an instance a round trip of its Faults; wrap makes the instance under
// test (the honest one: nil). It can crash the backend.
type tripJournalHarness struct {
	b    *counterexamples.AsyncBackend
	wrap func(b *counterexamples.AsyncBackend, trip func(context.Context, func() error) error) journal.Journal
}

var _ conformance.CrashRestarter = (*tripJournalHarness)(nil)

func (h *tripJournalHarness) Open(_ context.Context, f *conformance.Faults) (journal.Journal, func(), error) {
	if h.wrap == nil {
		return h.b.Sync(f.RoundTrip), nil, nil
	}
	return h.wrap(h.b, f.RoundTrip), nil, nil
}

func (h *tripJournalHarness) CrashRestart(ctx context.Context) error { return h.b.CrashRestart(ctx) }

func tripJournalMaker(wrap func(*counterexamples.AsyncBackend, func(context.Context, func() error) error) journal.Journal) func(testing.TB) conformance.JournalHarness {
	return func(testing.TB) conformance.JournalHarness {
		return &tripJournalHarness{b: counterexamples.NewAsyncBackend(), wrap: wrap}
	}
}

// The journal liars of round 3, as the harness builds them.
var round3Journals = []struct {
	name string
	wrap func(*counterexamples.AsyncBackend, func(context.Context, func() error) error) journal.Journal
}{
	{"swallowed-complete", func(b *counterexamples.AsyncBackend, trip func(context.Context, func() error) error) journal.Journal {
		return counterexamples.SwallowedComplete{TripJournal: b.Sync(trip)}
	}},
	{"cached-attempt", func(b *counterexamples.AsyncBackend, trip func(context.Context, func() error) error) journal.Journal {
		return counterexamples.NewCachedAttempt(b.Sync(trip))
	}},
	{"async-complete", func(b *counterexamples.AsyncBackend, trip func(context.Context, func() error) error) journal.Journal {
		return counterexamples.NewAsyncComplete(b, trip)
	}},
}

// agingPlanHarness runs plans of AgingSteps over one AgingStore; build
// wraps the honest plan into what is under test. It can age the store.
type agingPlanHarness struct {
	store  *counterexamples.AgingStore
	forget bool // the receipt step forgets keys after a day
	build  func(p *effects.Plan[counterexamples.PlanEvent], steps []counterexamples.AgingStep) conformance.PlanRunner[counterexamples.PlanEvent]
}

func (h *agingPlanHarness) Make(_ context.Context, f *conformance.PlanFaults) (conformance.PlanRunner[counterexamples.PlanEvent], func(), error) {
	steps := []counterexamples.AgingStep{
		{Step: "ledger", Store: h.store, Trip: f.Step("ledger").RoundTrip},
		{Step: "receipt", Store: h.store, Trip: f.Step("receipt").RoundTrip},
	}
	if h.forget {
		steps[1].Forget = counterexamples.ForgetfulStepAfter
	}
	p, err := counterexamples.NewAgingPlan("r3-plan", steps...)
	if err != nil {
		return nil, nil, err
	}
	return h.build(p, steps), nil, nil
}

func (h *agingPlanHarness) Event(id string) counterexamples.PlanEvent {
	return counterexamples.PlanEvent{ID: id}
}

func (h *agingPlanHarness) Count(_ context.Context, step, id string) (int, error) {
	return h.store.Count(step, id), nil
}

// Age ages every step's records.
func (h *agingPlanHarness) Age(_ context.Context, d time.Duration) error {
	h.store.Age(d)
	return nil
}

type planBuild = func(*effects.Plan[counterexamples.PlanEvent], []counterexamples.AgingStep) conformance.PlanRunner[counterexamples.PlanEvent]

func agingPlanMaker(forget bool, build planBuild) func(testing.TB) conformance.PlanHarness[counterexamples.PlanEvent] {
	return func(testing.TB) conformance.PlanHarness[counterexamples.PlanEvent] {
		return &agingPlanHarness{store: counterexamples.NewAgingStore(), forget: forget, build: build}
	}
}

func honestPlan(p *effects.Plan[counterexamples.PlanEvent], _ []counterexamples.AgingStep) conformance.PlanRunner[counterexamples.PlanEvent] {
	return p
}

// The plan liars of round 3, as the harness builds them.
var round3Plans = []struct {
	name   string
	forget bool
	build  planBuild
}{
	{"case-fold-ids", false, func(p *effects.Plan[counterexamples.PlanEvent], _ []counterexamples.AgingStep) conformance.PlanRunner[counterexamples.PlanEvent] {
		return counterexamples.CaseFoldIDs{Plan: p}
	}},
	{"skip-transient-step", false, func(p *effects.Plan[counterexamples.PlanEvent], steps []counterexamples.AgingStep) conformance.PlanRunner[counterexamples.PlanEvent] {
		return counterexamples.SkipTransientStep{Plan: p, Scope: "r3-plan", Steps: steps}
	}},
	{"forgetful-step", true, honestPlan},
}
