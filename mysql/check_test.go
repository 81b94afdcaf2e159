package mysql_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"

	"effectively.dev/effects"
	"effectively.dev/mysql"
	"effectively.dev/mysql/mysqltest"
)

// TestCheck: Check passes on the migrated schema with the safe settings,
// and refuses a missing table, innodb_flush_log_at_trx_commit other than
// 1, and sync_binlog other than 1 with the binary log on, each as a
// ConfigError naming it (the settings also wrap ErrUnsafeDurability),
// unless the matching option accepts it.
func TestCheck(t *testing.T) {
	ctx := testCtx(t)
	t.Run("safe", func(t *testing.T) {
		db, _ := newDB(t)
		eff, _ := mysql.New(db, "s", writeLedger)
		j, _ := mysql.NewJournal(db, "s")
		if err := eff.Check(ctx); err != nil {
			t.Errorf("Effect.Check: %v", err)
		}
		if err := j.Check(ctx); err != nil {
			t.Errorf("Journal.Check: %v", err)
		}
	})
	t.Run("missing table", func(t *testing.T) {
		db, err := sql.Open("mysql", mysqltest.DB(t))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		eff, _ := mysql.New(db, "s", writeLedger)
		wantConfig(t, eff.Check(ctx), "table effectively_keys", "mysql.Migrate", false)
	})
	t.Run("innodb_flush_log_at_trx_commit", func(t *testing.T) {
		s := mysqltest.Start(t, mysqltest.Options{Settings: map[string]string{"innodb_flush_log_at_trx_commit": "2"}})
		db := openMigrated(t, createDB(t, s))
		eff, _ := mysql.New(db, "s", writeLedger)
		wantConfig(t, eff.Check(ctx), "innodb_flush_log_at_trx_commit", "is 2", true)
		j, _ := mysql.NewJournal(db, "s")
		wantConfig(t, j.Check(ctx), "innodb_flush_log_at_trx_commit", "is 2", true)
		accepted, _ := mysql.New(db, "s", writeLedger, mysql.AllowUnsafeFlush())
		if err := accepted.Check(ctx); err != nil {
			t.Errorf("Check with AllowUnsafeFlush: %v", err)
		}
	})
	t.Run("sync_binlog", func(t *testing.T) {
		s := mysqltest.Start(t, mysqltest.Options{Settings: map[string]string{"log-bin": "binlog", "server-id": "1", "sync_binlog": "0"}})
		db := openMigrated(t, createDB(t, s))
		eff, _ := mysql.New(db, "s", writeLedger)
		wantConfig(t, eff.Check(ctx), "sync_binlog", "binary log on", true)
		accepted, _ := mysql.New(db, "s", writeLedger, mysql.AllowUnsafeBinlogSync())
		if err := accepted.Check(ctx); err != nil {
			t.Errorf("Check with AllowUnsafeBinlogSync: %v", err)
		}
		if _, err := db.ExecContext(ctx, `SET GLOBAL sync_binlog = 1`); err != nil {
			t.Fatal(err)
		}
		if err := eff.Check(ctx); err != nil {
			t.Errorf("Check with sync_binlog = 1: %v", err)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/x")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		eff, _ := mysql.New(db, "s", writeLedger)
		if err := eff.Check(ctx); err == nil || effects.ClassOf(err) != effects.Retryable {
			t.Errorf("Check of an unreachable server: %v, want a retryable error", err)
		}
	})
}

// wantConfig checks that err is a ConfigError whose option is option and
// whose message says why, wrapping ErrUnsafeDurability when unsafe.
func wantConfig(t *testing.T, err error, option, why string, unsafe bool) {
	t.Helper()
	var cfg *effects.ConfigError
	switch {
	case !errors.As(err, &cfg) || cfg.Option != option || !strings.Contains(err.Error(), why):
		t.Errorf("Check: %v, want a ConfigError on %s saying %q", err, option, why)
	case errors.Is(err, mysql.ErrUnsafeDurability) != unsafe:
		t.Errorf("Check: %v: errors.Is(ErrUnsafeDurability) = %t, want %t", err, !unsafe, unsafe)
	}
}

// createDB creates a database on s and returns its DSN.
func createDB(t testing.TB, s *mysqltest.Server) string {
	t.Helper()
	if err := s.CreateDatabase(testCtx(t), "app"); err != nil {
		t.Fatal(err)
	}
	return s.DSN("app")
}
