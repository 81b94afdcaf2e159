package postgres_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/conformance"
	"effectively.dev/effects/journal"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// journalHarness opens postgres.Journal instances over one database, each
// with its own pool whose connections go through the suite's faults.
type journalHarness struct{ url string }

func (h *journalHarness) Open(ctx context.Context, f *conformance.Faults) (journal.Journal, func(), error) {
	cfg, err := pgxpool.ParseConfig(h.url)
	if err != nil {
		return nil, nil, err
	}
	cfg.ConnConfig.DialFunc = f.DialContext
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	j, err := postgres.NewJournal(pool, "conformance")
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return j, pool.Close, nil
}

// oneClock is why clock-skew cannot show anything here: the lease's end
// is computed and compared by the server's now() in the statements
// themselves, so no instance's clock judges a lease, and the journal has
// no clock of the process a test could skew.
const oneClock = "leases are judged by the database server's now(), one clock for every instance; postgres.Journal reads no process clock a test could skew"

// journalAllow says what the journal suite cannot verify here: clock-skew
// (one clock, see oneClock), and restarts when DATABASE_URL names a
// server that is not the test's.
func journalAllow() []conformance.JournalOption {
	if os.Getenv("DATABASE_URL") != "" {
		return []conformance.JournalOption{conformance.AllowUnverified(oneClock+"; DATABASE_URL's server is not the test's to restart or crash",
			conformance.JournalClockSkew, conformance.JournalBackendRestart, conformance.JournalCrashRestart)}
	}
	return []conformance.JournalOption{conformance.AllowUnverified(oneClock, conformance.JournalClockSkew)}
}

// TestJournalConformance holds postgres.Journal to the journal.Journal
// contract, a server restart included when the cluster is the test's own.
func TestJournalConformance(t *testing.T) {
	rep := conformance.RunJournal(t, "postgres.Journal", func(t testing.TB) conformance.JournalHarness {
		url, restart, crash := pgtest.DedicatedDB(t)
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if err := postgres.Migrate(context.Background(), pool); err != nil {
			t.Fatal(err)
		}
		h := &journalHarness{url: url}
		if restart == nil {
			return h // DATABASE_URL: not ours to restart
		}
		// A crash restart too: an immediate stop, crash recovery on start.
		return struct {
			*journalHarness
			pgtest.RestartFunc
			pgtest.CrashRestartFunc
		}{h, restart, crash}
	}, journalAllow()...)
	for _, row := range rep.Rows {
		restarts := row.Scenario == conformance.JournalBackendRestart || row.Scenario == conformance.JournalCrashRestart
		if row.Verdict == conformance.NotRun && row.Scenario != conformance.JournalClockSkew && !(restarts && os.Getenv("DATABASE_URL") != "") {
			t.Errorf("%s: not run: %s", row.Scenario, row.Skipped)
		}
	}
}
