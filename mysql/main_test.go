package mysql_test

import (
	"context"
	"database/sql"
	"os"
	"strconv"
	"testing"
	"time"

	"effectively.dev/mysql"
	"effectively.dev/mysql/mysqltest"
)

// TestMain stops the shared servers after the tests and checks, with
// goleak, that no goroutine outlived them.
func TestMain(m *testing.M) { os.Exit(mysqltest.Main(m)) }

// ledgerDDL is the business table the tests write. It deliberately has no
// unique index: only the dedup row can keep a duplicate out, and counting
// rows per event_id shows whether it did. event_id is VARBINARY so that
// the count tells keys apart byte by byte.
const ledgerDDL = `CREATE TABLE ledger (
	id       BIGINT AUTO_INCREMENT PRIMARY KEY,
	event_id VARBINARY(255) NOT NULL,
	amount   BIGINT NOT NULL
) ENGINE=InnoDB`

// payment is the input of the tests' effect.
type payment struct {
	EventID string
	Amount  int64
}

// writeLedger is the tests' effect: one ledger row, whose id is the ref.
func writeLedger(ctx context.Context, tx *sql.Tx, p payment) (string, error) {
	res, err := tx.ExecContext(ctx, `INSERT INTO ledger (event_id, amount) VALUES (?, ?)`, []byte(p.EventID), p.Amount)
	if err != nil {
		return "", err
	}
	id, err := res.LastInsertId()
	return "ledger:" + strconv.FormatInt(id, 10), err
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newDB creates a database with the schema and the ledger table and
// returns a *sql.DB on it (closed when t ends) and its DSN.
func newDB(t testing.TB) (*sql.DB, string) {
	t.Helper()
	dsn := mysqltest.DB(t)
	return openMigrated(t, dsn), dsn
}

// openMigrated opens dsn, migrates it and creates the ledger table.
func openMigrated(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db := openPlain(t, dsn)
	ctx := testCtx(t)
	if err := mysql.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, ledgerDDL); err != nil {
		t.Fatal(err)
	}
	return db
}

// ledgerRows counts the ledger rows of eventID.
func ledgerRows(t testing.TB, db *sql.DB, eventID string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(testCtx(t), `SELECT COUNT(*) FROM ledger WHERE event_id = ?`, []byte(eventID)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// openPlain opens dsn, closed when t ends.
func openPlain(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
