package counterexamples_test

import (
	"context"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/conformance/internal/counterexamples"
	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
)

// TestRound3JournalProbes: each journal liar of round 3 shows its lie
// directly, and its honest twin does not.
func TestRound3JournalProbes(t *testing.T) {
	ctx := context.Background()
	fp := []byte("fp")
	cut := func(context.Context, func() error) error { return conformance.ErrInjected }
	t.Run("swallowed-complete", func(t *testing.T) {
		for _, liar := range []bool{true, false} {
			inner := memjournal.New(nil)
			var j journal.DoneJournal = counterexamples.TripJournal{Inner: inner}
			if _, err := j.Begin(ctx, "k", fp, time.Minute); err != nil {
				t.Fatal(err)
			}
			cutJ := counterexamples.TripJournal{Inner: inner, Trip: cut}
			var err error
			if liar {
				err = counterexamples.SwallowedComplete{TripJournal: cutJ}.Complete(ctx, "k", "ref")
			} else {
				err = cutJ.Complete(ctx, "k", "ref")
			}
			rec, _ := j.Lookup(ctx, "k", fp)
			lie := err == nil && !rec.Done
			if lie != liar {
				t.Errorf("liar %v: Complete over a cut request returned %v, and Lookup says done=%v", liar, err, rec.Done)
			}
		}
	})
	t.Run("cached-attempt", func(t *testing.T) {
		for _, liar := range []bool{true, false} {
			var j journal.Journal = counterexamples.TripJournal{Inner: memjournal.New(nil)}
			if liar {
				j = counterexamples.NewCachedAttempt(j.(counterexamples.TripJournal))
			}
			first, err := j.Begin(ctx, "k", fp, 30*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(60 * time.Millisecond)
			again, err := j.Begin(ctx, "k", fp, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if lie := again.Attempt <= first.Attempt; lie != liar {
				t.Errorf("liar %v: the same instance re-took its expired lease as attempt %d after attempt %d", liar, again.Attempt, first.Attempt)
			}
		}
	})
	t.Run("async-complete", func(t *testing.T) {
		for _, liar := range []bool{true, false} {
			b := counterexamples.NewAsyncBackend()
			var j journal.DoneJournal = b.Sync(nil)
			if liar {
				j = counterexamples.NewAsyncComplete(b, nil)
			}
			if _, err := j.Begin(ctx, "k", fp, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := j.Complete(ctx, "k", "ref"); err != nil {
				t.Fatal(err)
			}
			_ = b.CrashRestart(ctx)
			rec, err := j.Lookup(ctx, "k", fp)
			if lie := err == nil && !rec.Done; lie != liar {
				t.Errorf("liar %v: after the last Complete and a crash, Lookup says done=%v (%v)", liar, rec.Done, err)
			}
			// The lie hides behind any later synchronous write.
			b2 := counterexamples.NewAsyncBackend()
			j2 := counterexamples.NewAsyncComplete(b2, nil)
			_, _ = j2.Begin(ctx, "k", fp, time.Minute)
			_ = j2.Complete(ctx, "k", "ref")
			_, _ = j2.Begin(ctx, "other", fp, time.Minute)
			_ = b2.CrashRestart(ctx)
			if rec, _ := j2.Lookup(ctx, "k", fp); !rec.Done {
				t.Errorf("a later synchronous Begin did not make the Complete durable")
			}
		}
	})
}

// TestRound3PlanProbes: each plan liar of round 3 shows its lie directly,
// and the honest plan over the same steps does not.
func TestRound3PlanProbes(t *testing.T) {
	ctx := context.Background()
	steps := func(s *counterexamples.AgingStore, forget bool) []counterexamples.AgingStep {
		out := []counterexamples.AgingStep{{Step: "ledger", Store: s}, {Step: "receipt", Store: s}}
		if forget {
			out[1] = counterexamples.ForgetfulStep("receipt", s)
		}
		return out
	}
	honest := func(s *counterexamples.AgingStore, forget bool) *effects.Plan[counterexamples.PlanEvent] {
		p, err := counterexamples.NewAgingPlan("r3", steps(s, forget)...)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("case-fold-ids", func(t *testing.T) {
		for _, liar := range []bool{true, false} {
			s := counterexamples.NewAgingStore()
			var r conformance.PlanRunner[counterexamples.PlanEvent] = honest(s, false)
			if liar {
				r = counterexamples.CaseFoldIDs{Plan: honest(s, false)}
			}
			for _, id := range []string{"Order-7", "order-7"} {
				if _, err := r.Run(ctx, id, counterexamples.PlanEvent{ID: id}); err != nil {
					t.Fatal(err)
				}
			}
			if lie := s.Count("ledger", "order-7") == 0; lie != liar {
				t.Errorf("liar %v: event order-7 after Order-7: %d ledger effects", liar, s.Count("ledger", "order-7"))
			}
		}
	})
	t.Run("skip-transient-step", func(t *testing.T) {
		for _, liar := range []bool{true, false} {
			s := counterexamples.NewAgingStore()
			st := steps(s, false)
			st[1].Trip = func(context.Context, func() error) error { return conformance.ErrInjected } // its request never arrives
			p, err := counterexamples.NewAgingPlan("r3", st...)
			if err != nil {
				t.Fatal(err)
			}
			var r conformance.PlanRunner[counterexamples.PlanEvent] = p
			if liar {
				r = counterexamples.SkipTransientStep{Plan: p, Scope: "r3", Steps: st}
			}
			_, err = r.Run(ctx, "e1", counterexamples.PlanEvent{ID: "e1"})
			if lie := err == nil && s.Count("receipt", "e1") == 0; lie != liar {
				t.Errorf("liar %v: Run returned %v with %d receipts", liar, err, s.Count("receipt", "e1"))
			}
		}
	})
	t.Run("forgetful-step", func(t *testing.T) {
		for _, liar := range []bool{true, false} {
			s := counterexamples.NewAgingStore()
			p := honest(s, liar)
			if h := p.Contract().Contract.Horizon; h != 0 {
				t.Fatalf("the plan declares horizon %v, want 0 (kept until pruned)", h)
			}
			_, _ = p.Run(ctx, "e1", counterexamples.PlanEvent{ID: "e1"})
			s.Age(400 * 24 * time.Hour)
			_, _ = p.Run(ctx, "e1", counterexamples.PlanEvent{ID: "e1"})
			if lie := s.Count("receipt", "e1") > 1; lie != liar {
				t.Errorf("liar %v: a redelivery 400 days later did the receipt %d times", liar, s.Count("receipt", "e1"))
			}
		}
	})
}
