package mysql_test

import (
	"context"
	"database/sql"
	"os"
	"testing"

	"effectively.dev/conformance"
	"effectively.dev/effects/journal"
	"effectively.dev/mysql"
	"effectively.dev/mysql/mysqltest"
)

// journalHarness opens mysql.Journal instances over one database, each
// with its own *sql.DB whose driver calls go through the suite's faults
// (conformance.Faults.SQLConnector).
type journalHarness struct{ dsn string }

func (h *journalHarness) Open(ctx context.Context, f *conformance.Faults) (journal.Journal, func(), error) {
	db, err := faultedDB(h.dsn, f)
	if err != nil {
		return nil, nil, err
	}
	j, err := mysql.NewJournal(db, "conformance")
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return j, func() { db.Close() }, nil
}

// oneClock is why clock-skew cannot show anything here: the lease's end
// is computed and compared by the server's NOW(6) in the statements
// themselves, so no instance's clock judges a lease, and the journal has
// no clock of the process a test could skew.
const oneClock = "leases are judged by the database server's NOW(6), one clock for every instance; mysql.Journal reads no process clock a test could skew"

// journalAllow says what the journal suite cannot verify here: clock-skew
// (one clock, see oneClock), and restarts when MYSQL_DSN names a server
// that is not the test's.
func journalAllow() []conformance.JournalOption {
	if os.Getenv("MYSQL_DSN") != "" {
		return []conformance.JournalOption{conformance.AllowUnverified(oneClock+"; MYSQL_DSN's server is not the test's to restart or crash",
			conformance.JournalClockSkew, conformance.JournalBackendRestart, conformance.JournalCrashRestart)}
	}
	return []conformance.JournalOption{conformance.AllowUnverified(oneClock, conformance.JournalClockSkew)}
}

// newJournalHarness returns a journal harness on a database of its own,
// on the top-level test's own server, which the suite may restart and
// crash (SIGKILL of mysqld).
func newJournalHarness(t testing.TB) conformance.JournalHarness {
	dsn, restart, crash := mysqltest.DedicatedDB(t)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := mysql.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	h := &journalHarness{dsn: dsn}
	if restart == nil {
		return h // MYSQL_DSN: not ours to restart
	}
	return struct {
		*journalHarness
		mysqltest.RestartFunc
		mysqltest.CrashRestartFunc
	}{h, restart, crash}
}

// TestJournalConformance holds mysql.Journal to the journal.Journal
// contract, a clean restart and a crash restart of the server included
// when the server is the test's own.
func TestJournalConformance(t *testing.T) {
	rep := conformance.RunJournal(t, "mysql.Journal", newJournalHarness, journalAllow()...)
	for _, row := range rep.Rows {
		restarts := row.Scenario == conformance.JournalBackendRestart || row.Scenario == conformance.JournalCrashRestart
		if row.Verdict == conformance.NotRun && row.Scenario != conformance.JournalClockSkew && !(restarts && os.Getenv("MYSQL_DSN") != "") {
			t.Errorf("%s: not run: %s", row.Scenario, row.Skipped)
		}
	}
}
