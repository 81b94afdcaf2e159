package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/effects"
)

// memStore is an in-process backend: a store in process memory, with a
// dedup record per key and entries, and a clock the harness moves.
type memStore struct {
	mu      sync.Mutex
	entries map[effects.Key]int
	dedup   map[effects.Key]memRec
	total   int
	seq     int
}

type memRec struct{ fp, ref string }

func newMemStore() *memStore {
	return &memStore{entries: map[effects.Key]int{}, dedup: map[effects.Key]memRec{}}
}

// lookup is one call of the store: the key's record, if any.
func (s *memStore) lookup(key effects.Key) (memRec, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.dedup[key]
	return r, ok
}

// insert is one call of the store: it writes the entry and its record
// together unless the key has a record, which it returns.
func (s *memStore) insert(key effects.Key, fp string) (memRec, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.dedup[key]; ok {
		return r, false
	}
	s.seq++
	r := memRec{fp: fp, ref: fmt.Sprintf("e%d", s.seq)}
	s.dedup[key] = r
	s.entries[key]++
	s.total++
	return r, true
}

// memAdapter is an adapter over the in-process store: each of its calls
// to the store is a round trip of f (f.RoundTrip), as a network call
// would be, so the suite faults each.
type memAdapter struct {
	s *memStore
	f *conformance.Faults
	// lostAsTransient is the mistake of reporting an unknown outcome as
	// ErrTransient.
	lostAsTransient bool
}

func (a *memAdapter) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "record written with the entry", DetectsKeyReuse: true}
}

func (a *memAdapter) Apply(ctx context.Context, key effects.Key, in Entry) (effects.Result, error) {
	const op = "memAdapter.Apply"
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	var (
		rec   memRec
		found bool
	)
	// A lookup applies nothing: any error of it is transient.
	if err := a.f.RoundTrip(ctx, func() error { rec, found = a.s.lookup(key); return nil }); err != nil {
		return effects.Result{}, effects.Transient(op, key, err)
	}
	created := false
	if !found {
		err := a.f.RoundTrip(ctx, func() error { rec, created = a.s.insert(key, in.Payload); return nil })
		if err != nil {
			if a.lostAsTransient {
				return effects.Result{}, effects.Transient(op, key, err)
			}
			return effects.Result{}, effects.Ambiguous(op, key, err) // the insert may have run
		}
	}
	switch {
	case rec.fp != in.Payload:
		return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Op: op, Key: key}
	case created:
		return effects.Result{Status: effects.Applied, Ref: rec.ref}, nil
	}
	return effects.Result{Status: effects.Replayed, Ref: rec.ref}, nil
}

type memHarness struct {
	s     *memStore
	buggy bool
}

func (h *memHarness) Make(_ context.Context, f *conformance.Faults) (effects.Effect[Entry], func(), error) {
	return &memAdapter{s: h.s, f: f, lostAsTransient: h.buggy}, nil, nil
}

func (h *memHarness) Input(key effects.Key, variant int) Entry {
	return Entry{Payload: fmt.Sprintf("%s/%d", key, variant)}
}

func (h *memHarness) Count(_ context.Context, key effects.Key) (int, error) {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return h.s.entries[key], nil
}

func (h *memHarness) Total(context.Context) (int, error) {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return h.s.total, nil
}

// Age: the store keeps its records until pruned, whatever their age, so
// there is nothing to move.
func (h *memHarness) Age(context.Context, time.Duration) error { return nil }

// TestRoundTripConformance: an in-process adapter whose store calls go
// through f.RoundTrip is fully verified, with no wire of its own.
func TestRoundTripConformance(t *testing.T) {
	offMatrix(t)
	rep := conformance.Run(t, "in-process store", func(testing.TB) conformance.Harness[Entry] { return &memHarness{s: newMemStore()} },
		conformance.WithLateRedelivery(time.Second), conformance.WithSlowReply(200*time.Millisecond),
		conformance.AllowUnverified("the store is this process's memory: no restart, crash or second process reaches it"))
	verifiedBut(t, rep, conformance.ScenarioRestart, conformance.ScenarioCrashRestart, conformance.ScenarioProcess)
	row, _ := rep.Row(conformance.ScenarioLostReply)
	if !strings.Contains(strings.Join(row.Notes, "\n"), "each of the 2 round trips") {
		t.Errorf("lost-reply notes %v: want a sweep over the lookup and the insert", row.Notes)
	}
}

// TestRoundTripCatchesTransientLoss: the same adapter reporting a lost
// insert as ErrTransient is caught.
func TestRoundTripCatchesTransientLoss(t *testing.T) {
	offMatrix(t)
	rep := conformance.Run(t, "in-process store: lost insert as ErrTransient",
		func(testing.TB) conformance.Harness[Entry] { return &memHarness{s: newMemStore(), buggy: true} },
		conformance.Only(conformance.ScenarioLostReply), conformance.ReportOnly())
	row, _ := rep.Row(conformance.ScenarioLostReply)
	if row.Verdict != conformance.Fail || !strings.Contains(strings.Join(row.Failures, "\n"), "promises that nothing was applied") {
		t.Errorf("lost-reply: %s %v, want FAIL", row.Verdict, row.Failures)
	}
}

// TestRoundTripFaults: each fault does to an in-process call what it does
// to a network round trip.
func TestRoundTripFaults(t *testing.T) {
	ran := 0
	fn := func() error { ran++; return nil }
	ctx := context.Background()

	f := new(conformance.Faults)
	f.Arm(2, conformance.CutRequest, nil)
	if err := f.RoundTrip(ctx, fn); err != nil || ran != 1 {
		t.Fatalf("unarmed round trip: %v, ran %d", err, ran)
	}
	if err := f.RoundTrip(ctx, fn); !errors.Is(err, conformance.ErrInjected) || ran != 1 || !f.Fired() {
		t.Errorf("cut request: %v, ran %d times, fired %t; want ErrInjected, fn not run", err, ran, f.Fired())
	}

	f.Arm(3, conformance.DropReply, nil)
	if err := f.RoundTrip(ctx, fn); !errors.Is(err, conformance.ErrInjected) || ran != 2 {
		t.Errorf("drop reply: %v, ran %d times; want ErrInjected after fn ran", err, ran)
	}

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f.Arm(4, conformance.CancelAfterSend, cancel)
	if err := f.RoundTrip(cctx, fn); !errors.Is(err, context.Canceled) || ran != 3 {
		t.Errorf("cancel after send: %v, ran %d times; want context.Canceled after fn ran", err, ran)
	}

	// A slow reply the caller stops waiting for: fn ran, the caller's
	// context ends (here from within the call) and RoundTrip returns its
	// error; the hold would outlast the test.
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	f.SetSlowReply(time.Hour)
	f.Arm(5, conformance.SlowReply, nil)
	if err := f.RoundTrip(sctx, func() error { ran++; scancel(); return nil }); !errors.Is(err, context.Canceled) || ran != 4 {
		t.Errorf("slow reply abandoned: %v, ran %d times; want context.Canceled after fn ran", err, ran)
	}
	// A slow reply waited for arrives, with fn's own error.
	f.SetSlowReply(time.Millisecond)
	f.Arm(6, conformance.SlowReply, nil)
	mine := errors.New("the call's own error")
	if err := f.RoundTrip(ctx, func() error { ran++; return mine }); err != mine || ran != 5 {
		t.Errorf("slow reply waited for: %v, ran %d times; want fn's error, late", err, ran)
	}

	if got := f.RoundTrips(); got != 6 {
		t.Errorf("RoundTrips = %d, want 6", got)
	}
	f.Sever()
	if err := f.RoundTrip(ctx, fn); !errors.Is(err, conformance.ErrSevered) || ran != 5 {
		t.Errorf("after Sever: %v, ran %d times; want ErrSevered, nothing run", err, ran)
	}
}

// laterLedger hands a failed write to a background writer that retries it
// 250 ms later, and reports ErrTransient: "not applied". Nothing is
// applied when Apply returns, so a count taken at once passes it.
type laterLedger struct {
	*Ledger
	wg *sync.WaitGroup
}

func (l laterLedger) Apply(ctx context.Context, key effects.Key, in Entry) (effects.Result, error) {
	res, err := l.Ledger.Apply(ctx, key, in)
	if err != nil && effects.ClassOf(err) == effects.Retryable {
		l.wg.Go(func() {
			time.Sleep(250 * time.Millisecond) // the background writer's batching delay
			l.Ledger.Apply(context.Background(), key, in)
		})
		return effects.Result{}, effects.Transient("laterLedger", key, err)
	}
	return res, err
}

// TestQuietPeriodCatchesLateWriter: an ErrTransient whose effect lands
// after Apply returned is caught by the count after the quiet period,
// where the request was cut (a count taken at once shows nothing: with
// WithQuietPeriod(0) the lie passes).
func TestQuietPeriodCatchesLateWriter(t *testing.T) {
	offMatrix(t)
	mk := func(t testing.TB) conformance.Harness[Entry] {
		var wg sync.WaitGroup
		h := ledgerVariant{&ledgerHarness{srv: startLedger(t, 0)}, func(l *Ledger) effects.Effect[Entry] { return laterLedger{l, &wg} }, 0}
		t.Cleanup(wg.Wait)
		return h
	}
	rep := conformance.Run(t, "ledger: failed writes retried in the background", mk, conformance.Only(conformance.ScenarioCut), conformance.ReportOnly())
	row, _ := rep.Row(conformance.ScenarioCut)
	if row.Verdict != conformance.Fail || !strings.Contains(strings.Join(row.Failures, "\n"), "promises that nothing was applied") {
		t.Errorf("cut-request: %s %v, want FAIL for an effect that landed after ErrTransient", row.Verdict, row.Failures)
	}
}

// deadlineLedger gives each Apply a deadline of its own (200 ms unless
// deadline says otherwise); if timeoutTransient, it reports running out
// of it as ErrTransient ("the call timed out, nothing happened") although
// the request was sent.
type deadlineLedger struct {
	*Ledger
	timeoutTransient bool
	deadline         time.Duration
}

func (l deadlineLedger) Apply(ctx context.Context, key effects.Key, in Entry) (effects.Result, error) {
	d := l.deadline
	if d == 0 {
		d = 200 * time.Millisecond
	}
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	res, err := l.Ledger.Apply(cctx, key, in)
	if err != nil && l.timeoutTransient && cctx.Err() != nil && ctx.Err() == nil {
		return res, effects.Transient("deadlineLedger", key, err)
	}
	return res, err
}

// TestSlowReplyCatchesTimeoutAsTransient: a reply held past the adapter's
// own deadline, the connection up and the entry written, must come back
// as an unknown outcome; the honest ledger with the same deadline passes.
func TestSlowReplyCatchesTimeoutAsTransient(t *testing.T) {
	offMatrix(t)
	mk := func(transient bool) conformance.Maker[Entry] {
		return func(t testing.TB) conformance.Harness[Entry] {
			return ledgerVariant{&ledgerHarness{srv: startLedger(t, 0)}, func(l *Ledger) effects.Effect[Entry] {
				return deadlineLedger{l, transient, 0}
			}, 0}
		}
	}
	opts := []conformance.EffectOption{conformance.Only(conformance.ScenarioSlowReply), conformance.WithSlowReply(time.Second)}
	rep := conformance.Run(t, "ledger: its own timeout as ErrTransient", mk(true), append(opts, conformance.ReportOnly())...)
	row, _ := rep.Row(conformance.ScenarioSlowReply)
	if row.Verdict != conformance.Fail || !strings.Contains(strings.Join(row.Failures, "\n"), "promises that nothing was applied") {
		t.Errorf("slow-reply: %s %v, want FAIL", row.Verdict, row.Failures)
	}
	rep = conformance.Run(t, "ledger with a deadline of its own", mk(false), append(opts, conformance.AllowUnverified("this test runs slow-reply only"))...)
	row, _ = rep.Row(conformance.ScenarioSlowReply)
	if row.Verdict != conformance.Pass {
		t.Errorf("slow-reply on the honest ledger: %s %v (%s), want pass", row.Verdict, row.Failures, row.Skipped)
	}
	if strings.Contains(strings.Join(row.Notes, "\n"), "no Apply gave up") {
		t.Errorf("slow-reply notes %v: the ledger's own deadline gave up on the held replies", row.Notes)
	}
}
