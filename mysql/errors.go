package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/go-sql-driver/mysql"

	"effectively.dev/effects"
	"effectively.dev/internal/sqlkeys"
)

// Error numbers of MySQL and MariaDB that the package acts on.
const (
	erDupEntry            = 1062 // ER_DUP_ENTRY: a duplicate of a unique key
	erLockWaitTimeout     = 1205 // ER_LOCK_WAIT_TIMEOUT: the statement (not the transaction) rolled back
	erLockDeadlock        = 1213 // ER_LOCK_DEADLOCK: InnoDB rolled the whole transaction back
	erOptionPrevents      = 1290 // ER_OPTION_PREVENTS_STATEMENT: --read-only (a replica, a failover in progress)
	erReadOnlyMode        = 1836 // ER_READ_ONLY_MODE: MariaDB's read-only server
	erReadOnlyTransaction = 1792 // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
	erServerShutdown      = 1053 // ER_SERVER_SHUTDOWN: the server is shutting down
	erConnectionKilled    = 1927 // ER_CONNECTION_KILLED (MariaDB)
	erQueryInterrupted    = 1317 // ER_QUERY_INTERRUPTED: KILL QUERY, a shutdown
	erWsrepNotReady       = 1047 // ER_UNKNOWN_COM_ERROR, which Galera returns while a node is not ready
	erBadDB               = 1049 // ER_BAD_DB_ERROR: unknown database
	erBadField            = 1054 // ER_BAD_FIELD_ERROR: unknown column
	erNoSuchTable         = 1146 // ER_NO_SUCH_TABLE
	erTableAccessDenied   = 1142 // ER_TABLEACCESS_DENIED_ERROR
	erDBAccessDenied      = 1044 // ER_DBACCESS_DENIED_ERROR
)

// classified is the verdict on an error from one transaction attempt.
type classified struct {
	err   error // what to return
	retry bool  // the whole transaction may be retried internally (deadlock, lock wait timeout)
}

// serverError returns err's *mysql.MySQLError, the server's own answer to
// a statement, or nil when err is not one (a lost connection, a driver
// error, the caller's own error).
func serverError(err error) *mysql.MySQLError {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me
	}
	return nil
}

// isNumber reports whether err is the server's error number n.
func isNumber(err error, n uint16) bool {
	me := serverError(err)
	return me != nil && me.Number == n
}

// classify maps err, from one attempt of a transaction on behalf of op and
// key, to what the caller sees. It is the one place that decides what
// "retryable" means for this package:
//
//   - 1213 deadlock and 1205 lock wait timeout: retry the transaction
//     internally; when retries run out, [effects.ErrTransient].
//   - committing is true when err came from COMMIT (or from an autocommit
//     statement, which is its own COMMIT). A server error there (a
//     *mysql.MySQLError) proves the commit failed; driver.ErrBadConn says
//     nothing was sent; a context error that database/sql returned before
//     sending COMMIT (ctx ended first: it rolls back) commits nothing.
//     Anything else (a lost connection, a reply that never came) is
//     [effects.ErrAmbiguous]: the server may have committed.
//   - Before COMMIT nothing is committed: a done ctx returns the context
//     error (wrapped); a read-only server (1290, 1836, 1792, a failover in
//     progress), a server shutting down or a killed connection, or a
//     broken connection (broken, reported by the caller, or a network
//     error) is [effects.ErrTransient].
//   - 1146 unknown table, 1054 unknown column, 1049 unknown database, and
//     1142/1044 access denied: a configuration error ([configError]).
//   - Anything else is returned wrapped with %w and is not retryable:
//     typically the caller's own error from its write.
func classify(ctx context.Context, op string, key effects.Key, err error, committing, broken bool) classified {
	me := serverError(err)
	if me != nil {
		switch me.Number {
		case erNoSuchTable, erBadField, erBadDB, erTableAccessDenied, erDBAccessDenied:
			return classified{err: configError(sqlkeys.Where(op, key), me, err)}
		case erLockDeadlock, erLockWaitTimeout:
			return classified{err: effects.Transient(op, key, err), retry: true}
		case erOptionPrevents, erReadOnlyMode, erReadOnlyTransaction, erServerShutdown, erConnectionKilled, erQueryInterrupted, erWsrepNotReady:
			if committing {
				// The server refused the COMMIT: it rolled back.
				return classified{err: effects.Transient(op, key, err)}
			}
			if ctx.Err() != nil {
				return classified{err: sqlkeys.Canceled(ctx, op, key, err)}
			}
			return classified{err: effects.Transient(op, key, err)}
		}
		if committing {
			if ctx.Err() != nil {
				return classified{err: sqlkeys.Canceled(ctx, op, key, err)}
			}
			return classified{err: fmt.Errorf("%s: commit failed, nothing was committed: %w", sqlkeys.Where(op, key), err)}
		}
	}
	if committing && me == nil && !notSent(ctx, err) {
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w: %w", ctx.Err(), err)
		}
		return classified{err: effects.Ambiguous(op, key, err)}
	}
	// Nothing was committed.
	if ctx.Err() != nil {
		return classified{err: sqlkeys.Canceled(ctx, op, key, err)}
	}
	if me == nil && (broken || committing || connectionLost(err)) {
		return classified{err: effects.Transient(op, key, err)}
	}
	return classified{err: fmt.Errorf("%s: %w", sqlkeys.Where(op, key), err)}
}

// notSent reports whether err, from COMMIT, says that COMMIT never reached
// the server: driver.ErrBadConn (go-sql-driver returns it only when it
// wrote nothing), sql.ErrTxDone (database/sql rolled the transaction back
// when ctx ended), or ctx's own error while ctx is done (database/sql
// checks ctx before it sends COMMIT, and rolls back).
func notSent(ctx context.Context, err error) bool {
	switch {
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrTxDone):
		return true
	case ctx.Err() != nil && err == ctx.Err():
		return true
	}
	return false
}

// connectionLost reports whether err says that the connection is gone or
// could not be established, so that the transaction it was in is gone
// too: anything that is not the server's answer (a *mysql.MySQLError) and
// looks like the network or the driver's connection state.
func connectionLost(err error) bool {
	if serverError(err) != nil {
		return false
	}
	var netErr net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, mysql.ErrPktSync) || errors.Is(err, mysql.ErrPktSyncMul) || errors.Is(err, mysql.ErrBusyBuffer) ||
		errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// configError is the error of a statement that named a table or column
// the database does not have, or that the user may not use: an
// [*effects.ConfigError] that wraps the server's error too. The adapter's
// own tables come from [Migrate]; a write's tables are the application's.
func configError(op string, me *mysql.MySQLError, err error) error {
	what, reason := "database", "is not usable"
	switch me.Number {
	case erNoSuchTable:
		what, reason = "table "+quoted(me.Message), "does not exist in the database"
	case erBadField:
		what, reason = "column "+quoted(me.Message), "does not exist"
	case erBadDB:
		what, reason = "database "+quoted(me.Message), "does not exist"
	case erTableAccessDenied, erDBAccessDenied:
		what, reason = "privileges", "the user may not do this: "+me.Message
	}
	if strings.Contains(what, "effectively_") {
		reason += ": run mysql.Migrate"
	}
	return fmt.Errorf("%w: %w", &effects.ConfigError{Op: op, Option: what, Reason: reason}, err)
}

// quoted returns the first '...' quoted name in a server message, or the
// message.
func quoted(msg string) string {
	if _, rest, ok := strings.Cut(msg, "'"); ok {
		if name, _, ok := strings.Cut(rest, "'"); ok {
			return name
		}
	}
	return msg
}

// reused is the error of a key used before with another fingerprint.
func reused(op string, key effects.Key) error {
	return &effects.Error{Kind: effects.ErrKeyReused, Op: op, Key: key,
		Err: errors.New("the stored fingerprint differs; nothing was written")}
}

// refusedForGood reports whether the server refused a statement for a
// reason a retry cannot fix: an unknown table, column or database, or a
// missing privilege.
func refusedForGood(err error) bool {
	me := serverError(err)
	if me == nil {
		return false
	}
	switch me.Number {
	case erNoSuchTable, erBadField, erBadDB, erTableAccessDenied, erDBAccessDenied:
		return true
	}
	return false
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
