package effects_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/internal/memjournal"
)

// batchJournal is an in-memory BatchJournal that logs every write call
// ("MarkDone k", "Complete k", "CompleteAll k1,k2") and can fail
// CompleteAll.
type batchJournal struct {
	*memjournal.Journal
	completeAllErr error

	mu     sync.Mutex
	calls  []string
	begins int // Begin calls, not in calls
}

func (j *batchJournal) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (effects.Record, error) {
	j.mu.Lock()
	j.begins++
	j.mu.Unlock()
	return j.Journal.Begin(ctx, key, fp, lease)
}

func (j *batchJournal) beginCalls() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.begins
}

func newBatchJournal() *batchJournal { return &batchJournal{Journal: memjournal.New(nil)} }

func (j *batchJournal) log(call string) {
	j.mu.Lock()
	j.calls = append(j.calls, call)
	j.mu.Unlock()
}

func (j *batchJournal) writes() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.calls)
}

func (j *batchJournal) Complete(ctx context.Context, key effects.Key, ref string) error {
	j.log("Complete " + string(key))
	return j.Journal.Complete(ctx, key, ref)
}

func (j *batchJournal) MarkDone(ctx context.Context, key effects.Key, fp []byte, ref string) error {
	j.log("MarkDone " + string(key))
	return j.Journal.MarkDone(ctx, key, fp, ref)
}

func (j *batchJournal) CompleteAll(ctx context.Context, cs []effects.Completion) []error {
	keys := ""
	for i, c := range cs {
		if i > 0 {
			keys += ","
		}
		keys += string(c.Key)
	}
	j.log("CompleteAll " + keys)
	if j.completeAllErr != nil {
		errs := make([]error, len(cs))
		for i := range errs {
			errs[i] = j.completeAllErr
		}
		return errs
	}
	return j.Journal.CompleteAll(ctx, cs)
}

// journaledEffect is an Effect[string] over a Journaled: ownerKeyed
// (lease-free over a DoneJournal) or leased. inspect, if set, runs
// before the call.
type journaledEffect struct {
	j       *effects.Journaled
	owner   *owner
	inspect func()
	left    time.Duration // time left before the last call's deadline, when it began
}

func newJournaledEffect(t *testing.T, j effects.Journal, ownerKeyed bool) *journaledEffect {
	var opts []effects.JournaledOption
	if ownerKeyed {
		opts = append(opts, effects.WithOwnerIdempotency())
	}
	return &journaledEffect{j: newJournaled(t, j, opts...), owner: &owner{}}
}

func (e *journaledEffect) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.AtLeastOnce, Enforcer: "test journal",
		DuplicateWindow: effects.Window{Trigger: effects.AfterUnknownOutcome, Between: "after the call, before the record"}}
}

func (e *journaledEffect) Apply(ctx context.Context, key effects.Key, in string) (effects.Result, error) {
	if e.inspect != nil {
		e.inspect()
	}
	return e.j.Apply(ctx, key, []byte(in), func(ctx context.Context, a *effects.Attempt) (effects.Result, error) {
		if d, ok := ctx.Deadline(); ok {
			e.left = time.Until(d)
		}
		return e.owner.call(ctx, a)
	})
}

// funcEffect is an effectively-once Effect[string] that runs a function.
type funcEffect func(key effects.Key) (effects.Result, error)

func (f funcEffect) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "test"}
}

func (f funcEffect) Apply(_ context.Context, key effects.Key, _ string) (effects.Result, error) {
	return f(key)
}

func stepOf(name string, e effects.Effect[string]) effects.Step[string] {
	return effects.NewStep(name, e, func(ev string, _ effects.Results) (string, error) { return ev, nil })
}

func mustPlan(t *testing.T, steps ...effects.Step[string]) *effects.Plan[string] {
	t.Helper()
	p, err := effects.NewPlan("s", steps...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func requireDone(t *testing.T, j *batchJournal, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if rec := j.Get(effects.Key(k)); !rec.Done {
			t.Errorf("record of %s = %+v, want done", k, rec)
		}
	}
}

// In a plan run, a lease-free step's record waits for the next Complete
// on the same journal and commits with it in one CompleteAll.
func TestPlanCommitsItsRecordsTogether(t *testing.T) {
	j := newBatchJournal()
	charge, mail := newJournaledEffect(t, j, true), newJournaledEffect(t, j, false)
	var heldDuringMail bool
	mail.inspect = func() { heldDuringMail = !j.Get("s:e1:charge").Done }
	p := mustPlan(t, stepOf("charge", charge), stepOf("mail", mail))
	if _, err := p.Run(context.Background(), "e1", "payload"); err != nil {
		t.Fatal(err)
	}
	want := []string{"CompleteAll s:e1:charge,s:e1:mail"}
	if got := j.writes(); !slices.Equal(got, want) {
		t.Errorf("journal writes %q, want %q", got, want)
	}
	if !heldDuringMail {
		t.Error("the charge's record was written before the mail step ran; want it held for the mail's Complete")
	}
	requireDone(t, j, "s:e1:charge", "s:e1:mail")

	// A redelivery replays both from their records.
	res, err := p.Run(context.Background(), "e1", "payload")
	if err != nil || !res["charge"].Replayed() || !res["mail"].Replayed() || charge.owner.calls.Load() != 1 || mail.owner.calls.Load() != 1 {
		t.Errorf("redelivery = %+v, %v after %d and %d calls; want both replayed without a call",
			res, err, charge.owner.calls.Load(), mail.owner.calls.Load())
	}
}

// A record nothing else takes along is written when the run ends, before
// Run returns, also when a later step fails.
func TestPlanWritesHeldRecordsWhenItEnds(t *testing.T) {
	for _, fail := range []bool{false, true} {
		j := newBatchJournal()
		charge := newJournaledEffect(t, j, true)
		var heldDuringLedger bool
		ledger := funcEffect(func(key effects.Key) (effects.Result, error) {
			heldDuringLedger = !j.Get("s:e1:charge").Done
			if fail {
				return effects.Result{}, effects.Transient("ledger", key, errors.New("connection refused"))
			}
			return effects.Result{Status: effects.Applied, Ref: "row-1"}, nil
		})
		p := mustPlan(t, stepOf("charge", charge), stepOf("ledger", ledger))
		_, err := p.Run(context.Background(), "e1", "payload")
		if fail != (err != nil) {
			t.Fatalf("failing ledger %v: Run = %v", fail, err)
		}
		if got, want := j.writes(), []string{"MarkDone s:e1:charge"}; !slices.Equal(got, want) || !heldDuringLedger {
			t.Errorf("failing ledger %v: journal writes %q (held during the ledger step: %v), want %q after it", fail, got, heldDuringLedger, want)
		}
		requireDone(t, j, "s:e1:charge")
	}
}

// When CompleteAll fails, every record is written with its own call.
func TestPlanWritesRecordsAloneWhenCompleteAllFails(t *testing.T) {
	j := newBatchJournal()
	j.completeAllErr = effects.Ambiguous("journal", "", errors.New("reply lost"))
	p := mustPlan(t, stepOf("charge", newJournaledEffect(t, j, true)), stepOf("mail", newJournaledEffect(t, j, false)))
	if _, err := p.Run(context.Background(), "e1", "payload"); err != nil {
		t.Fatal(err)
	}
	want := []string{"CompleteAll s:e1:charge,s:e1:mail", "MarkDone s:e1:charge", "Complete s:e1:mail"}
	if got := j.writes(); !slices.Equal(got, want) {
		t.Errorf("journal writes %q, want %q", got, want)
	}
	requireDone(t, j, "s:e1:charge", "s:e1:mail")
}

// Records on two journals are written per journal; outside a plan nothing
// is held.
func TestHeldRecordsStayWithTheirJournal(t *testing.T) {
	j1, j2 := newBatchJournal(), newBatchJournal()
	p := mustPlan(t,
		stepOf("a", newJournaledEffect(t, j1, true)),
		stepOf("b", newJournaledEffect(t, j2, true)),
		stepOf("c", newJournaledEffect(t, j2, false)))
	if _, err := p.Run(context.Background(), "e1", "payload"); err != nil {
		t.Fatal(err)
	}
	if got, want := j1.writes(), []string{"MarkDone s:e1:a"}; !slices.Equal(got, want) {
		t.Errorf("first journal's writes %q, want %q", got, want)
	}
	if got, want := j2.writes(), []string{"CompleteAll s:e1:b,s:e1:c"}; !slices.Equal(got, want) {
		t.Errorf("second journal's writes %q, want %q", got, want)
	}

	j := newBatchJournal()
	e := newJournaledEffect(t, j, true)
	if _, err := e.Apply(context.Background(), "s:alone", "payload"); err != nil {
		t.Fatal(err)
	}
	if got, want := j.writes(), []string{"MarkDone s:alone"}; !slices.Equal(got, want) || !j.Get("s:alone").Done {
		t.Errorf("outside a plan: writes %q, record %+v; want %q before Apply returns", got, j.Get("s:alone"), want)
	}
}

// A lease-free success that comes after the run ended (work a step left
// running) is recorded at once, not held where nobody writes it.
func TestRecordHeldAfterTheRunIsWritten(t *testing.T) {
	j := newBatchJournal()
	late := newJournaledEffect(t, j, true)
	start, done := make(chan struct{}), make(chan error, 1)
	leaver := funcEffect(func(key effects.Key) (effects.Result, error) {
		return effects.Result{Status: effects.Applied, Ref: "started"}, nil
	})
	p := mustPlan(t, stepOf("leaver", effects.Effect[string](leaverWith(leaver, func(ctx context.Context) {
		go func() {
			<-start
			_, err := late.Apply(ctx, "s:e1:late", "payload")
			done <- err
		}()
	}))))
	if _, err := p.Run(context.Background(), "e1", "payload"); err != nil {
		t.Fatal(err)
	}
	close(start)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, want := j.writes(), []string{"MarkDone s:e1:late"}; !slices.Equal(got, want) || !j.Get("s:e1:late").Done {
		t.Errorf("writes %q, record %+v; want %q before Apply returned", got, j.Get("s:e1:late"), want)
	}
}

// leaverWith is f that also calls leave with its context.
func leaverWith(f funcEffect, leave func(ctx context.Context)) effects.Effect[string] {
	return ctxEffect{f: f, leave: leave}
}

type ctxEffect struct {
	f     funcEffect
	leave func(ctx context.Context)
}

func (e ctxEffect) Contract() effects.Contract { return e.f.Contract() }

func (e ctxEffect) Apply(ctx context.Context, key effects.Key, in string) (effects.Result, error) {
	e.leave(ctx)
	return e.f.Apply(ctx, key, in)
}

// valueJournal is a BatchJournal that is not a pointer: its records are
// never held (grouping compares journals, and comparing such values may
// panic).
type valueJournal struct{ *batchJournal }

func TestRecordsOfAJournalThatIsNoPointerAreNotHeld(t *testing.T) {
	j := newBatchJournal()
	vj := valueJournal{j}
	p := mustPlan(t, stepOf("a", newJournaledEffect(t, vj, true)), stepOf("b", newJournaledEffect(t, vj, false)))
	if _, err := p.Run(context.Background(), "e1", "payload"); err != nil {
		t.Fatal(err)
	}
	if got, want := j.writes(), []string{"MarkDone s:e1:a", "Complete s:e1:b"}; !slices.Equal(got, want) {
		t.Errorf("writes %q, want %q", got, want)
	}
}

// A record CompleteAll refused for good is logged, not sent again.
func TestRecordRefusedByCompleteAllIsLogged(t *testing.T) {
	j := newBatchJournal()
	j.completeAllErr = &effects.Error{Kind: effects.ErrKeyReused, Op: "journal", Key: "k"}
	var logged strings.Builder
	logger := slog.New(slog.NewTextHandler(&logged, nil))
	charge := &journaledEffect{j: newJournaled(t, j, effects.WithOwnerIdempotency(), effects.WithJournalLogger(logger)), owner: &owner{}}
	mail := &journaledEffect{j: newJournaled(t, j, effects.WithJournalLogger(logger)), owner: &owner{}}
	if _, err := mustPlan(t, stepOf("charge", charge), stepOf("mail", mail)).Run(context.Background(), "e1", "payload"); err != nil {
		t.Fatal(err)
	}
	if got, want := j.writes(), []string{"CompleteAll s:e1:charge,s:e1:mail"}; !slices.Equal(got, want) {
		t.Errorf("writes %q, want %q (no retry of a refusal)", got, want)
	}
	if n := strings.Count(logged.String(), "journal record did not commit"); n != 2 {
		t.Errorf("logged %d unrecorded successes, want 2:\n%s", n, logged.String())
	}
}

// ctxFuncEffect is an effectively-once Effect[string] that runs a function of
// its context.
type ctxFuncEffect func(ctx context.Context, key effects.Key) (effects.Result, error)

func (f ctxFuncEffect) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "test"}
}

func (f ctxFuncEffect) Apply(ctx context.Context, key effects.Key, _ string) (effects.Result, error) {
	return f(ctx, key)
}

// A lease an earlier step of the run took for a later step's key (in its
// own transaction: here a Begin of its own) is used by that step instead
// of a Begin, when the fingerprints match and time is left on it.
func TestPlanUsesALeaseTakenAhead(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fp      string        // the fingerprint the lease was taken with
		age     time.Duration // how long before the hold the lease began
		lease   time.Duration // the lease taken
		begins  int           // Begin calls in all
		wantErr error
	}{
		{"used", "payload", 0, time.Minute, 1, nil},
		{"another fingerprint: Begin, which refuses", "other", 0, time.Minute, 2, effects.ErrKeyReused},
		{"no time left: released unused, and Begin takes the key anew", "payload", time.Hour, time.Minute, 2, nil},
		{"a lease shorter than the step's own bounds its call", "payload", 0, 200 * time.Millisecond, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newBatchJournal()
			mailKey := effects.MustKey("s", "e1", "mail")
			var held bool
			ledger := ctxFuncEffect(func(ctx context.Context, key effects.Key) (effects.Result, error) {
				taken := time.Now().Add(-tc.age)
				rec, err := j.Begin(ctx, mailKey, []byte(tc.fp), tc.lease)
				if err != nil {
					return effects.Result{}, err
				}
				held = effects.HoldLease(ctx, j, mailKey, []byte(tc.fp), rec.Attempt, taken, tc.lease)
				return effects.Result{Status: effects.Applied, Ref: "row-1"}, nil
			})
			mail := newJournaledEffect(t, j, false)
			p := mustPlan(t, stepOf("ledger", ledger), stepOf("mail", mail))
			_, err := p.Run(context.Background(), "e1", "payload")
			if !held {
				t.Fatal("HoldLease in a plan run reported false")
			}
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("Run = %v, want %v", err, tc.wantErr)
			}
			if n := j.beginCalls(); n != tc.begins {
				t.Errorf("%d Begin calls, want %d", n, tc.begins)
			}
			if tc.wantErr == nil {
				// The call must end at nine tenths of the shorter lease.
				if limit := tc.lease - tc.lease/10; mail.left <= 0 || mail.left > limit {
					t.Errorf("the mail call had %v left, want at most %v (nine tenths of the %v lease taken ahead)", mail.left, limit, tc.lease)
				}
				requireDone(t, j, string(mailKey))
				if mail.owner.calls.Load() != 1 {
					t.Errorf("%d mail calls, want 1", mail.owner.calls.Load())
				}
			} else if mail.owner.calls.Load() != 0 {
				t.Errorf("%d mail calls, want none", mail.owner.calls.Load())
			}
		})
	}
	if effects.HoldLease(context.Background(), newBatchJournal(), effects.MustKey("s", "e1", "mail"), nil, 1, time.Now(), time.Minute) {
		t.Error("HoldLease outside a plan run reported true")
	}
}

// A lease taken ahead for a step that did not run (a step between failed)
// is released when the run returns: the redelivery's step takes the key at
// once, where it used to find the lease live (ErrInFlight) until it
// expired.
func TestPlanReleasesALeaseTakenAheadThatNoStepUsed(t *testing.T) {
	j := newBatchJournal()
	mailKey := effects.MustKey("s", "e1", "mail")
	var ledgerDone atomic.Bool
	ledger := ctxFuncEffect(func(ctx context.Context, key effects.Key) (effects.Result, error) {
		if ledgerDone.Load() {
			return effects.Result{Status: effects.Replayed, Ref: "row-1"}, nil
		}
		rec, err := j.Begin(ctx, mailKey, []byte("payload"), time.Minute)
		if err != nil {
			return effects.Result{}, err
		}
		if !effects.HoldLease(ctx, j, mailKey, []byte("payload"), rec.Attempt, time.Now(), time.Minute) {
			t.Error("HoldLease in a plan run reported false")
		}
		ledgerDone.Store(true)
		return effects.Result{Status: effects.Applied, Ref: "row-1"}, nil
	})
	var failures atomic.Int64
	failures.Store(1)
	between := ctxFuncEffect(func(context.Context, effects.Key) (effects.Result, error) {
		if failures.Add(-1) >= 0 {
			return effects.Result{}, effects.Transient("between", "", errors.New("injected"))
		}
		return effects.Result{Status: effects.Applied, Ref: "ok"}, nil
	})
	mail := newJournaledEffect(t, j, false)
	p := mustPlan(t, stepOf("ledger", ledger), stepOf("between", between), stepOf("mail", mail))
	if _, err := p.Run(context.Background(), "e1", "payload"); !errors.Is(err, effects.ErrTransient) {
		t.Fatalf("Run = %v, want the middle step's ErrTransient", err)
	}
	if rec, err := j.Begin(context.Background(), mailKey, []byte("other payload"), time.Minute); !errors.Is(err, effects.ErrKeyReused) {
		t.Fatalf("the mail key after the run = %+v, %v; want its record kept (ErrKeyReused for another payload)", rec, err)
	}
	// The redelivery: the ledger replays, and the mail step's own Begin
	// takes the released key at once.
	res, err := p.Run(context.Background(), "e1", "payload")
	if err != nil || res["mail"].Status != effects.Applied || mail.owner.calls.Load() != 1 {
		t.Fatalf("redelivery = %+v, %v after %d mail calls; want the mail sent once", res, err, mail.owner.calls.Load())
	}
	if n := j.beginCalls(); n != 3 { // the ledger's, the refused one above, the mail's
		t.Errorf("%d Begin calls, want 3", n)
	}
	requireDone(t, j, string(mailKey))
}
