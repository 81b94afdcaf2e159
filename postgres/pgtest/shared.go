package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"effectively.dev/internal/testserver"
)

// shared holds the test binary's shared clusters: by Options.key, and by
// testserver.DedicatedKey.
var shared = testserver.Registry[*Cluster]{Kit: "pgtest"}

// key identifies the options that matter for a shared primary.
func (o Options) key() string { return fmt.Sprintf("%t %q", o.Durable, o.Settings) }

// Shared returns the test binary's shared default (non-durable) cluster,
// starting it on first use (one to two seconds); it is the one DB uses,
// for code that has no testing.TB (an Example). It ignores DATABASE_URL.
// Do not stop it: [Main] does.
func Shared() (*Cluster, error) { return sharedWith(Options{}) }

// sharedWith returns the shared cluster for opts, starting it if needed.
func sharedWith(opts Options) (*Cluster, error) { return registered(opts.key(), opts) }

// registered returns the cluster registered under key, starting it with
// opts on first use; shutdown stops it.
func registered(key string, opts Options) (*Cluster, error) {
	return shared.Get(key, func() (*Cluster, error) { return New(opts) })
}

// shutdown stops the shared clusters started by DB, DBWith, Shared and
// DedicatedDB, waiting for any that are still starting. Stop errors are
// printed to stderr. A later DB call starts a new cluster. [Main] calls it.
func shutdown() { shared.StopAll() }

// Main runs the tests, stops the shared clusters, and then, if the tests
// passed, checks with goleak that no goroutine outlived them (leakOpts, such
// as goleak.IgnoreTopFunction, excuse known long-lived goroutines). It
// returns the exit code for os.Exit. Every package that uses DB, DBWith or
// DedicatedDB should have
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// or else its servers linger until the test process exits (and then get
// SIGQUIT from the kernel, leaving their temporary directories behind).
func Main(m *testing.M, leakOpts ...goleak.Option) int {
	return testserver.Main(m, "pgtest", shutdown, leakOpts...)
}

// DB creates a brand-new empty database for t and returns its URL; it is
// dropped (WITH (FORCE), closing leftover connections) when t ends. The
// database lives on a non-durable cluster shared by the test binary, started
// on the first call (one to two seconds); each later call costs tens of
// milliseconds. If DATABASE_URL is set, the database is created on that
// server instead, which must allow CREATE DATABASE. If no server can be
// started, DB fails t with an error that says what to install.
func DB(t testing.TB) string {
	t.Helper()
	return DBWith(t, Options{})
}

// DBWith is DB on a shared cluster started with opts, such as
// Options{Durable: true} for benchmarks. The test binary starts one such
// cluster per distinct Durable and Settings (Name is ignored) and shares it.
// With DATABASE_URL set, opts are ignored.
func DBWith(t testing.TB, opts Options) string {
	t.Helper()
	admin := os.Getenv("DATABASE_URL")
	if admin == "" {
		c, err := sharedWith(opts)
		if err != nil {
			t.Fatalf("%v", err)
		}
		admin = c.URL("postgres")
	}
	return createDB(t, admin)
}

// RestartFunc restarts the server of a database made by [DedicatedDB]. Its
// Restart method makes it a conformance.Restarter, so a conformance
// harness can embed it.
type RestartFunc func(ctx context.Context) error

// Restart calls f(ctx).
func (f RestartFunc) Restart(ctx context.Context) error { return f(ctx) }

// DedicatedDB is [DB] on a cluster of t's top-level test's own, which the
// test may restart: restart does a [Cluster.Restart] of that cluster (every
// client of every database on it is disconnected; committed data survives),
// and crash a [Cluster.StopImmediate] (no checkpoint, every client cut)
// and a start on the same port, which runs crash recovery: committed data
// survives, UNLOGGED tables come back empty.
// The cluster is started on the top-level test's first call (one to two
// seconds) and is shared by its subtests, each getting a fresh database on
// it, so subtests that restart it must not run in parallel with subtests
// that use it; other tests never see it. shutdown (via [Main]) stops it.
//
// If DATABASE_URL is set, the database is created on that server, as DB
// does, and restart and crash are nil: that server is not the test's to
// restart or crash.
func DedicatedDB(t testing.TB) (url string, restart RestartFunc, crash CrashRestartFunc) {
	t.Helper()
	if admin := os.Getenv("DATABASE_URL"); admin != "" {
		return createDB(t, admin), nil, nil
	}
	c, err := registered(testserver.DedicatedKey(t), Options{})
	if err != nil {
		t.Fatalf("%v", err)
	}
	return createDB(t, c.URL("postgres")), testserver.Bound(c.Restart), crashRestart(c)
}

// createDB creates a database for t on the server admin (the URL of its
// postgres database), dropped when t ends, and returns its URL.
func createDB(t testing.TB, admin string) string {
	t.Helper()
	name := testserver.DBName(t.Name(), 63)
	ident := pgx.Identifier{name}.Sanitize()
	testserver.CreateDB(t,
		func(ctx context.Context) error { return execAdmin(ctx, admin, "CREATE DATABASE "+ident) },
		func(ctx context.Context) error {
			return execAdmin(ctx, admin, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
		})
	dbURL, err := withDatabase(admin, name)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return dbURL
}

// withDatabase returns the connection string admin (a URL or a keyword/value
// string) with its database replaced by name.
func withDatabase(admin, name string) (string, error) {
	if !strings.HasPrefix(admin, "postgres://") && !strings.HasPrefix(admin, "postgresql://") {
		return admin + " dbname=" + name, nil // later keywords win; name needs no quoting
	}
	u, err := url.Parse(admin)
	if err != nil {
		return "", fmt.Errorf("pgtest: DATABASE_URL: %w", err)
	}
	u.Path, u.RawPath = "/"+name, ""
	return u.String(), nil
}
