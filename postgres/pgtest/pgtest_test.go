package pgtest_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"effectively.dev/internal/testserver"
	"effectively.dev/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func exec(t *testing.T, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func queryString(t *testing.T, conn *pgx.Conn, sql string) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func TestDB(t *testing.T) {
	conn := connect(t, pgtest.DB(t))
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	exec(t, conn, "INSERT INTO t VALUES (1, 'one')")
	if got := queryString(t, conn, "SELECT v FROM t WHERE id = 1"); got != "one" {
		t.Errorf("got %q, want one", got)
	}
}

func TestDBIsolated(t *testing.T) {
	url1, url2 := pgtest.DB(t), pgtest.DB(t)
	if url1 == url2 {
		t.Fatalf("same URL twice: %s", url1)
	}
	c1, c2 := connect(t, url1), connect(t, url2)
	exec(t, c1, "CREATE TABLE only_in_one (id int)")
	if got := queryString(t, c2, "SELECT count(*)::text FROM pg_tables WHERE tablename = 'only_in_one'"); got != "0" {
		t.Errorf("table visible in the other database")
	}
	db1, db2 := queryString(t, c1, "SELECT current_database()"), queryString(t, c2, "SELECT current_database()")
	if db1 == db2 || !strings.HasPrefix(db1, "testdbisolated_") || len(db1) > 63 {
		t.Errorf("database names %q, %q", db1, db2)
	}
}

func TestDBDropped(t *testing.T) {
	var name string
	t.Run("inner", func(t *testing.T) {
		name = queryString(t, connect(t, pgtest.DB(t)), "SELECT current_database()")
	})
	c, err := pgtest.Shared()
	if err != nil {
		t.Fatal(err)
	}
	conn := connect(t, c.URL("postgres"))
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("database %s still exists after its test ended", name)
	}
}

func TestDBLongName(t *testing.T) {
	t.Run(strings.Repeat("Very Long/Sub-Test.Name ", 10), func(t *testing.T) {
		name := queryString(t, connect(t, pgtest.DB(t)), "SELECT current_database()")
		if len(name) > 63 || strings.ContainsAny(name, " /-.") {
			t.Errorf("bad database name %q", name)
		}
	})
}

func TestDurability(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("DATABASE_URL is set: its durability settings are not pgtest's")
	}
	for _, durable := range []bool{false, true} {
		t.Run(fmt.Sprint("durable=", durable), func(t *testing.T) {
			conn := connect(t, pgtest.DBWith(t, pgtest.Options{Durable: durable}))
			want := map[bool]string{false: "off", true: "on"}[durable]
			for setting, want := range map[string]string{
				"synchronous_commit": "on",
				"fsync":              want,
				"full_page_writes":   want,
				"wal_level":          "replica",
				"max_connections":    "200",
			} {
				if got := queryString(t, conn, "SHOW "+setting); got != want {
					t.Errorf("%s = %s, want %s", setting, got, want)
				}
			}
		})
	}
}

func TestDatabaseURL(t *testing.T) {
	c, err := pgtest.Shared()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("DATABASE_URL", c.URL("postgres"))
	var name string
	t.Run("inner", func(t *testing.T) {
		url := pgtest.DB(t)
		if !strings.Contains(url, fmt.Sprintf("127.0.0.1:%d/", c.Port())) {
			t.Errorf("URL %s is not on DATABASE_URL's server", url)
		}
		name = queryString(t, connect(t, url), "SELECT current_database()")
	})
	var n int
	if err := connect(t, c.URL("postgres")).QueryRow(context.Background(),
		"SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil || n != 0 {
		t.Errorf("database %s not dropped (count %d, err %v)", name, n, err)
	}
}

func TestSettingsAndStop(t *testing.T) {
	c, err := pgtest.New(pgtest.Options{Settings: map[string]string{"work_mem": "7MB"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx := context.Background()
	if err := c.CreateDatabase(ctx, "Mixed Case"); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, c.URL("Mixed Case"))
	if got := queryString(t, conn, "SHOW work_mem"); got != "7MB" {
		t.Errorf("work_mem = %s, want 7MB", got)
	}
	conn.Close(ctx)
	if _, err := os.Stat(c.Dir() + "/data/PG_VERSION"); err != nil {
		t.Error(err)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := os.Stat(c.Dir()); !os.IsNotExist(err) {
		t.Errorf("Dir still there after Stop: %v", err)
	}
}

func TestReplication(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	primary, err := pgtest.New(pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Stop()
	standby, err := primary.StartStandby(pgtest.Options{Name: "replica one"})
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Stop()
	if standby.Port() == primary.Port() || standby.Dir() == primary.Dir() {
		t.Fatalf("standby shares port or dir with primary")
	}

	p := connect(t, primary.URL("postgres"))
	exec(t, p, "ALTER SYSTEM SET synchronous_standby_names = '\"replica one\"'")
	exec(t, p, "SELECT pg_reload_conf()")
	pgtest.WaitFor(t, ctx, p, "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'replica one'", "sync")
	exec(t, p, "CREATE TABLE t (v text)")
	exec(t, p, "INSERT INTO t VALUES ('replicated')")

	s := connect(t, standby.URL("postgres"))
	if got := queryString(t, s, "SELECT pg_is_in_recovery()::text"); got != "true" {
		t.Fatalf("standby pg_is_in_recovery = %s", got)
	}
	// synchronous_commit=on waits for the standby to flush, not to apply.
	pgtest.WaitFor(t, ctx, s, "SELECT coalesce(max(v), '') FROM t", "replicated")

	if err := primary.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if c, err := pgx.Connect(ctx, primary.URL("postgres")); err == nil {
		c.Close(ctx)
		t.Fatal("primary still accepts connections after StopImmediate")
	}
	if err := primary.StopImmediate(); err != nil {
		t.Fatalf("second StopImmediate: %v", err)
	}

	if _, err := s.Exec(ctx, "INSERT INTO t VALUES ('x')"); err == nil {
		t.Fatal("write succeeded on standby before promotion")
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	exec(t, s, "INSERT INTO t VALUES ('after promotion')")
	if got := queryString(t, s, "SELECT count(*)::text FROM t"); got != "2" {
		t.Errorf("count = %s, want 2", got)
	}
	if err := primary.Stop(); err != nil {
		t.Errorf("Stop after StopImmediate: %v", err)
	}
}

func TestBinariesNotFound(t *testing.T) {
	t.Setenv("PGTEST_BIN", t.TempDir())
	_, err := pgtest.New(pgtest.Options{})
	if err == nil || !strings.Contains(err.Error(), "PGTEST_BIN") {
		t.Fatalf("err = %v, want one about PGTEST_BIN", err)
	}
}

func TestRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgtest.New(pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	port, dir := c.Port(), c.Dir()
	conn := connect(t, c.URL("postgres"))
	exec(t, conn, "CREATE TABLE t (v text)")
	exec(t, conn, "INSERT INTO t VALUES ('before')")
	before := queryString(t, conn, "SELECT pg_postmaster_start_time()::text")

	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	if c.Port() != port || c.Dir() != dir {
		t.Errorf("restarted on port %d dir %s, want %d %s", c.Port(), c.Dir(), port, dir)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("a connection from before the restart still works")
	}
	conn = connect(t, c.URL("postgres"))
	if got := queryString(t, conn, "SELECT pg_postmaster_start_time()::text"); got == before {
		t.Errorf("server start time unchanged (%s): not restarted", got)
	}
	exec(t, conn, "INSERT INTO t VALUES ('after')")
	conn.Close(ctx)

	// After a crash, Restart starts the server, which recovers.
	if err := c.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, connect(t, c.URL("postgres")), "SELECT string_agg(v, ',' ORDER BY v) FROM t"); got != "after,before" {
		t.Errorf("rows after crash and restart: %q, want after,before", got)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(); err == nil {
		t.Error("Restart after Stop succeeded")
	}
}

func TestDedicatedDB(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("DATABASE_URL is set: DedicatedDB uses it and cannot restart it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	shared, err := pgtest.Shared()
	if err != nil {
		t.Fatal(err)
	}
	var first string
	t.Run("one", func(t *testing.T) {
		url, restart, _ := pgtest.DedicatedDB(t)
		if strings.Contains(url, fmt.Sprintf(":%d/", shared.Port())) {
			t.Fatalf("DedicatedDB %s is on the shared cluster", url)
		}
		first = url[:strings.LastIndex(url, "/")]
		conn := connect(t, url)
		exec(t, conn, "CREATE TABLE t (v text)")
		exec(t, conn, "INSERT INTO t VALUES ('kept')")
		if err := restart.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		if got := queryString(t, connect(t, url), "SELECT v FROM t"); got != "kept" {
			t.Errorf("after restart: %q", got)
		}
	})
	t.Run("two", func(t *testing.T) {
		url, _, _ := pgtest.DedicatedDB(t)
		if got := url[:strings.LastIndex(url, "/")]; got != first {
			t.Errorf("second subtest got server %s, want the top-level test's %s", got, first)
		}
	})
	t.Run("database url", func(t *testing.T) {
		t.Setenv("DATABASE_URL", shared.URL("postgres"))
		url, restart, crash := pgtest.DedicatedDB(t)
		if restart != nil || crash != nil || !strings.Contains(url, fmt.Sprintf(":%d/", shared.Port())) {
			t.Errorf("with DATABASE_URL: %s, restart nil %t, crash nil %t; want DATABASE_URL's server and neither", url, restart == nil, crash == nil)
		}
	})
}

// TestStandbyThroughProxy shows what a stalled replication link does to an
// asynchronous standby: commits acknowledged by the primary after the stall
// never reach it.
func TestStandbyThroughProxy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	primary, err := pgtest.New(pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Stop()
	proxy, err := testserver.NewProxy(fmt.Sprintf("127.0.0.1:%d", primary.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	standby, err := primary.StartStandby(pgtest.Options{Upstream: proxy.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Stop()

	p, s := connect(t, primary.URL("postgres")), connect(t, standby.URL("postgres"))
	pgtest.WaitFor(t, ctx, p, "SELECT count(*)::text FROM pg_stat_replication WHERE state = 'streaming'", "1")
	if got := queryString(t, s, "SELECT current_setting('primary_conninfo')"); !strings.Contains(got, "port='"+proxy.Addr()[strings.LastIndex(proxy.Addr(), ":")+1:]+"'") {
		t.Errorf("standby's primary_conninfo %q does not name the proxy %s", got, proxy.Addr())
	}
	exec(t, p, "CREATE TABLE t (v text)")
	exec(t, p, "INSERT INTO t VALUES ('flowing')")
	pgtest.WaitFor(t, ctx, s, "SELECT count(*)::text FROM t", "1")

	proxy.Stall()
	exec(t, p, "INSERT INTO t VALUES ('held back')") // acknowledged: asynchronous replication
	time.Sleep(300 * time.Millisecond)
	if got := queryString(t, s, "SELECT count(*)::text FROM t"); got != "1" {
		t.Fatalf("standby has %s rows while the link is stalled, want 1", got)
	}
	proxy.Resume()
	pgtest.WaitFor(t, ctx, s, "SELECT count(*)::text FROM t", "2")
}

// A Pair's standby is synchronous: with the link stalled a commit is not
// acknowledged; after a failover the promoted standby has every
// acknowledged commit and a pool on Pair.URL finds it. Made asynchronous
// again, the primary acknowledges while the link is stalled.
func TestPairSynchronousFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pair := pgtest.StartPair(t, pgtest.Options{Name: "sync one"})
	if err := pair.Primary.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	p := connect(t, pair.Primary.URL("app"))
	pgtest.WaitFor(t, ctx, p, "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'sync one'", "sync")
	exec(t, p, "CREATE TABLE t (v text)")
	exec(t, p, "INSERT INTO t VALUES ('before the stall')")

	pair.Link.Stall()
	committed := make(chan error, 1)
	go func() {
		_, err := p.Exec(ctx, "INSERT INTO t VALUES ('waits for the standby')")
		committed <- err
	}()
	select {
	case err := <-committed:
		t.Fatalf("a commit was acknowledged while the synchronous standby was cut off (err %v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	pair.Link.Resume()
	if err := <-committed; err != nil {
		t.Fatal(err)
	}

	if err := pair.Failover(ctx); err != nil {
		t.Fatal(err)
	}
	s := connect(t, pair.URL("app"))
	if got := queryString(t, s, "SELECT inet_server_port()::text"); got != fmt.Sprint(pair.Standby.Port()) {
		t.Fatalf("Pair.URL connected to port %s, want the promoted standby's %d", got, pair.Standby.Port())
	}
	if got := queryString(t, s, "SELECT string_agg(v, ',' ORDER BY v) FROM t"); got != "before the stall,waits for the standby" {
		t.Errorf("rows on the new primary: %q", got)
	}
	exec(t, s, "INSERT INTO t VALUES ('after the failover')")
}

func TestSetSynchronousStandbysOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pair := pgtest.StartPair(t, pgtest.Options{})
	if err := pair.Primary.SetSynchronousStandbys(ctx); err != nil {
		t.Fatal(err)
	}
	p := connect(t, pair.Primary.URL("postgres"))
	if got := queryString(t, p, "SHOW synchronous_standby_names"); got != "" {
		t.Fatalf("synchronous_standby_names = %q, want empty", got)
	}
	pair.Link.Stall()
	defer pair.Link.Resume()
	done := make(chan error, 1)
	go func() { _, err := p.Exec(ctx, "CREATE TABLE acked_alone (v int)"); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an asynchronous primary waited for its cut-off standby")
	}
	if err := pair.Primary.SetSynchronousStandbys(ctx, ""); err == nil {
		t.Error("an empty standby name was accepted")
	}
}

func TestReadWriteURL(t *testing.T) {
	c := pgtest.Start(t, pgtest.Options{})
	url := pgtest.ReadWriteURL("my db", c, c)
	want := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/my%%20db?sslmode=disable&target_session_attrs=read-write&connect_timeout=2", c.Port(), c.Port())
	if url != want {
		t.Fatalf("ReadWriteURL = %s, want %s", url, want)
	}
	if err := c.CreateDatabase(context.Background(), "my db"); err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, connect(t, url), "SELECT current_database()"); got != "my db" {
		t.Errorf("connected to %q", got)
	}
}

// Start stops its cluster and removes its directory when the test
// ends.
func TestStartCleansUp(t *testing.T) {
	var dir string
	t.Run("inner", func(t *testing.T) {
		c := pgtest.Start(t, pgtest.Options{})
		dir = c.Dir()
		if _, err := os.Stat(dir); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("cluster directory %s still there after the test: %v", dir, err)
	}
}
