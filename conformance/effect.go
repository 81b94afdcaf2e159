package conformance

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
)

// effectTable is the effect suite: every scenario, in the order it runs,
// as one record each.
func effectTable[In any]() []scenario[Harness[In]] {
	type s = scene[In]
	e := func(name, doc string, needs []capability, verifies, options, proofs []string, fn func(*s)) scenario[Harness[In]] {
		return rec(suiteEffect, name, doc, needs, verifies, options, proofs, effect(fn))
	}
	guarantee := list(FieldGuarantee, FieldDuplicateWindow)
	sweep := list("WithMaxSweep", "WithQuietPeriod")
	return []scenario[Harness[In]]{
		e(ScenarioRedelivery, "apply, then redeliver 3 times and once to a new instance",
			nil, guarantee, nil, list("BlindWrite", "EmptyFirstRef", "PanicOnReplay", "GroupCommit", "InvertedConflict", "LastRef"), (*s).redelivery),
		e(ScenarioLateRedelivery, "redeliver to a new instance 5 s later on the wall clock (a broker's visibility timeout)",
			nil, list(FieldGuarantee, FieldDuplicateWindow, FieldHorizon), list("WithLateRedelivery"), list("ForgetfulDedup"), (*s).lateRedelivery),
		e(ScenarioHorizon, "age the backend to just inside a non-zero Horizon, or by 400 days for Horizon 0, and redeliver: it must replay (or, with duplicates on any redelivery, still show one effect), and the other payload must still be refused where reuse is detected; then past a non-zero Horizon a redelivery must apply again, or Age did not reach the key store and the Horizon is not verified",
			[]capability{capAger}, list(FieldHorizon), nil, list("ForgetfulDedup", "PayloadForgotten"), (*s).horizon),
		e(ScenarioConcurrent, "16 goroutines apply one key at once, four rounds",
			nil, guarantee, nil, list("TwoTransactions", "BlindWrite", "LockedCheckThenWrite", "MemoryResolved"), (*s).concurrent),
		e(ScenarioLostReply, "for each round trip of a clean and of a duplicate Apply, lose its reply after the backend processed it; retry on the faulted and on a new instance",
			nil, guarantee, sweep, list("TwoTransactions", "FreshKeyPerAttempt", "FreshKeyOnRetry", "TransientOnLostReply", "MemoryResolved", "ChattyConstructor", "HangOnFault"),
			func(s *s) { s.sweep(DropReply) }),
		e(ScenarioCut, "for each round trip, cut the request in half and close the connection; retry as above",
			nil, guarantee, sweep, list("AppliedOnCutCommit"), func(s *s) { s.sweep(CutRequest) }),
		e(ScenarioCancel, "for each round trip, cancel the context right after the request was sent; retry as above",
			nil, guarantee, sweep, list("CancelIsPermanent"), func(s *s) { s.sweep(CancelAfterSend) }),
		e(ScenarioAppFaults, "for each round trip of a clean and of a duplicate Apply, the backend answers an application error with the connection up: 40001, 40P01, 55P03, busy, 503 or 409 before applying, a 500 after applying",
			nil, guarantee, sweep, list("TransientOn5xx", "ReplayedOnSerialization", "DeadlockPermanent", "BusySkipsLookup"), (*s).appFaults),
		e(ScenarioSchedules, "seeded schedules of 2 to 4 faults of every kind on one key, retried on the same or a new instance; a failure is shrunk to the shortest schedule and printed with its seed",
			nil, guarantee, list("WithSchedules", "WithScheduleSeed", "WithMaxSweep", "WithQuietPeriod"), list("RotateAfterTwoFailures", "BreakerAssumesDone"), (*s).faultSchedules),
		e(ScenarioSlowBackend, "for each round trip, the backend takes 2 s over the request before applying it while two other instances apply the key again and again: one effect, one ref",
			nil, guarantee, list("WithSlowBackend", "WithMaxSweep", "WithQuietPeriod"), list("ShortVendorLock"), (*s).slowBackend),
		e(ScenarioKeyReuse, "the same key with another payload: ErrKeyReused where the contract detects reuse",
			nil, list(FieldDetectsKeyReuse), nil, list("MemoryReuseCheck", "UncheckedFingerprint"), (*s).keyReuse),
		e(ScenarioRaceReuse, "16 writers on one key at once, half with each of two payloads: one applies, its payload's writers replay, the others get ErrKeyReused",
			nil, list(FieldGuarantee, FieldDuplicateWindow, FieldDetectsKeyReuse), nil, list("MemoryResolved"), (*s).raceReuse),
		e(ScenarioInvalidKey, "empty, too long, NUL, invalid UTF-8, newline: ErrInvalidKey before any round trip, nothing written",
			nil, guarantee, nil, list("TrimmedKey"), (*s).invalidKeys),
		e(ScenarioDistinctKeys, "keys that differ only after a long common prefix, in letter case, in Unicode normalization, in escaping or separators, or collide under short hashes: each applies once and replays on its own",
			nil, guarantee, nil, list("BlindWrite", "ShortHashDedup", "UnescapedPathDedup", "PrefixDedup", "CaseFoldDedup", "LastRef"), (*s).distinctKeys),
		e(ScenarioHostileKeys, "generated pairs of distinct keys, each in both orders: an invisible rune and nothing, Unicode compatibility and case variants, LIKE and glob wildcards and the literal, path separators and percent-escapes, keys at every length threshold and with the same CRC-32 past it",
			nil, guarantee, list("WithScheduleSeed"), list("StripInvisible", "WidthFold", "LikeLookup", "GlobLookup", "SlashCollapse", "LongKeyCRC"), (*s).hostileKeys),
		e(ScenarioStorm, "1,000 keys, 99% applied first: the warm-up and the storm grow the backend by exactly the new keys, every key counted",
			nil, guarantee, list("WithStorm"), list("BlindWrite", "StormCheat"), (*s).storm),
		e(ScenarioKeyCapacity, "apply a key, then 5,000 other keys, and redeliver it on the same and on a new instance, then with the other payload",
			nil, list(FieldGuarantee, FieldDuplicateWindow, FieldHorizon, FieldDetectsKeyReuse), list("WithCapacity"), list("NewestKeysOnly"), (*s).keyCapacity),
		e(ScenarioKeyBytes, "for a conformance.PayloadSizer: apply a key, then keys of the largest payload past the store budget the harness states, and redeliver it on the same and a new instance, then with the other payload",
			nil, list(FieldGuarantee, FieldHorizon, FieldDetectsKeyReuse), nil, list("ByteBudget"), (*s).keyBytes),
		e(ScenarioKeyScope, "for a conformance.KeyScoper: apply a key, then the same key in every other scope the backend could key by (an account, a path, a version): one effect, and ErrKeyReused where reuse is detected",
			nil, list(FieldGuarantee, FieldDetectsKeyReuse), nil, list("AccountScoped"), (*s).keyScope),
		e(ScenarioRestart, "apply, restart the backend cleanly, redeliver",
			[]capability{capRestarter}, guarantee, nil, nil, (*s).restart),
		e(ScenarioCrashRestart, "apply 4 keys, crash the backend and start it again, count each key before any redelivery, then redeliver",
			[]capability{capCrashRestarter}, guarantee, nil, list("UnloggedDedup"), (*s).crashRestart),
		e(ScenarioProcess, "redeliver a key, and retry one whose last reply was lost, in a child process that shares no memory with the test",
			[]capability{capAttacher}, guarantee, list("WithSuccessorProcess"), list("ProcessScopedDedup"), (*s).successorProcess),
		e(ScenarioSlowReply, "for each round trip, hold the reply past the adapter's own deadline, the connection up: giving up is an unknown outcome, never ErrTransient",
			[]capability{capSlowReply}, guarantee, list("WithSlowReply", "WithMaxSweep"), list("OwnDeadline"), (*s).slowReplySweep),
	}
}

// Run runs every scenario of the effect suite against the adapter that mk
// builds, each as a subtest of t with a fresh Harness from mk, and fails t for
// every check that breaks the adapter's declared contract (in the subtest
// of the scenario, or of the swept round trip, where it happened). It
// returns the report; when the CONFORMANCE_REPORT environment variable
// names a directory, the report is also written there (see
// [Report.WriteFile]). mk starts or connects to the backend and
// registers its cleanup with t.Cleanup; when the backend cannot be had it
// fails t (a missing server is a failure, not a skip).
func Run[In any](t *testing.T, adapter string, mk func(t testing.TB) Harness[In], opts ...EffectOption) Report {
	t.Helper()
	cfg := configure("conformance.Run", opts, EffectOption.effectOption)
	if req := childRequest(); req != nil {
		return runChild[In](t, adapter, req, cfg)
	}
	return runSuite(t, suiteEffect, adapter, effectTable[In](), mk, cfg)
}

// effect adapts a scenario function of the effect suite to the table:
// it learns and validates the declared contract from a first instance.
func effect[In any](fn func(s *scene[In])) func(c *checker, h Harness[In]) {
	return func(c *checker, h Harness[In]) {
		s := &scene[In]{checker: c, h: h}
		inst := s.open(new(Faults))
		s.contract = inst.eff.Contract()
		inst.Close()
		declared := s.contract
		c.row.contract = &declared
		if err := s.contract.Validate(); err != nil {
			s.fatalf("declared contract is invalid: %v", err)
		}
		fn(s)
	}
}

// scene is one scenario's run against one harness.
type scene[In any] struct {
	*checker
	h        Harness[In]
	contract effects.Contract
	gaveUp   *atomic.Int64 // a sweep's faulted Applies that returned an error
	appCode  string        // the application error the sweep's faults answer (app-faults)
}

// instance is one adapter instance: a process, to the suite.
type instance[In any] struct {
	eff   effects.Effect[In]
	close func()
	f     *Faults
	base  int // round trips Make made itself
	done  bool
}

// Close releases the instance once.
func (i *instance[In]) Close() {
	if !i.done {
		i.done = true
		i.close()
	}
}

// open builds an instance through f, as a process would at start-up.
func (s *scene[In]) open(f *Faults) *instance[In] {
	eff, closeFn, err := s.h.Make(s.ctx, f)
	if err != nil {
		s.t.Fatalf("conformance: harness Make: %v", err)
	}
	if eff == nil {
		s.t.Fatalf("conformance: harness Make returned a nil effect")
	}
	if closeFn == nil {
		closeFn = func() {}
	}
	inst := &instance[In]{eff: eff, close: closeFn, f: f, base: f.RoundTrips()}
	s.t.Cleanup(inst.Close)
	return inst
}

// key returns a key unique to this scenario run.
func (s *scene[In]) key(parts ...string) effects.Key {
	return effects.MustKey(append([]string{"conformance", s.run}, parts...)...)
}

// apply makes one Apply call on inst, bounded by the apply timeout.
func (s *scene[In]) apply(ctx context.Context, inst *instance[In], key effects.Key, in In, what string) (effects.Result, error) {
	return timed(s.checker, inst.f, inst.base, fmt.Sprintf("Apply(%s) in %s", shortKey(key), what), func(cctx context.Context) (effects.Result, error) {
		if ctx != s.ctx {
			// ctx is the caller's (the cancel sweep's); honour both.
			var stop context.CancelFunc
			cctx, stop = mergeCancel(cctx, ctx)
			defer stop()
		}
		return inst.eff.Apply(cctx, key, in)
	})
}

// applyUntilDone applies key until it succeeds, retrying errors that
// effects.ClassOf calls Retryable, with backoff for up to the retry bound.
func (s *scene[In]) applyUntilDone(inst *instance[In], key effects.Key, in In, what string) (effects.Result, error) {
	deadline := time.Now().Add(s.cfg.retryFor)
	b := retry.Backoff{Min: 5 * time.Millisecond, Max: 250 * time.Millisecond}
	for attempt := 1; ; attempt++ {
		res, err := s.apply(s.ctx, inst, key, in, what)
		if err == nil {
			return res, nil
		}
		if effects.ClassOf(err) != effects.Retryable || s.ctx.Err() != nil || time.Now().After(deadline) {
			return res, err
		}
		if retry.Sleep(s.ctx, b.Delay(attempt)) != nil {
			return res, err
		}
	}
}

// count returns the backend's count for key, and records it in the
// row's "effects observed".
func (s *scene[In]) count(key effects.Key, what string) int {
	n := s.peek(key, what)
	s.row.observe(n)
	return n
}

// peek returns the backend's count for key without recording it: for
// counts taken between an attempt and its retry.
func (s *scene[In]) peek(key effects.Key, what string) int {
	n, err := s.h.Count(s.ctx, key)
	if err != nil {
		s.fatalf("%s: harness Count: %v", what, err)
	}
	return n
}

// countAll counts every key, in one look when the harness is a
// BatchCounter.
func (s *scene[In]) countAll(keys []effects.Key, what string) []int {
	if bc, ok := s.h.(BatchCounter); ok {
		ns, err := bc.CountBatch(s.ctx, keys)
		if err != nil {
			s.fatalf("%s: harness CountBatch: %v", what, err)
		}
		if len(ns) != len(keys) {
			s.fatalf("%s: harness CountBatch returned %d counts for %d keys", what, len(ns), len(keys))
		}
		for _, n := range ns {
			s.row.observe(n)
		}
		return ns
	}
	out := make([]int, len(keys))
	for i, k := range keys {
		out[i] = s.count(k, what)
	}
	return out
}

func (s *scene[In]) total(what string) int {
	n, err := s.h.Total(s.ctx)
	if err != nil {
		s.fatalf("%s: harness Total: %v", what, err)
	}
	return n
}

// dupClass is the kind of repetition a scenario inflicts, to decide whether
// an at-least-once contract's window covers a duplicate.
type dupClass int

const (
	cleanRepeat    dupClass = iota // redelivery, concurrency, storms: no fault
	unknownOutcome                 // an attempt ended without its outcome known
)

// judge checks a count n of one key's effects against the contract.
func (s *scene[In]) judge(n int, class dupClass, succeeded bool, what string) {
	s.check(!(n == 0 && succeeded), "%s: 0 effects in the backend after a successful Apply", what)
	switch {
	case s.contract.Guarantee == effects.EffectivelyOnce:
		s.check(n <= 1, "%s: %d effects for one key, contract says effectively-once", what, n)
	default:
		s.check(n <= 1 || covers(s.contract.DuplicateWindow.Trigger, class),
			"%s: %d effects for one key without an unknown outcome, outside the declared window (%s)", what, n, s.contract.DuplicateWindow.Trigger)
	}
}

// expect counts key in the backend and judges the count.
func (s *scene[In]) expect(key effects.Key, class dupClass, succeeded bool, what string) int {
	n := s.count(key, what)
	s.judge(n, class, succeeded, what)
	return n
}

func covers(t effects.Trigger, class dupClass) bool {
	switch t {
	case effects.AnyRedelivery:
		return true
	case effects.AfterUnknownOutcome:
		return class == unknownOutcome
	}
	return false
}

// recordsKeys reports whether the contract promises that a repeat is
// absorbed, so a repeat must report Replayed.
func (s *scene[In]) recordsKeys() bool {
	return s.contract.Guarantee == effects.EffectivelyOnce || s.contract.DuplicateWindow.Trigger != effects.AnyRedelivery
}

// checkReplay asserts that a repeated apply reported a replay of first.
func (s *scene[In]) checkReplay(first, res effects.Result, what string) {
	if !s.recordsKeys() {
		return // nothing records the first apply; a repeat applies again
	}
	s.check(res.Status == effects.Replayed, "%s: returned %s, want replayed", what, res.Status)
	// An empty first ref is a ref too: a replay must return it, not
	// whatever a later attempt made.
	s.check(res.Ref == first.Ref, "%s: ref %q, want the first apply's %q", what, res.Ref, first.Ref)
}

// mergeCancel returns a context done when either a or b is.
func mergeCancel(a, b context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(a)
	stop := context.AfterFunc(b, func() { cancel(context.Cause(b)) })
	return ctx, func() { stop(); cancel(nil) }
}

func shortKey(k effects.Key) string {
	s := string(k)
	if len(s) > 72 {
		s = s[:60] + fmt.Sprintf("...(%d bytes)", len(s))
	}
	return fmt.Sprintf("%q", s)
}
