package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"effectively.dev/effects"
)

// Scenario names, as they appear in subtest names and the report.
const (
	ScenarioRedelivery = "redelivery"
	ScenarioConcurrent = "concurrent-duplicates"
	ScenarioLostReply  = "lost-reply"
	ScenarioCut        = "cut-request"
	ScenarioCancel     = "cancel-mid-apply"
	ScenarioKeyReuse   = "key-reuse"
	ScenarioRaceReuse  = "concurrent-key-reuse"
	ScenarioInvalidKey = "invalid-keys"
	ScenarioStorm      = "replay-storm"
	ScenarioRestart    = "backend-restart"
)

// Scenarios lists every scenario in the order the suite runs them.
var Scenarios = []string{
	ScenarioRedelivery, ScenarioConcurrent, ScenarioLostReply, ScenarioCut,
	ScenarioCancel, ScenarioKeyReuse, ScenarioRaceReuse, ScenarioInvalidKey, ScenarioStorm, ScenarioRestart,
}

// Run runs every scenario against the adapter that mk builds, each as a
// subtest of t with a fresh Harness, and fails t for every scenario whose
// observations break the adapter's declared contract. It returns the
// report; when the CONFORMANCE_REPORT environment variable names a
// directory, the report is also written there (see [Report.WriteFile]).
func Run[In any](t *testing.T, adapter string, mk Maker[In], opts ...Option) Report {
	t.Helper()
	return run(t, adapter, mk, true, opts)
}

// Evaluate runs the scenarios like [Run] but does not fail t when a
// scenario's verdict is Fail: it only returns the report. The suite's own
// tests use it to prove that lying adapters are caught; adapter tests use
// [Run]. Failures to build the harness still fail t.
func Evaluate[In any](t *testing.T, adapter string, mk Maker[In], opts ...Option) Report {
	t.Helper()
	return run(t, adapter, mk, false, opts)
}

func run[In any](t *testing.T, adapter string, mk Maker[In], strict bool, opts []Option) Report {
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	rep := Report{Adapter: adapter, Evaluated: !strict}
	for _, name := range Scenarios {
		row := Row{Scenario: name, Verdict: NotRun}
		if cfg.only != nil && !cfg.only[name] {
			row.Notes = append(row.Notes, "not selected")
			rep.Rows = append(rep.Rows, row)
			continue
		}
		ok := t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
			defer cancel()
			s := &scene[In]{h: mk(t), cfg: cfg, row: &row, run: newRunID(), t: t}
			s.start(ctx, name)
			if row.Verdict == NotRun {
				t.Logf("not run: %s", strings.Join(row.Notes, "; "))
				return
			}
			if len(row.Failures) == 0 {
				row.Verdict = Pass
				return
			}
			row.Verdict = Fail
			if strict {
				t.Errorf("%s: declared contract %s broken:\n  %s", name, row.contract, strings.Join(row.Failures, "\n  "))
			} else {
				t.Logf("%s: verdict FAIL (not failing the test: Evaluate): %s", name, strings.Join(row.Failures, "; "))
			}
		})
		if !ok && row.Verdict != Fail {
			// The subtest stopped early (the harness failed it with
			// t.Fatal): whatever was provisionally recorded is no pass.
			row.Verdict = Fail
			row.Failures = append(row.Failures, "the scenario did not finish: the harness or the adapter failed the test (see its log)")
		}
		if row.contract != nil && rep.Contract.Enforcer == "" {
			rep.Contract = *row.contract
		}
		rep.Rows = append(rep.Rows, row)
	}
	if err := rep.writeEnv(); err != nil {
		t.Errorf("conformance: writing report: %v", err)
	}
	if testing.Verbose() {
		t.Logf("conformance matrix:\n%s", rep.Markdown())
	}
	return rep
}

// scene is one scenario's run against one harness.
type scene[In any] struct {
	h        Harness[In]
	cfg      config
	row      *Row
	run      string
	t        testing.TB
	contract effects.Contract
}

// dupClass is the kind of repetition a scenario inflicts, to decide whether
// an at-least-once contract's window covers a duplicate.
type dupClass int

const (
	cleanRepeat    dupClass = iota // redelivery, concurrency, storms: no fault
	unknownOutcome                 // an attempt ended without its outcome known
)

func (s *scene[In]) start(ctx context.Context, name string) {
	defer func() {
		// A scenario that could not finish its checks because the adapter
		// failed has recorded why; anything else is a harness bug.
		if r := recover(); r != nil {
			if _, ok := r.(abort); !ok {
				panic(r)
			}
		}
	}()
	// Learn the declared contract from a first instance.
	eff, closeFn := s.make(ctx, NewFaults())
	s.contract = eff.Contract()
	closeFn()
	c := s.contract
	s.row.contract = &c
	if err := s.contract.Validate(); err != nil {
		s.row.Verdict = Fail
		s.failf("declared contract is invalid: %v", err)
		return
	}
	s.row.Verdict = Pass // provisional: checks below may add failures
	switch name {
	case ScenarioRedelivery:
		s.redelivery(ctx)
	case ScenarioConcurrent:
		s.concurrent(ctx)
	case ScenarioLostReply:
		s.sweep(ctx, DropReply)
	case ScenarioCut:
		s.sweep(ctx, CutRequest)
	case ScenarioCancel:
		s.sweep(ctx, CancelAfterSend)
	case ScenarioKeyReuse:
		s.keyReuse(ctx)
	case ScenarioRaceReuse:
		s.raceReuse(ctx)
	case ScenarioInvalidKey:
		s.invalidKeys(ctx)
	case ScenarioStorm:
		s.storm(ctx)
	case ScenarioRestart:
		s.restart(ctx)
	}
}

// abort stops a scenario after a failure that makes further checks moot.
type abort struct{}

func (s *scene[In]) failf(format string, args ...any) {
	s.row.Failures = append(s.row.Failures, fmt.Sprintf(format, args...))
}

func (s *scene[In]) fatalf(format string, args ...any) {
	s.failf(format, args...)
	panic(abort{})
}

func (s *scene[In]) notef(format string, args ...any) {
	s.row.Notes = append(s.row.Notes, fmt.Sprintf(format, args...))
}

func (s *scene[In]) make(ctx context.Context, f *Faults) (effects.Effect[In], func()) {
	eff, closeFn, err := s.h.Make(ctx, f)
	if err != nil {
		s.t.Fatalf("conformance: harness Make: %v", err)
	}
	if closeFn == nil {
		closeFn = func() {}
	}
	return eff, closeFn
}

// key returns a key unique to this scenario run.
func (s *scene[In]) key(parts ...string) effects.Key {
	return effects.MustKey(append([]string{"conformance", s.run}, parts...)...)
}

// applyUntilDone applies key until it succeeds, retrying errors that
// effects.Retryable accepts with backoff for up to cfg.retryFor.
func (s *scene[In]) applyUntilDone(ctx context.Context, eff effects.Effect[In], key effects.Key, in In) (effects.Result, error) {
	deadline := time.Now().Add(s.cfg.retryFor)
	backoff := 5 * time.Millisecond
	for {
		res, err := eff.Apply(ctx, key, in)
		if err == nil {
			return res, nil
		}
		if !effects.Retryable(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return res, err
		}
		select {
		case <-ctx.Done():
			return res, err
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 250*time.Millisecond)
	}
}

// expect checks the backend's count for key against the contract.
func (s *scene[In]) expect(ctx context.Context, key effects.Key, class dupClass, succeeded bool, what string) int {
	n, err := s.h.Count(ctx, key)
	if err != nil {
		s.fatalf("%s: harness Count: %v", what, err)
	}
	s.row.observe(n)
	switch {
	case n == 0 && succeeded:
		s.failf("%s: 0 effects in the backend after a successful Apply", what)
	case n > 1 && s.contract.Guarantee == effects.EffectivelyOnce:
		s.failf("%s: %d effects for one key, contract says effectively-once", what, n)
	case n > 1 && !covers(s.contract.DuplicateWindow.Trigger, class):
		s.failf("%s: %d effects for one key without an unknown outcome, outside the declared window (%s)", what, n, s.contract.DuplicateWindow.Trigger)
	}
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

func newRunID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
