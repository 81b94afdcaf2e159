package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
)

// errWriteEndedTx is the error of a write function's Commit or Rollback: Apply
// ends the transaction itself, with the key's row.
var errWriteEndedTx = errors.New("postgres: a write function must not commit or roll back the transaction: Apply ends it, with the key's row")

// errWriteIgnoredFailure is the error of a grouped member whose write
// returned no error although one of its statements failed, which failed
// the group's transaction.
var errWriteIgnoredFailure = errors.New("postgres: a statement of the write failed and the write returned no error; nothing was committed")

// writeTx is the pgx.Tx a write gets: pgx's own, but Commit and Rollback
// refuse (errWriteEndedTx).
type writeTx struct{ pgx.Tx }

func (writeTx) Commit(context.Context) error   { return errWriteEndedTx }
func (writeTx) Rollback(context.Context) error { return errWriteEndedTx }

// inTx reports whether conn is open and inside a transaction, failed or
// not.
func inTx(conn *pgx.Conn) bool {
	if conn.IsClosed() {
		return false
	}
	s := conn.PgConn().TxStatus()
	return s == 'T' || s == 'E'
}

// inTransaction reports whether the batch that ends an attempt with the
// key's row and COMMIT may be sent on conn: it is inside a transaction,
// failed or not, or closed (the batch then fails). Outside one (the write
// ran COMMIT or ROLLBACK as SQL), that batch would commit the key alone.
func inTransaction(conn *pgx.Conn) bool { return conn.IsClosed() || inTx(conn) }

// errNoTransaction fails an attempt whose transaction the write ended.
func errNoTransaction(key effects.Key) error {
	return fmt.Errorf("%s key %q: %w: nothing is committed with the key, and what the write committed stays", opApply, key, errWriteEndedTx)
}
