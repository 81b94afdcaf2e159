package counterexamples_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/conformance"
	"effectively.dev/conformance/internal/counterexamples"
	"effectively.dev/effects"
	"effectively.dev/postgres/pgtest"
)

// TestCrashRestartCatchesUnloggedDedup: a dedup table that an immediate
// stop empties passes a clean backend restart and fails crash-restart;
// the same dedup in a logged table (the control) passes both.
func TestCrashRestartCatchesUnloggedDedup(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("DATABASE_URL is set: its server is not the test's to crash")
	}
	for _, tc := range []struct {
		name     string
		unlogged bool
		build    func(*pgxpool.Pool) effects.Effect[counterexamples.Payment]
	}{
		{"unlogged dedup table", true, func(p *pgxpool.Pool) effects.Effect[counterexamples.Payment] {
			return counterexamples.UnloggedDedup{DB: p}
		}},
		{"control: logged dedup table", false, func(p *pgxpool.Pool) effects.Effect[counterexamples.Payment] {
			return counterexamples.UnloggedDedup{DB: p}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := conformance.Run(t, tc.name, func(t testing.TB) conformance.Harness[counterexamples.Payment] {
				url, restart, crash := pgtest.DedicatedDB(t)
				db, err := pgxpool.New(context.Background(), url)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(db.Close)
				if _, err := db.Exec(context.Background(), counterexamples.Schema); err != nil {
					t.Fatal(err)
				}
				if tc.unlogged {
					if _, err := db.Exec(context.Background(), counterexamples.UnloggedSchema); err != nil {
						t.Fatal(err)
					}
				}
				return struct {
					*harness
					pgtest.RestartFunc
					pgtest.CrashRestartFunc
				}{&harness{url: url, db: db, build: simple(tc.build)},
					func(ctx context.Context) error { defer db.Reset(); return restart(ctx) },
					func(ctx context.Context) error { defer db.Reset(); return crash(ctx) }}
			}, conformance.Only(conformance.ScenarioRestart, conformance.ScenarioCrashRestart), conformance.ReportOnly())
			restartRow, _ := rep.Row(conformance.ScenarioRestart)
			crashRow, _ := rep.Row(conformance.ScenarioCrashRestart)
			if restartRow.Verdict != conformance.Pass {
				t.Errorf("backend-restart: %s, want pass: a clean restart keeps the table (%v)", restartRow.Verdict, restartRow.Failures)
			}
			want := conformance.Pass
			if tc.unlogged {
				want = conformance.Fail
			}
			if crashRow.Verdict != want {
				t.Errorf("crash-restart: %s, want %s (%v)", crashRow.Verdict, want, crashRow.Failures)
			}
		})
	}
}
