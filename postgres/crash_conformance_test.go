package postgres_test

import (
	"context"
	"errors"
	"os"
	"strings"
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
	rep := conformance.RunJournal(t, "postgres.Journal (UNLOGGED table)", func(t testing.TB) conformance.JournalHarness {
		url, restart, crash := pgtest.DedicatedDB(t)
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
		}{&journalHarness{url: url}, restart, crash}
	}, conformance.Only(conformance.JournalBackendRestart, conformance.JournalCrashRestart), conformance.ReportOnly())
	if row, _ := rep.Row(conformance.JournalBackendRestart); row.Verdict != conformance.Pass {
		t.Errorf("backend-restart: %s, want pass: a clean restart keeps an unlogged table (%v)", row.Verdict, row.Failures)
	}
	if row, _ := rep.Row(conformance.JournalCrashRestart); row.Verdict != conformance.Fail {
		t.Errorf("crash-restart: %s, want FAIL: crash recovery empties an unlogged table", row.Verdict)
	}
}

// TestJournalUnloggedWithoutCrashRestarter: the same UNLOGGED journal
// with a clean Restarter and no CrashRestarter passes backend-restart,
// and the strict rule rejects it: durability cannot be verified, naming
// crash-restart and the capability.
func TestJournalUnloggedWithoutCrashRestarter(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("DATABASE_URL is set: its server is not the test's to restart")
	}
	rep := conformance.RunJournal(t, "postgres.Journal (UNLOGGED table, no CrashRestarter)", func(t testing.TB) conformance.JournalHarness {
		url, restart, _ := pgtest.DedicatedDB(t)
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
		}{&journalHarness{url: url}, restart}
	}, conformance.Only(conformance.JournalBackendRestart, conformance.JournalCrashRestart), conformance.ReportOnly())
	if row, _ := rep.Row(conformance.JournalBackendRestart); row.Verdict != conformance.Pass {
		t.Errorf("backend-restart: %s %v, want pass", row.Verdict, row.Failures)
	}
	err := rep.Verify()
	if !errors.Is(err, conformance.ErrUnverified) || !strings.Contains(err.Error(), "crash-restart: harness does not implement conformance.CrashRestarter") {
		t.Errorf("Verify = %v; want the durability unverified for want of a CrashRestarter", err)
	}
}
