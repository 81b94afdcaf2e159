package pgtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

// sharedCluster is a cluster started on first use and stopped by shutdown.
type sharedCluster struct {
	once sync.Once
	c    *Cluster
	err  error
}

var (
	sharedMu sync.Mutex
	shared   = map[string]*sharedCluster{} // by Options.key, and "dedicated " + top-level test name
)

var (
	dbSeq atomic.Int64
	// dbTag tells apart databases of test binaries that run at the same time
	// against one DATABASE_URL server (go test runs packages in parallel).
	dbTag = fmt.Sprintf("%06x", rand.Uint32()&0xffffff)
)

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
// opts on first use; shutdown stops it. Concurrent first callers wait for
// one start; a failed start is not retried.
func registered(key string, opts Options) (*Cluster, error) {
	sharedMu.Lock()
	s := shared[key]
	if s == nil {
		s = &sharedCluster{}
		shared[key] = s
	}
	sharedMu.Unlock()
	s.once.Do(func() { s.c, s.err = New(opts) })
	return s.c, s.err
}

// shutdown stops the shared clusters started by DB, DBWith, shared and DedicatedDB,
// waiting for any that are still starting. Stop errors are printed to
// stderr. A later DB call starts a new cluster. [Main] calls it.
func shutdown() {
	sharedMu.Lock()
	all := shared
	shared = map[string]*sharedCluster{}
	sharedMu.Unlock()
	for _, s := range all {
		s.once.Do(func() { s.err = errors.New("pgtest: shared cluster used during shutdown") })
		if s.c != nil {
			if err := s.c.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
	}
}

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
	code := m.Run()
	shutdown()
	if code == 0 {
		if err := goleak.Find(leakOpts...); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: goroutines leaked:", err)
			code = 1
		}
	}
	return code
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
// client of every database on it is disconnected; committed data survives).
// The cluster is started on the top-level test's first call (one to two
// seconds) and is shared by its subtests, each getting a fresh database on
// it, so subtests that restart it must not run in parallel with subtests
// that use it; other tests never see it. shutdown (via [Main]) stops it.
//
// If DATABASE_URL is set, the database is created on that server, as DB
// does, and restart is nil: that server is not the test's to restart.
func DedicatedDB(t testing.TB) (url string, restart RestartFunc) {
	t.Helper()
	if admin := os.Getenv("DATABASE_URL"); admin != "" {
		return createDB(t, admin), nil
	}
	top, _, _ := strings.Cut(t.Name(), "/")
	c, err := registered("dedicated "+top, Options{})
	if err != nil {
		t.Fatalf("%v", err)
	}
	restart = func(ctx context.Context) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return c.Restart()
	}
	return createDB(t, c.URL("postgres")), restart
}

// createDB creates a database for t on the server admin (the URL of its
// postgres database), dropped when t ends, and returns its URL.
func createDB(t testing.TB, admin string) string {
	t.Helper()
	name := dbName(t.Name())
	ident := pgx.Identifier{name}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := execAdmin(ctx, admin, "CREATE DATABASE "+ident); err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := execAdmin(ctx, admin, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			t.Errorf("%v", err)
		}
	})
	dbURL, err := withDatabase(admin, name)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return dbURL
}

// dbName makes a database name, at most 63 bytes, from a test name.
func dbName(testName string) string {
	suffix := fmt.Sprintf("_%s_%d", dbTag, dbSeq.Add(1))
	var b strings.Builder
	for _, r := range strings.ToLower(testName) {
		if 'a' <= r && r <= 'z' || '0' <= r && r <= '9' {
			b.WriteRune(r)
		} else if s := b.String(); s != "" && !strings.HasSuffix(s, "_") {
			b.WriteByte('_')
		}
	}
	base := b.String()
	base = strings.TrimRight(base[:min(len(base), 63-len(suffix))], "_")
	if base == "" {
		base = "db"
	}
	return base + suffix
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
