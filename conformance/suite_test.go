package conformance_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/conformance/internal/counterexamples"
	"effectively.dev/effects"
)

func ledgerMaker(ttl time.Duration) conformance.Maker[Entry] {
	return func(t testing.TB) conformance.Harness[Entry] { return &ledgerHarness{srv: startLedger(t, ttl)} }
}

// offMatrix keeps a test's reports out of the conformance matrix: the
// example adapter and the suite's tests of itself are no product.
func offMatrix(t *testing.T) { t.Setenv("CONFORMANCE_REPORT", "") }

// TestLedgerConformance: the example adapter passes every scenario, the
// ones that need a capability included, and the matrix says every field
// of its contract was verified.
func TestLedgerConformance(t *testing.T) {
	offMatrix(t)
	rep := conformance.Run(t, "ledger", ledgerMaker(0), conformance.WithLateRedelivery(time.Second), conformance.WithSlowReply(300*time.Millisecond),
		conformance.WithSuccessorProcess(attachLedger))
	for _, row := range rep.Rows {
		if row.Verdict != conformance.Pass && !(row.NotApplicable && row.Scenario == conformance.ScenarioKeyScope) {
			t.Errorf("%s: %s (%s), want pass", row.Scenario, row.Verdict, row.Skipped)
		}
	}
	for _, f := range rep.Fields {
		if f.Status != conformance.Verified {
			t.Errorf("field %s: %s", f.Field, f)
		}
	}
	if len(rep.Fields) != 4 {
		t.Errorf("%d fields in the report, want 4", len(rep.Fields))
	}
	// The ledger sets no deadline of its own: it waits for every held
	// reply, and the report says that giving up was not seen.
	if row, _ := rep.Row(conformance.ScenarioSlowReply); !strings.Contains(strings.Join(row.Notes, "\n"), "no Apply gave up") {
		t.Errorf("slow-reply notes %v: want it said that no Apply gave up", row.Notes)
	}
}

// TestHorizonNeedsAger: without the capability the horizon scenario is
// not run, and the matrix says the horizon is not verified, never passed
// (and Run passes only because AllowUnverified says why).
func TestHorizonNeedsAger(t *testing.T) {
	offMatrix(t)
	rep := conformance.Run(t, "ledger without Ager", func(t testing.TB) conformance.Harness[Entry] {
		return struct{ conformance.Harness[Entry] }{&ledgerHarness{srv: startLedger(t, 0)}}
	}, conformance.Only(conformance.ScenarioHorizon, conformance.ScenarioRedelivery),
		conformance.AllowUnverified("this test shows the horizon unverified without an Ager"))
	row, _ := rep.Row(conformance.ScenarioHorizon)
	if row.Verdict != conformance.NotRun || !strings.Contains(row.Skipped, "conformance.Ager") {
		t.Errorf("horizon: %s (%s), want not run for want of an Ager", row.Verdict, row.Skipped)
	}
	f, _ := rep.Field("Horizon")
	if f.Status != conformance.NotVerified || f.Allowed == "" {
		t.Errorf("Horizon field: %s, want not verified, allowed", f)
	}
	if g, _ := rep.Field("Guarantee"); g.Status != conformance.NotVerified {
		t.Errorf("Guarantee field: %s, want not verified (most of its scenarios were not selected)", g)
	}
}

// TestHorizonCatchesForgetfulDedup: a service that forgets keys after two
// seconds, declared "kept until pruned", fails the horizon scenario (the
// service's clock is aged 400 days) and the late redelivery (a real wait).
func TestHorizonCatchesForgetfulDedup(t *testing.T) {
	offMatrix(t)
	rep := conformance.Run(t, "ledger forgetting keys after 2s", ledgerMaker(2*time.Second),
		conformance.Only(conformance.ScenarioHorizon, conformance.ScenarioLateRedelivery, conformance.ScenarioRedelivery),
		conformance.WithLateRedelivery(3*time.Second), conformance.ReportOnly())
	for _, s := range []string{conformance.ScenarioHorizon, conformance.ScenarioLateRedelivery} {
		if !slices.Contains(rep.Failed(), s) {
			t.Errorf("%s passed a dedup whose keys vanish after 2s", s)
		}
	}
	if row, _ := rep.Row(conformance.ScenarioRedelivery); row.Verdict != conformance.Pass {
		t.Errorf("redelivery: %s; an immediate redelivery is within its 2s", row.Verdict)
	}
	if f, _ := rep.Field("Horizon"); f.Status != conformance.Failed {
		t.Errorf("Horizon field: %s, want FAILED", f)
	}
}

// hangingLedger waits for its context when a reply is lost, instead of
// reporting the unknown outcome.
type hangingLedger struct{ *Ledger }

func (l hangingLedger) Apply(ctx context.Context, key effects.Key, in Entry) (effects.Result, error) {
	res, err := l.Ledger.Apply(ctx, key, in)
	if errors.Is(err, effects.ErrAmbiguous) && ctx.Err() == nil {
		<-ctx.Done()
		return res, ctx.Err()
	}
	return res, err
}

// TestApplyTimeoutNamesTheHang: an Apply that hangs is reported as a hang
// of that call, at the round trip where it happened, within the per-Apply
// limit, and the sweep goes on.
func TestApplyTimeoutNamesTheHang(t *testing.T) {
	offMatrix(t)
	start := time.Now()
	rep := conformance.Run(t, "ledger hanging on a lost reply", func(t testing.TB) conformance.Harness[Entry] {
		return ledgerVariant{&ledgerHarness{srv: startLedger(t, 0)}, func(l *Ledger) effects.Effect[Entry] { return hangingLedger{l} }, 0}
	}, conformance.Only(conformance.ScenarioLostReply), conformance.WithApplyTimeout(500*time.Millisecond), conformance.ReportOnly())
	row, _ := rep.Row(conformance.ScenarioLostReply)
	if row.Verdict != conformance.Fail || len(row.Failures) == 0 {
		t.Fatalf("lost-reply: %s, want FAIL for a hang", row.Verdict)
	}
	msg := row.Failures[0]
	for _, want := range []string{"hang:", "Apply(", "drop reply at round trip 1", "did not return within 500ms", "round trip 1 of its instance"} {
		if !strings.Contains(msg, want) {
			t.Errorf("failure %q does not say %q", msg, want)
		}
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the hang took %v to report", d)
	}
}

// transientLedger reports every unknown outcome as ErrTransient, a
// promise that nothing was applied.
type transientLedger struct{ *Ledger }

func (l transientLedger) Apply(ctx context.Context, key effects.Key, in Entry) (effects.Result, error) {
	res, err := l.Ledger.Apply(ctx, key, in)
	if errors.Is(err, effects.ErrAmbiguous) {
		return res, effects.Transient("transientLedger", key, err)
	}
	return res, err
}

// ledgerVariant builds another effect over the ledger, and makes pings
// round trips in Make (a handshake, a metadata request).
type ledgerVariant struct {
	*ledgerHarness
	build func(*Ledger) effects.Effect[Entry]
	pings int
}

func (h ledgerVariant) Make(ctx context.Context, f *conformance.Faults) (effects.Effect[Entry], func(), error) {
	if h.pings > 0 {
		c, err := f.DialContext(ctx, "tcp", h.srv.Addr())
		if err != nil {
			return nil, nil, err
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for range h.pings {
			if _, err := fmt.Fprintln(c, "PING"); err != nil {
				return nil, nil, err
			}
			if _, err := r.ReadString('\n'); err != nil {
				return nil, nil, err
			}
		}
	}
	h.answerAppFaults(f)
	return h.build(&Ledger{addr: h.srv.Addr(), dial: f.DialContext}), nil, nil
}

// TestSweepSkipsMakeAndChecksTransient: a constructor that makes 70 round
// trips (more than the sweep's bound) no longer hides Apply from the
// sweep, and an ErrTransient whose effect landed is caught.
func TestSweepSkipsMakeAndChecksTransient(t *testing.T) {
	offMatrix(t)
	rep := conformance.Run(t, "ledger: lost reply as ErrTransient, chatty Make", func(t testing.TB) conformance.Harness[Entry] {
		return ledgerVariant{&ledgerHarness{srv: startLedger(t, 0)}, func(l *Ledger) effects.Effect[Entry] { return transientLedger{l} }, 70}
	}, conformance.Only(conformance.ScenarioLostReply), conformance.ReportOnly())
	row, _ := rep.Row(conformance.ScenarioLostReply)
	if row.Verdict != conformance.Fail || !strings.Contains(strings.Join(row.Failures, "\n"), "promises that nothing was applied") {
		t.Fatalf("lost-reply: %s %v, want FAIL for an ErrTransient with an effect", row.Verdict, row.Failures)
	}
	if !slices.ContainsFunc(row.Notes, func(n string) bool { return strings.Contains(n, "each of the 1 round trips") }) {
		t.Errorf("notes %v: the sweep should count Apply's 1 round trip, not Make's 70", row.Notes)
	}
}

// appliedOnCut reports Applied when its request was cut.
type appliedOnCut struct{ *Ledger }

func (l appliedOnCut) Apply(ctx context.Context, key effects.Key, in Entry) (effects.Result, error) {
	res, err := l.Ledger.Apply(ctx, key, in)
	if errors.Is(err, effects.ErrAmbiguous) {
		return effects.Result{Status: effects.Applied}, nil
	}
	return res, err
}

// TestNilErrorMustShowTheEffect: an Apply that reports success for a cut
// request is caught before the suite's retry could repair it.
func TestNilErrorMustShowTheEffect(t *testing.T) {
	offMatrix(t)
	rep := conformance.Run(t, "ledger: applied on a cut request", func(t testing.TB) conformance.Harness[Entry] {
		return ledgerVariant{&ledgerHarness{srv: startLedger(t, 0)}, func(l *Ledger) effects.Effect[Entry] { return appliedOnCut{l} }, 0}
	}, conformance.Only(conformance.ScenarioCut), conformance.ReportOnly())
	row, _ := rep.Row(conformance.ScenarioCut)
	if row.Verdict != conformance.Fail || !strings.Contains(strings.Join(row.Failures, "\n"), "reported an effect that did not happen") {
		t.Fatalf("cut-request: %s %v, want FAIL", row.Verdict, row.Failures)
	}
}

// memSourceMaker gives every scenario a fresh in-memory log of three
// partitions; wrap changes the sources it opens.
func memSourceMaker(bug func(*memLog), wrap func(effects.Source) effects.Source) func(testing.TB) conformance.SourceHarness {
	return func(testing.TB) conformance.SourceHarness {
		l := newMemLog(3)
		if bug != nil {
			bug(l)
		}
		return wrappedSource{l, wrap}
	}
}

type wrappedSource struct {
	*memLog
	wrap func(effects.Source) effects.Source
}

func (w wrappedSource) Open(ctx context.Context, f *conformance.Faults) (conformance.SourceInstance, error) {
	si, err := w.memLog.Open(ctx, f)
	if err == nil && w.wrap != nil {
		si.Source = w.wrap(si.Source)
	}
	return si, err
}

// TestRunSourceOnMemoryLog: the reference source passes every scenario.
func TestRunSourceOnMemoryLog(t *testing.T) {
	offMatrix(t)
	rep := conformance.RunSource(t, "memlog", memSourceMaker(nil, nil), conformance.WithRedeliveryWait(5*time.Second))
	for _, row := range rep.Rows {
		if row.Verdict != conformance.Pass {
			t.Errorf("%s: %s, want pass", row.Scenario, row.Verdict)
		}
	}
}

// TestRunSourceCatchesCounterexamples: a source that acks on Next, one
// that commits past unacked deliveries and one that commits every
// delivered message of a revoked partition fail where they lose messages.
// (Acking on Next passes revocation: that scenario acks everything, and a
// no-op Ack that returns nil cannot be told from one that commits.)
func TestRunSourceCatchesCounterexamples(t *testing.T) {
	cases := []struct {
		name   string
		mk     func(testing.TB) conformance.SourceHarness
		caught []string
	}{
		{"ack on next", memSourceMaker(nil, func(s effects.Source) effects.Source { return counterexamples.AckOnNext{Source: s} }),
			[]string{conformance.SourceUnackedAfterClose, conformance.SourceUnackedAfterCrash, conformance.SourceOutOfOrderAcks, conformance.SourceNeverAcked}},
		{"commit past holes", memSourceMaker(func(l *memLog) { l.skipHoles = true }, nil), []string{conformance.SourceOutOfOrderAcks}},
		{"every delivery attempt 1", memSourceMaker(nil, func(s effects.Source) effects.Source { return counterexamples.AttemptAlwaysOne{Source: s} }),
			[]string{conformance.SourceUnackedAfterClose, conformance.SourceUnackedAfterCrash}},
		{"commit everything delivered on revoke", memSourceMaker(func(l *memLog) { l.revokeCommitsAll = true }, nil), []string{conformance.SourceRevocation}},
		{"release acks", memSourceMaker(nil, func(s effects.Source) effects.Source { return counterexamples.ReleaseAcks{Source: s} }),
			[]string{conformance.SourceReleased}},
		{"a header stamped per delivery", memSourceMaker(nil, func(s effects.Source) effects.Source { return counterexamples.NewStampedRedelivery(s) }),
			[]string{conformance.SourceUnackedAfterClose, conformance.SourceUnackedAfterCrash}},
		// Those of conformance/internal/counterexamples/redteam.go.
		{"an ack applied at the next ack", memSourceMaker(nil, func(s effects.Source) effects.Source { return counterexamples.NewAckOnNextAck(s) }),
			[]string{conformance.SourceAckedStayAcked}},
		{"attempts counted from 0", func(tb testing.TB) conformance.SourceHarness {
			return memSourceMaker(nil, counterexamples.NewAttemptFromZero().Wrap)(tb) // one broker count per log
		},
			[]string{conformance.SourceUnackedAfterClose}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := conformance.RunSource(t, "counterexample: "+c.name, c.mk, conformance.WithRedeliveryWait(500*time.Millisecond), conformance.ReportOnly())
			for _, s := range c.caught {
				if !slices.Contains(rep.Failed(), s) {
					t.Errorf("%s passed %s", s, c.name)
				}
			}
			if row, _ := rep.Row(conformance.SourceAckedStayAcked); row.Verdict != conformance.Pass && !slices.Contains(c.caught, conformance.SourceAckedStayAcked) {
				t.Errorf("%s: %s %v; acking everything works for every variant", conformance.SourceAckedStayAcked, row.Verdict, row.Failures)
			}
		})
	}
}
