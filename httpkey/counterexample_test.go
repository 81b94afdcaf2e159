package httpkey_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/httpkey"
	"effectively.dev/httpkey/httpkeytest"
)

// replayed is the replay signal of the configurations below.
var replayed = []httpkeytest.Option{httpkeytest.As(httpkey.IETF), httpkeytest.WithReplayHeader("Idempotent-Replayed", "true")}

// effectFor returns the options of an effect that trusts the kit's replay
// signal and declares horizon.
func effectFor(horizon time.Duration) []httpkey.Option {
	return []httpkey.Option{httpkey.IETF, httpkey.WithHorizon(horizon), httpkey.WithReplayHeader("Idempotent-Replayed", "true")}
}

// A configuration that declares a longer horizon than the server keeps:
// the documentation said 24 hours, the server forgets keys after one. The
// horizon scenario ages the kit's clock to just inside the declared 24
// hours and redelivers: the server has forgotten the key and creates a
// second object. The immediate and the late redelivery (a second later)
// still replay: only the horizon tells the lie from the truth.
func TestCounterexampleLongerHorizonThanTheServerKeepsFails(t *testing.T) {
	t.Parallel()
	server := append(slices.Clone(replayed), httpkeytest.WithHorizon(time.Hour))
	rep := conformance.Run(t, "counterexample: httpkey declaring 24h against a server keeping 1h",
		func(t testing.TB) conformance.Harness[Payment] {
			return newHarness(t, preset{server: server, effect: effectFor(24 * time.Hour)}, false)
		},
		conformance.Only(conformance.ScenarioRedelivery, conformance.ScenarioLateRedelivery, conformance.ScenarioHorizon),
		conformance.WithLateRedelivery(time.Second), conformance.ReportOnly())
	t.Logf("caught by: %v\n%s", rep.Failed(), rep.Markdown())
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

// The same server declared honestly (one hour) passes the horizon
// scenario: the counterexample fails for its declaration, not for the
// server. (Its report, two scenarios of one configuration, stays out of
// the matrix.)
func TestHonestHorizonOnTheSameServerPasses(t *testing.T) {
	t.Setenv("CONFORMANCE_REPORT", "")
	server := append(slices.Clone(replayed), httpkeytest.WithHorizon(time.Hour))
	rep := conformance.Run(t, "httpkey declaring 1h against a server keeping 1h",
		func(t testing.TB) conformance.Harness[Payment] {
			return newHarness(t, preset{server: server, effect: effectFor(time.Hour)}, false)
		},
		conformance.Only(conformance.ScenarioRedelivery, conformance.ScenarioHorizon),
		conformance.AllowUnverified("two scenarios of one configuration: TestConformance runs them all"))
	if row, _ := rep.Row(conformance.ScenarioHorizon); row.Verdict != conformance.Pass {
		t.Errorf("horizon: %s %v, want pass", row.Verdict, row.Failures)
	}
}

// A configuration that claims a replay signal the server does not send:
// every repeat comes back Applied, so the effect reports a replay as a
// new effect, which a caller counting Results (or a plan) would take for
// a second charge. The redelivery scenario catches it, for a header with
// a value (Idempotent-Replayed: true) and for Worldline's header whose
// presence is the signal.
func TestCounterexampleReplaySignalTheServerDoesNotSendFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		server []httpkeytest.Option
		effect []httpkey.Option
	}{
		{"Idempotent-Replayed", []httpkeytest.Option{httpkeytest.As(httpkey.IETF)}, effectFor(24 * time.Hour)},
		{"Worldline", []httpkeytest.Option{httpkeytest.As(httpkey.Worldline), httpkeytest.WithReplayHeader("", "")}, []httpkey.Option{httpkey.Worldline}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := conformance.Run(t, "counterexample: httpkey trusting a replay signal ("+tc.name+") the server never sends",
				func(t testing.TB) conformance.Harness[Payment] {
					return newHarness(t, preset{server: tc.server, effect: tc.effect}, false)
				},
				conformance.Only(conformance.ScenarioRedelivery, conformance.ScenarioConcurrent), conformance.ReportOnly())
			t.Logf("caught by: %v\n%s", rep.Failed(), rep.Markdown())
			for _, name := range []string{conformance.ScenarioRedelivery, conformance.ScenarioConcurrent} {
				if !slices.Contains(rep.Failed(), name) {
					t.Errorf("failed scenarios %v, want %s among them", rep.Failed(), name)
				}
			}
			// The server itself dedups: the failure is the report, not a
			// double charge.
			if row, _ := rep.Row(conformance.ScenarioRedelivery); row.MaxEffects != 1 {
				t.Errorf("redelivery saw at most %d objects per key, want 1: the server dedups, the effect misreports", row.MaxEffects)
			}
		})
	}
}

// Configurations that misread an application failure the kit answers
// with the connection up (httpkeytest's FailNextReplyInFront and
// ConflictNext): a rule that calls every 5xx Transient promises that
// nothing was applied, which a gateway's 500 after the server created the
// object breaks; a rule that calls a 409 a refusal gives up on a key
// whose concurrent request may still apply it. app-faults catches both.
func TestCounterexampleAppFaultsMisreadFail(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		rule httpkey.Rule
		want string
	}{
		{"5xx read as Transient", httpkey.Rule{Outcome: httpkey.Transient, Status: []int{500, 502, 503, 504}}, "ErrTransient"},
		{"409 read as Refused", httpkey.Rule{Outcome: httpkey.Refused, Status: []int{409}}, "is not retryable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			effect := append(effectFor(24*time.Hour), httpkey.WithRule(tc.rule))
			rep := conformance.Run(t, "counterexample: httpkey with a rule: "+tc.name,
				func(t testing.TB) conformance.Harness[Payment] {
					return newHarness(t, preset{server: replayed, effect: effect}, false)
				}, conformance.Only(conformance.ScenarioAppFaults), conformance.ReportOnly())
			row, _ := rep.Row(conformance.ScenarioAppFaults)
			if row.Verdict != conformance.Fail {
				t.Fatalf("app-faults: %s, want FAIL (notes %v)", row.Verdict, row.Notes)
			}
			if !strings.Contains(strings.Join(row.Failures, "\n"), tc.want) {
				t.Errorf("app-faults failed without %q: %v", tc.want, row.Failures)
			}
			t.Logf("caught: %s", row.Failures[0])
		})
	}
}
