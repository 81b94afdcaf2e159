package counterexamples_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/conformance"
	"effectively.dev/conformance/internal/counterexamples"
	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/postgres/pgtest"
)

// wantUnverified requires rep to hide its lie (no scenario failed), and
// the strict rule to reject it anyway: scenario not run, and Verify
// failing with ErrUnverified in words that name the scenario and say
// every phrase in says.
func wantUnverified(t *testing.T, rep conformance.Report, scenario string, says ...string) {
	t.Helper()
	if failed := rep.Failed(); len(failed) > 0 {
		t.Errorf("scenarios %v failed: the run must show nothing but what it could not verify", failed)
	}
	if row, _ := rep.Row(scenario); row.Verdict != conformance.NotRun {
		t.Errorf("%s: %s, want not run", scenario, row.Verdict)
	}
	err := rep.Verify()
	if !errors.Is(err, conformance.ErrUnverified) {
		t.Fatalf("Verify = %v: the liar passes the strict rule without the capability that catches it", err)
	}
	for _, want := range append([]string{scenario + ": "}, says...) {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the failure does not say %q:\n%v", want, err)
		}
	}
}

// bare hides every capability of a harness: what an author who never read
// about them writes.
type bare struct {
	conformance.Harness[counterexamples.Payment]
}

// TestStrictProcessScopedDedup: dedup in one process's memory, run
// without Attacher and WithSuccessorProcess, passes what runs and is
// rejected as unverified, naming successor-process and the capability.
func TestStrictProcessScopedDedup(t *testing.T) {
	build := simple(func(p *pgxpool.Pool) effects.Effect[counterexamples.Payment] {
		return counterexamples.ProcessScopedDedup{DB: p}
	})
	mk := maker(build)
	rep := conformance.Run(t, "counterexample/process-scoped-dedup without a successor process",
		func(t testing.TB) conformance.Harness[counterexamples.Payment] { return bare{mk(t)} },
		conformance.Only(conformance.ScenarioProcess, conformance.ScenarioRedelivery, conformance.ScenarioLostReply), conformance.ReportOnly())
	wantUnverified(t, rep, conformance.ScenarioProcess, "conformance.Attacher", "conformance.WithSuccessorProcess(attach)")
}

// TestStrictHorizonWithoutAger: a dedup that forgets keys after 2 s,
// declared "kept until pruned", run with Only(horizon) and no Ager, is
// rejected as unverified: Only never turns the missing Ager into a pass.
func TestStrictHorizonWithoutAger(t *testing.T) {
	mk := maker(simple(func(p *pgxpool.Pool) effects.Effect[counterexamples.Payment] {
		return counterexamples.ForgetfulDedup{DB: p}
	}))
	rep := conformance.Run(t, "counterexample/forgetful-dedup without Ager",
		func(t testing.TB) conformance.Harness[counterexamples.Payment] { return bare{mk(t)} },
		conformance.Only(conformance.ScenarioHorizon), conformance.ReportOnly())
	wantUnverified(t, rep, conformance.ScenarioHorizon, "harness does not implement conformance.Ager", "implement conformance.Ager")
	if f, _ := rep.Field(conformance.FieldHorizon); f.Status != conformance.NotVerified {
		t.Errorf("Horizon: %s, want not verified", f)
	}
}

// TestStrictUnloggedDedup: a dedup table a crash empties, run with a
// clean Restarter but no CrashRestarter, passes backend-restart and is
// rejected as unverified, naming crash-restart and the capability.
func TestStrictUnloggedDedup(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("DATABASE_URL is set: its server is not the test's to restart")
	}
	rep := conformance.Run(t, "counterexample/unlogged-dedup without CrashRestarter", func(t testing.TB) conformance.Harness[counterexamples.Payment] {
		url, restart, _ := pgtest.DedicatedDB(t)
		db, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		for _, schema := range []string{counterexamples.Schema, counterexamples.UnloggedSchema} {
			if _, err := db.Exec(context.Background(), schema); err != nil {
				t.Fatal(err)
			}
		}
		return struct {
			bare
			pgtest.RestartFunc
		}{bare{&harness{url: url, db: db, build: simple(func(p *pgxpool.Pool) effects.Effect[counterexamples.Payment] {
			return counterexamples.UnloggedDedup{DB: p}
		})}}, func(ctx context.Context) error { defer db.Reset(); return restart(ctx) }}
	}, conformance.Only(conformance.ScenarioRestart, conformance.ScenarioCrashRestart), conformance.ReportOnly())
	if row, _ := rep.Row(conformance.ScenarioRestart); row.Verdict != conformance.Pass {
		t.Errorf("backend-restart: %s %v, want pass", row.Verdict, row.Failures)
	}
	wantUnverified(t, rep, conformance.ScenarioCrashRestart, "harness does not implement conformance.CrashRestarter")
}

// openOnly is a journal harness without ClockSkewer.
type openOnly struct{ m *memjournal.Journal }

func (h openOnly) Open(context.Context, *conformance.Faults) (journal.Journal, func(), error) {
	return counterexamples.InstanceClock{Journal: h.m}, nil, nil
}

// TestStrictInstanceClock: a journal whose leases use each instance's
// clock passes every other journal scenario; without a ClockSkewer it is
// rejected as unverified, naming clock-skew, and a reason given for other
// scenarios does not excuse it.
func TestStrictInstanceClock(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []conformance.JournalOption
	}{
		{"no ClockSkewer", nil},
		{"a reason for other scenarios", []conformance.JournalOption{conformance.AllowUnverified("every instance reads the store's clock", conformance.JournalBackendRestart)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := append([]conformance.JournalOption{conformance.WithLease(200 * time.Millisecond), conformance.ReportOnly()}, c.opts...)
			rep := conformance.RunJournal(t, "counterexample: instance clock, "+c.name, func(testing.TB) conformance.JournalHarness { return openOnly{memjournal.New(nil)} }, opts...)
			wantUnverified(t, rep, conformance.JournalClockSkew, "harness does not implement conformance.ClockSkewer", "implement conformance.ClockSkewer")
			if err := rep.Verify(); err == nil || !strings.Contains(err.Error(), conformance.JournalClockSkew) {
				t.Errorf("Verify: %v, want an error naming %s", err, conformance.JournalClockSkew)
			}
			if f, _ := rep.Field(conformance.FieldLeases); f.Status != conformance.NotVerified ||
				!slices.ContainsFunc(f.LeftOut, func(l conformance.LeftOut) bool { return l.Scenario == conformance.JournalClockSkew && l.Blocks }) {
				t.Errorf("Leases: %s, want not verified for clock-skew", f)
			}
		})
	}
}
