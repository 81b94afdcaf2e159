package mysqltest_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"effectively.dev/mysql/mysqltest"
)

func TestMain(m *testing.M) { os.Exit(mysqltest.Main(m)) }

func open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestDB: each call is an empty database of its own, on a server whose
// commit settings are the safe ones and whose default collation is the
// case-insensitive one most installations have.
func TestDB(t *testing.T) {
	a, b := mysqltest.DB(t), mysqltest.DB(t)
	if a == b {
		t.Fatalf("two DB calls returned the same DSN %q", a)
	}
	db := open(t, a)
	if _, err := db.ExecContext(ctx(t), `CREATE TABLE t (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := open(t, b).QueryRowContext(ctx(t), `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the second database has %d tables (%v), want 0", n, err)
	}
	var flush, coll string
	if err := db.QueryRowContext(ctx(t), `SELECT @@innodb_flush_log_at_trx_commit, @@collation_database`).Scan(&flush, &coll); err != nil {
		t.Fatal(err)
	}
	if flush != "1" || !strings.HasSuffix(coll, "_ci") {
		t.Errorf("innodb_flush_log_at_trx_commit %s, collation %s; want 1 and a case-insensitive default", flush, coll)
	}
}

// TestRestartAndCrash: committed rows survive a clean restart and a
// SIGKILL of the server; clients are disconnected by both.
func TestRestartAndCrash(t *testing.T) {
	if os.Getenv("MYSQL_DSN") != "" {
		t.Skip("MYSQL_DSN is set: its server is not the test's to restart")
	}
	dsn, restart, crash := mysqltest.DedicatedDB(t)
	db := open(t, dsn)
	c := ctx(t)
	if _, err := db.ExecContext(c, `CREATE TABLE t (id int PRIMARY KEY) ENGINE=InnoDB`); err != nil {
		t.Fatal(err)
	}
	for i, step := range []func(context.Context) error{restart.Restart, crash.CrashRestart} {
		if _, err := db.ExecContext(c, `INSERT INTO t VALUES (?)`, i); err != nil {
			t.Fatal(err)
		}
		conn, err := db.Conn(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := step(c); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if err := conn.PingContext(c); err == nil {
			t.Errorf("step %d: a connection from before it still works", i)
		}
		conn.Close()
		var n int
		if err := db.QueryRowContext(c, `SELECT COUNT(*) FROM t`).Scan(&n); err != nil || n != i+1 {
			t.Errorf("after step %d: %d rows (%v), want %d", i, n, err, i+1)
		}
	}
}

// TestBinariesNotFound: without server binaries the error says what to
// install.
func TestBinariesNotFound(t *testing.T) {
	t.Setenv("MYSQLTEST_BIN", t.TempDir())
	_, err := mysqltest.NewServer(mysqltest.Options{})
	if err == nil || !strings.Contains(err.Error(), "apt-get install -y mariadb-server") {
		t.Errorf("New without binaries: %v, want an install hint", err)
	}
}

// TestAge moves the keys' timestamps back.
func TestAge(t *testing.T) {
	dsn := mysqltest.DB(t)
	db := open(t, dsn)
	c := ctx(t)
	if _, err := db.ExecContext(c, `CREATE TABLE effectively_keys (k int PRIMARY KEY, created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(c, `INSERT INTO effectively_keys (k) VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if err := mysqltest.Age(c, dsn, 400*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	var days int
	if err := db.QueryRowContext(c, `SELECT DATEDIFF(NOW(), created_at) FROM effectively_keys`).Scan(&days); err != nil || days != 400 {
		t.Errorf("aged by %d days (%v), want 400", days, err)
	}
}
