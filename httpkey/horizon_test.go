package httpkey_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/httpkey"
	"effectively.dev/httpkey/httpkeytest"
)

// forgetful is IETF without a replay signal (Apply reports every success
// Applied) declaring 24 hours, against a kit that forgets keys after 10
// seconds.
var forgetful = preset{server: []httpkeytest.Option{httpkeytest.As(httpkey.IETF), httpkeytest.WithHorizon(10 * time.Second)},
	effect: []httpkey.Option{httpkey.IETF, httpkey.WithHorizon(24 * time.Hour)}}

// noSignal is IETF without a replay signal, declaring the kit's horizon.
var noSignal = preset{server: []httpkeytest.Option{httpkeytest.As(httpkey.IETF)},
	effect: []httpkey.Option{httpkey.IETF, httpkey.WithHorizon(24 * time.Hour)}}

// evaluateHorizon runs the redelivery and horizon scenarios on the
// harness mk builds, without failing t: the report is judged by the
// caller. Its report stays out of the matrix.
func evaluateHorizon(t *testing.T, name string, mk func(testing.TB) *harness) conformance.Report {
	t.Helper()
	t.Setenv("CONFORMANCE_REPORT", "")
	rep := conformance.Run(t, name, func(t testing.TB) conformance.Harness[Payment] { return mk(t) },
		conformance.Only(conformance.ScenarioRedelivery, conformance.ScenarioHorizon), conformance.ReportOnly())
	t.Logf("%s", rep.Markdown())
	return rep
}

// A server that forgets keys after 10 seconds behind a configuration
// declaring 24 hours, without a replay signal: every repeat is reported
// Applied, so only the server's count tells. The horizon scenario ages
// the kit to just inside 24 hours and redelivers: the kit executes the
// request again, the count is 2, and the scenario (so a strict Run)
// fails.
func TestForgetfulServerWithoutSignalFailsHorizon(t *testing.T) {
	rep := evaluateHorizon(t, "counterexample: httpkey declaring 24h without a replay signal against a server keeping 10s",
		func(t testing.TB) *harness { return newHarness(t, forgetful, false) })
	if rep.Contract.Guarantee != effects.AtLeastOnce || rep.Contract.DuplicateWindow.Trigger != effects.AnyRedelivery {
		t.Fatalf("declared %v, want at-least-once with duplicates on any redelivery", rep.Contract)
	}
	if !slices.Equal(rep.Failed(), []string{conformance.ScenarioHorizon}) {
		t.Errorf("failed scenarios %v, want just %s", rep.Failed(), conformance.ScenarioHorizon)
	}
	if row, _ := rep.Row(conformance.ScenarioHorizon); row.MaxEffects < 2 {
		t.Errorf("horizon saw at most %d objects per key, want the second one counted", row.MaxEffects)
	}
	if f, _ := rep.Field("Horizon"); f.Status != conformance.Failed {
		t.Errorf("Horizon field: %s, want FAILED", f)
	}
}

// An Ager that moves only a clock the kit does not read: inside the
// horizon the kit still holds the key (it was never aged), and past it
// the kit still holds it, so the check proved nothing. The horizon row
// passes unconfirmed, the Horizon field is not verified, and Verify (the
// strict Run's rule) refuses the report, naming the Ager.
func TestAgerThatMissesTheKeyStoreVerifiesNothing(t *testing.T) {
	rep := evaluateHorizon(t, "counterexample: httpkey with an Ager that misses the kit's key store",
		func(t testing.TB) *harness {
			h := newHarness(t, noSignal, false)
			return h.with(&blindAger{h})
		})
	row, _ := rep.Row(conformance.ScenarioHorizon)
	if row.Verdict != conformance.Pass || !strings.Contains(row.Unconfirmed, "Age did not reach") {
		t.Errorf("horizon: %s, unconfirmed %q, want a pass marked unconfirmed", row.Verdict, row.Unconfirmed)
	}
	f, _ := rep.Field("Horizon")
	if f.Status != conformance.NotVerified || slices.Contains(f.VerifiedBy, conformance.ScenarioHorizon) {
		t.Errorf("Horizon field: %s, want not verified by horizon", f)
	}
	err := rep.Verify()
	if !errors.Is(err, conformance.ErrUnverified) || !strings.Contains(err.Error(), "Horizon (") || !strings.Contains(err.Error(), "Age did not reach") {
		t.Errorf("Verify: %v, want ErrUnverified naming Horizon and the Ager", err)
	}
}

// The kit's own Ager on an honest server without a replay signal: the
// horizon scenario passes, confirmed (past the horizon the kit executes
// again), for the kit's horizon and for an assumed one (a provider that
// publishes none), which the report marks as assumed.
func TestHorizonWithoutSignalPasses(t *testing.T) {
	for _, p := range []preset{noSignal, {server: []httpkeytest.Option{httpkeytest.As(httpkey.Square)},
		effect: []httpkey.Option{httpkey.Square, httpkey.WithHorizon(24 * time.Hour)}}} {
		rep := evaluateHorizon(t, "httpkey without a replay signal", func(t testing.TB) *harness { return newHarness(t, p, false) })
		row, _ := rep.Row(conformance.ScenarioHorizon)
		if row.Verdict != conformance.Pass || row.Unconfirmed != "" {
			t.Errorf("horizon: %s %v, unconfirmed %q, want a confirmed pass", row.Verdict, row.Failures, row.Unconfirmed)
		}
		f, _ := rep.Field("Horizon")
		if assumed := strings.HasSuffix(f.Declared, " (assumed)"); assumed != rep.Contract.HorizonAssumed {
			t.Errorf("Horizon declared %q for a contract with HorizonAssumed %v", f.Declared, rep.Contract.HorizonAssumed)
		}
	}
}

// blindAger ages only a clock the server does not read.
type blindAger struct{ h *harness }

func (b *blindAger) Age(_ context.Context, d time.Duration) error {
	b.h.clock.advance(d)
	return nil
}

// with returns a copy of h whose Age is a's.
func (h *harness) with(a conformance.Ager) *harness {
	c := *h
	c.ager = a
	return &c
}
