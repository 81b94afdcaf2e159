package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	moderncsqlite "modernc.org/sqlite"

	"effectively.dev/effects"

	"example.com/sqlite"
)

func openDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	c, err := moderncsqlite.NewConnector(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	return db
}

// TestCheck: Check passes the harness's settings, and refuses, as a
// *effects.ConfigError naming the setting, a synchronous level that
// acknowledges a commit before it is on disk, a journal that gives no
// atomic commit through a crash, and a missing table.
func TestCheck(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(tempDir(t), "check.db")
	good := openDB(t, dsn(path))
	if _, err := good.Exec(sqlite.Schema); err != nil {
		t.Fatal(err)
	}
	l, err := sqlite.New(good)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Check(ctx); err != nil {
		t.Errorf("Check with synchronous=FULL in WAL mode: %v", err)
	}
	for _, tc := range []struct{ name, dsn string }{
		{"synchronous=NORMAL", "file:" + path + "?_pragma=synchronous(NORMAL)"},
		{"journal_mode=MEMORY", "file:" + filepath.Join(tempDir(t), "mem.db") + "?_pragma=journal_mode(MEMORY)&_pragma=synchronous(FULL)"},
		{"no schema", "file:" + filepath.Join(tempDir(t), "empty.db") + "?_pragma=synchronous(FULL)"},
	} {
		l, err := sqlite.New(openDB(t, tc.dsn))
		if err != nil {
			t.Fatal(err)
		}
		var cfg *effects.ConfigError
		if err := l.Check(ctx); !errors.As(err, &cfg) || effects.ClassOf(err) != effects.InvalidConfig {
			t.Errorf("Check with %s: %v, want a *effects.ConfigError", tc.name, err)
		}
	}
	if _, err := sqlite.New(nil); effects.ClassOf(err) != effects.InvalidConfig {
		t.Errorf("New(nil): %v, want a config error", err)
	}
}

// TestCrashCopyNeedsTheLog: the crash restart must copy the write-ahead
// log with the database file. While a handle holds the database open,
// committed transactions can be in the log alone: a copy of the main
// file by itself loses them, which the suite would blame on the adapter.
func TestCrashCopyNeedsTheLog(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	admin, err := h.openAdmin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(ctx, `INSERT INTO entries (key, account, amount) VALUES (x'01', 'a', 1)`); err != nil {
		t.Fatal(err)
	}
	mainOnly := filepath.Join(tempDir(t), "main-only.db")
	if err := copyFile(h.path, mainOnly); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := openDB(t, dsn(mainOnly)).QueryRowContext(ctx, `SELECT count(*) FROM entries`).Scan(&n); err == nil && n != 0 {
		t.Fatalf("a copy of the main file alone shows %d entries: the commit was checkpointed, so this test shows nothing", n)
	}
	if err := h.CrashRestart(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := h.Total(ctx); err != nil || n != 1 {
		t.Errorf("after the crash restart (file and log copied): %d entries, %v; want the committed one", n, err)
	}
}
