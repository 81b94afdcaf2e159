package conformance

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
)

// Scenario names of the effect suite, as they appear in subtest names and
// the report.
const (
	ScenarioRedelivery     = "redelivery"
	ScenarioLateRedelivery = "late-redelivery"
	ScenarioHorizon        = "horizon"
	ScenarioConcurrent     = "concurrent-duplicates"
	ScenarioLostReply      = "lost-reply"
	ScenarioCut            = "cut-request"
	ScenarioCancel         = "cancel-mid-apply"
	ScenarioKeyReuse       = "key-reuse"
	ScenarioRaceReuse      = "concurrent-key-reuse"
	ScenarioInvalidKey     = "invalid-keys"
	ScenarioDistinctKeys   = "distinct-keys"
	ScenarioStorm          = "replay-storm"
	ScenarioRestart        = "backend-restart"
	ScenarioSlowReply      = "slow-reply"
	ScenarioKeyCapacity    = "key-capacity"
	ScenarioProcess        = "successor-process"
)

// effectTable is the effect suite: every scenario, in the order it runs,
// with the harness capabilities it needs.
func effectTable[In any]() []scenario[Harness[In]] {
	type s = scene[In]
	return []scenario[Harness[In]]{
		{ScenarioRedelivery, nil, effect((*s).redelivery)},
		{ScenarioLateRedelivery, nil, effect((*s).lateRedelivery)},
		{ScenarioHorizon, []capability{capAger}, effect((*s).horizon)},
		{ScenarioConcurrent, nil, effect((*s).concurrent)},
		{ScenarioLostReply, nil, effect(func(s *s) { s.sweep(DropReply) })},
		{ScenarioCut, nil, effect(func(s *s) { s.sweep(CutRequest) })},
		{ScenarioCancel, nil, effect(func(s *s) { s.sweep(CancelAfterSend) })},
		{ScenarioAppFaults, nil, effect((*s).appFaults)},
		{ScenarioSchedules, nil, effect((*s).faultSchedules)},
		{ScenarioSlowBackend, nil, effect((*s).slowBackend)},
		{ScenarioKeyReuse, nil, effect((*s).keyReuse)},
		{ScenarioRaceReuse, nil, effect((*s).raceReuse)},
		{ScenarioInvalidKey, nil, effect((*s).invalidKeys)},
		{ScenarioDistinctKeys, nil, effect((*s).distinctKeys)},
		{ScenarioHostileKeys, nil, effect((*s).hostileKeys)},
		{ScenarioStorm, nil, effect((*s).storm)},
		{ScenarioKeyCapacity, nil, effect((*s).keyCapacity)},
		{ScenarioKeyBytes, nil, effect((*s).keyBytes)},
		{ScenarioKeyScope, nil, effect((*s).keyScope)},
		{ScenarioRestart, []capability{capRestarter}, effect((*s).restart)},
		{ScenarioCrashRestart, []capability{capCrashRestarter}, effect((*s).crashRestart)},
		{ScenarioProcess, []capability{capAttacher}, effect((*s).successorProcess)},
		{ScenarioSlowReply, nil, effect((*s).slowReplySweep)},
	}
}

// Scenarios lists the effect suite's scenarios in the order [Run] runs
// them.
var Scenarios = names(effectTable[struct{}]())

// Run runs every scenario of the effect suite against the adapter that mk
// builds, each as a subtest of t with a fresh Harness, and fails t for
// every check that breaks the adapter's declared contract (in the subtest
// of the scenario, or of the swept round trip, where it happened). It
// returns the report; when the CONFORMANCE_REPORT environment variable
// names a directory, the report is also written there (see
// [Report.WriteFile]).
func Run[In any](t *testing.T, adapter string, mk Maker[In], opts ...Option) Report {
	t.Helper()
	return runEffect(t, "conformance.Run", adapter, mk, true, opts)
}

// Evaluate runs the scenarios like [Run] but does not fail t when a check
// fails: it only returns the report. The suite's own tests use it to prove
// that lying adapters are caught; adapter tests use [Run]. Failures to
// build the harness, and invalid options, still fail t.
func Evaluate[In any](t *testing.T, adapter string, mk Maker[In], opts ...Option) Report {
	t.Helper()
	return runEffect(t, "conformance.Evaluate", adapter, mk, false, opts)
}

func runEffect[In any](t *testing.T, op, adapter string, mk Maker[In], strict bool, opts []Option) Report {
	t.Helper()
	if req := childRequest(); req != nil {
		return runChild[In](t, adapter, req, opts)
	}
	table := effectTable[In]()
	if !slowReplyAsked(opts) {
		// An opt-in scenario: left out of the table, and the report.
		table = slices.DeleteFunc(table, func(sc scenario[Harness[In]]) bool { return sc.name == ScenarioSlowReply })
	}
	return runSuite(t, op, suiteEffect, adapter, table, func(tb testing.TB) Harness[In] { return mk(tb) }, opts, strict, func(rep *Report) {
		t.Helper()
		for _, row := range rep.Rows {
			if row.contract != nil {
				rep.Contract = *row.contract
				rep.Fields = fields(rep.Contract, rep.Rows)
				break
			}
		}
		if msg := unverified(rep); msg != "" && strict {
			t.Errorf("%s", msg)
		}
	})
}

// slowReplyAsked reports whether opts include [WithSlowReply].
func slowReplyAsked(opts []Option) bool {
	return applied(opts).slowReplySet
}

// unverified marks the fields of rep that a scenario could not verify
// (for want of a capability, or because it skipped itself; not because it
// was not selected) with the reason given to [AllowUnverified], or, when
// none was, returns the failure that says so.
func unverified(rep *Report) string {
	var lines []string
	for i := range rep.Fields {
		f := &rep.Fields[i]
		if len(f.blocked) == 0 {
			continue
		}
		if rep.Unverified != "" {
			f.Allowed = rep.Unverified
			continue
		}
		lines = append(lines, fmt.Sprintf("  %s (%s): %s", f.Field, f.Declared, f.Why))
	}
	if len(lines) == 0 {
		return ""
	}
	return fmt.Sprintf("conformance: %s: the declared contract cannot be verified, so it is a claim, not a guarantee:\n%s\n"+
		"give the harness what those scenarios need (see the package doc, \"Writing a harness\"), "+
		"or say why it cannot with conformance.AllowUnverified(\"reason\")", rep.Adapter, strings.Join(lines, "\n"))
}

// effect adapts a scenario function of the effect suite to the table:
// it learns and validates the declared contract from a first instance.
func effect[In any](fn func(s *scene[In])) func(c *checker, h Harness[In]) {
	return func(c *checker, h Harness[In]) {
		s := &scene[In]{checker: c, h: h}
		inst := s.open(NewFaults())
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
	appCode  string // the application error the sweep's faults answer (app-faults)
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
// effects.Retryable accepts with backoff for up to the retry bound.
func (s *scene[In]) applyUntilDone(inst *instance[In], key effects.Key, in In, what string) (effects.Result, error) {
	deadline := time.Now().Add(s.cfg.retryFor)
	b := retry.Backoff{Min: 5 * time.Millisecond, Max: 250 * time.Millisecond}
	for attempt := 1; ; attempt++ {
		res, err := s.apply(s.ctx, inst, key, in, what)
		if err == nil {
			return res, nil
		}
		if !effects.Retryable(err) || s.ctx.Err() != nil || time.Now().After(deadline) {
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
