package postgres_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/conformance"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// TestJournalCrashRestartCatchesUnloggedJournal is the journal's
// crash-restart proven: postgres.Journal over a journal table an operator
// made UNLOGGED ("it only holds keys") passes a clean restart and fails
// crash-restart, which empties the table in crash recovery.
func TestJournalCrashRestartCatchesUnloggedJournal(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("DATABASE_URL is set: its server is not the test's to crash")
	}
	rep := conformance.EvaluateJournal(t, "postgres.Journal (UNLOGGED table)", func(t testing.TB) conformance.JournalHarness {
		url, restart := pgtest.DedicatedDB(t)
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if err := postgres.Migrate(context.Background(), pool); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(context.Background(), `ALTER TABLE effectively_journal SET UNLOGGED`); err != nil {
			t.Fatal(err)
		}
		return struct {
			*journalHarness
			pgtest.RestartFunc
			pgtest.CrashRestartFunc
		}{&journalHarness{url: url}, restart, pgtest.DedicatedCrash(t)}
	}, conformance.Only(conformance.JournalBackendRestart, conformance.JournalCrashRestart))
	if row, _ := rep.Row(conformance.JournalBackendRestart); row.Verdict != conformance.Pass {
		t.Errorf("backend-restart: %s, want pass: a clean restart keeps an unlogged table (%v)", row.Verdict, row.Failures)
	}
	if row, _ := rep.Row(conformance.JournalCrashRestart); row.Verdict != conformance.Fail {
		t.Errorf("crash-restart: %s, want FAIL: crash recovery empties an unlogged table", row.Verdict)
	}
}
