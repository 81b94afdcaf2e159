package mysqltest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"effectively.dev/internal/testserver"
)

// shared holds the test binary's shared servers: by Options.key, and by
// testserver.DedicatedKey.
var shared = testserver.Registry[*Server]{Kit: "mysqltest"}

// key identifies the options that matter for a shared server.
func (o Options) key() string { return fmt.Sprintf("%t %q", o.Durable, o.Settings) }

// Shared returns the test binary's shared default (non-durable) server,
// starting it on first use; it is the one DB uses. It ignores MYSQL_DSN.
// Do not stop it: [Main] does.
func Shared() (*Server, error) { return registered(Options{}.key(), Options{}) }

// registered returns the server registered under key, starting it with
// opts on first use; shutdown stops it.
func registered(key string, opts Options) (*Server, error) {
	return shared.Get(key, func() (*Server, error) { return newServer(opts) })
}

// shutdown stops the shared servers started by DB, dbWith, Shared and
// DedicatedDB, waiting for any that are still starting, and removes the
// initialized data directory they were copied from. Stop errors are
// printed to stderr. [Main] calls it.
func shutdown() {
	shared.StopAll()
	tmplMu.Lock()
	defer tmplMu.Unlock()
	if tmplDir != "" {
		os.RemoveAll(filepath.Dir(tmplDir))
		tmplDir = ""
	}
}

// Main runs the tests, stops the shared servers, and then, if the tests
// passed, checks with goleak that no goroutine outlived them (leakOpts
// excuse known long-lived goroutines). It returns the exit code for
// os.Exit. Every package that uses DB, DedicatedDB or Shared
// should have
//
//	func TestMain(m *testing.M) { os.Exit(mysqltest.Main(m)) }
func Main(m *testing.M, leakOpts ...goleak.Option) int {
	return testserver.Main(m, "mysqltest", shutdown, leakOpts...)
}

// DB creates a brand-new empty database for t and returns its DSN; it is
// dropped when t ends. The database lives on a non-durable server shared
// by the test binary, started on the first call; each later call costs
// tens of milliseconds. If MYSQL_DSN is set, the database is created on
// that server instead. If no server can be started, DB fails t with an
// error that says what to install.
func DB(t testing.TB) string {
	t.Helper()
	return dbWith(t, Options{})
}

// dbWith is DB on a shared server started with opts, such as
// Options{Durable: true} for benchmarks. The test binary starts one such
// server per distinct Durable and Settings and shares it. With MYSQL_DSN
// set, opts are ignored.
func dbWith(t testing.TB, opts Options) string {
	t.Helper()
	admin := os.Getenv("MYSQL_DSN")
	if admin == "" {
		s, err := registered(opts.key(), opts)
		if err != nil {
			t.Fatalf("%v", err)
		}
		admin = s.DSN("")
	}
	return createDB(t, admin)
}

// RestartFunc restarts the server of a database made by [DedicatedDB].
// Its Restart method makes it a conformance.Restarter, so a conformance
// harness can embed it.
type RestartFunc func(ctx context.Context) error

// Restart calls f(ctx).
func (f RestartFunc) Restart(ctx context.Context) error { return f(ctx) }

// CrashRestartFunc kills the server of a database made by [DedicatedDB]
// and starts it again. Its CrashRestart method makes it a
// conformance.CrashRestarter, so a conformance harness can embed it.
type CrashRestartFunc func(ctx context.Context) error

// CrashRestart calls f(ctx).
func (f CrashRestartFunc) CrashRestart(ctx context.Context) error { return f(ctx) }

// DedicatedDB is [DB] on a server of t's top-level test's own, which the
// test may restart: restart does a [Server.Restart] of that server (every
// client of every database on it is disconnected; committed data
// survives), and crash kills it with SIGKILL ([Server.Crash]) and starts
// it again on the same port, which runs InnoDB's crash recovery. The
// server is started on the top-level test's first call and is shared by
// its subtests, each getting a fresh database on it, so subtests that
// restart it must not run in parallel with subtests that use it; other
// tests never see it. [Main] stops it.
//
// If MYSQL_DSN is set, the database is created on that server, as DB
// does, and restart and crash are nil: that server is not the test's to
// restart or crash.
func DedicatedDB(t testing.TB) (dsn string, restart RestartFunc, crash CrashRestartFunc) {
	t.Helper()
	if admin := os.Getenv("MYSQL_DSN"); admin != "" {
		return createDB(t, admin), nil, nil
	}
	s := dedicated(t)
	return createDB(t, s.DSN("")), testserver.Bound(s.Restart), CrashRestartFunc(testserver.Bound(s.Crash))
}

// dedicated returns the server of t's top-level test, starting it on first
// use, or fails t.
func dedicated(t testing.TB) *Server {
	t.Helper()
	s, err := registered(testserver.DedicatedKey(t), Options{})
	if err != nil {
		t.Fatalf("%v", err)
	}
	return s
}

// createDB creates a database for t on the server admin (a DSN), dropped
// when t ends, and returns its DSN.
func createDB(t testing.TB, admin string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(admin)
	if err != nil {
		t.Fatalf("mysqltest: MYSQL_DSN: %v", err)
	}
	name := testserver.DBName(t.Name(), 64)
	testserver.CreateDB(t,
		func(ctx context.Context) error { return execAdmin(ctx, admin, "CREATE DATABASE "+quoteIdent(name)) },
		func(ctx context.Context) error {
			return execAdmin(ctx, admin, "DROP DATABASE IF EXISTS "+quoteIdent(name))
		})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// Age makes every record in the effectively tables of the database at dsn
// d older, as if d had passed since it was written: created_at (what
// Prune reads), updated_at and journal leases move back by d. Nothing is
// deleted. A conformance harness over MySQL calls it from its Age method
// (conformance.Ager), so the horizon scenario can redeliver a key "400
// days later" without waiting. Tables that do not exist are skipped.
// Timestamps are clamped at the start of TIMESTAMP's range (1970).
func Age(ctx context.Context, dsn string, d time.Duration) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return fmt.Errorf("mysqltest.Age: %w", err)
	}
	defer db.Close()
	micros := d.Microseconds()
	back := func(col string) string {
		return col + ` = GREATEST(` + col + ` - INTERVAL ? MICROSECOND, FROM_UNIXTIME(1))`
	}
	for _, u := range []struct {
		table, set string
		args       int
	}{
		{"effectively_keys", back("created_at"), 1},
		{"effectively_journal", back("created_at") + ", " + back("updated_at") + ", " + back("lease_until"), 3},
	} {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`, u.table).Scan(&n); err != nil {
			return fmt.Errorf("mysqltest.Age: %w", err)
		}
		if n == 0 {
			continue
		}
		args := make([]any, u.args)
		for i := range args {
			args[i] = micros
		}
		if _, err := db.ExecContext(ctx, `UPDATE `+u.table+` SET `+u.set, args...); err != nil {
			return fmt.Errorf("mysqltest.Age %s: %w", u.table, err)
		}
	}
	return nil
}
