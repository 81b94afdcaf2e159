package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"effectively.dev/effects"
)

var (
	_ effects.Checker = (*Effect[struct{}])(nil)
	_ effects.Checker = (*Journal)(nil)
)

const opCheck = "mysql.Check"

// ErrUnsafeDurability is what Check's error wraps, beside its
// [*effects.ConfigError], when the server's settings let an acknowledged
// commit be lost in a crash: innodb_flush_log_at_trx_commit other than 1
// (see [AllowUnsafeFlush]), or sync_binlog other than 1 while the binary
// log is on (see [AllowUnsafeBinlogSync]). A message acked after such a
// commit is gone, and so is its effect: nothing will redeliver it.
var ErrUnsafeDurability = errors.New("the server's settings let an acknowledged commit be lost in a crash: " +
	"set innodb_flush_log_at_trx_commit=1 and, with the binary log on, sync_binlog=1")

// Check reports whether Apply can keep its guarantee, with one read-only
// query: effectively_keys exists, is InnoDB (another engine does not
// commit the key with the write, or at all) and compares scope and key
// byte by byte (VARBINARY: a column in a case-insensitive or PAD SPACE
// collation merges distinct keys); innodb_flush_log_at_trx_commit is 1;
// and sync_binlog is 1 where the binary log is on. Each failure is an
// [*effects.ConfigError] naming the table, column or setting and saying
// why; the unsafe settings also wrap [ErrUnsafeDurability], and options
// given to [New] accept them ([AllowUnsafeFlush], [AllowUnsafeBinlogSync]).
// A server it cannot reach is retryable. The write's own tables are not
// checked. Run it at start-up, with [effects.Plan.Check].
func (e *Effect[In]) Check(ctx context.Context) error {
	return check(ctx, e.db, "effectively_keys", e.cfg.durability)
}

// Check reports whether the Journal can keep its records, as
// [Effect.Check] does for effectively_journal.
func (j *Journal) Check(ctx context.Context) error {
	return check(ctx, j.db, "effectively_journal", j.cfg)
}

// check runs checkSQL for table.
func check(ctx context.Context, db *sql.DB, table string, cfg durability) error {
	var (
		engine, notBinary sql.NullString
		flush, syncBinlog int64
		logBin            bool
	)
	if err := db.QueryRowContext(ctx, checkSQL, table, table).Scan(&engine, &notBinary, &flush, &syncBinlog, &logBin); err != nil {
		return classify(ctx, opCheck, "", err, false, false).err
	}
	switch {
	case !engine.Valid:
		return &effects.ConfigError{Op: opCheck, Option: "table " + table, Reason: "does not exist in the database: run mysql.Migrate"}
	case !strings.EqualFold(engine.String, "InnoDB"):
		return &effects.ConfigError{Op: opCheck, Option: "table " + table,
			Reason: fmt.Sprintf("is %s, not InnoDB: its rows do not commit and roll back with the write's transaction (ALTER TABLE %s ENGINE=InnoDB)", engine.String, table)}
	case notBinary.Valid:
		return &effects.ConfigError{Op: opCheck, Option: "table " + table,
			Reason: fmt.Sprintf("has %s: scope and key must be VARBINARY, compared byte by byte, or keys that differ in letter case, accents or trailing spaces are one key (see mysql.Schema)", notBinary.String)}
	case flush != 1 && !cfg.allowUnsafeFlush:
		return fmt.Errorf("%w: %w", &effects.ConfigError{Op: opCheck, Option: "innodb_flush_log_at_trx_commit",
			Reason: fmt.Sprintf("is %d: a crash (of the OS with 2, of the server too with 0) loses about a second of acknowledged commits; set it to 1, or use AllowUnsafeFlush", flush)}, ErrUnsafeDurability)
	case logBin && syncBinlog != 1 && !cfg.allowUnsafeBinlog:
		return fmt.Errorf("%w: %w", &effects.ConfigError{Op: opCheck, Option: "sync_binlog",
			Reason: fmt.Sprintf("is %d with the binary log on: an OS crash can lose committed transactions from the binary log, so replicas and a failover lose acknowledged effects; set it to 1, or use AllowUnsafeBinlogSync", syncBinlog)}, ErrUnsafeDurability)
	}
	return nil
}
