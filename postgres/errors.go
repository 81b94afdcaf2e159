package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"effectively.dev/effects"
	"effectively.dev/internal/sqlkeys"
)

// ErrAsyncCommit is returned, wrapped, when a claim runs with
// synchronous_commit = off, or with synchronous_commit = local while a
// synchronous standby is configured (synchronous_standby_names is set):
// such a commit does not wait for the standby that a failover promotes. With asynchronous commit PostgreSQL reports a
// COMMIT as done before its WAL reaches disk, and a server crash loses the
// last commits (up to 3 × wal_writer_delay, 600 ms by default). A message
// acked after such a commit is gone and so is its effect: nothing will
// redeliver it. The claim is rolled back and nothing is written.
//
// Set synchronous_commit to on (or remote_write, remote_apply; local only
// without synchronous standbys) for the role, database or connection; or pass [AllowAsyncCommit] when the adapter
// is not used for ack-after-commit, for example when a lost effect is
// recovered by replaying the source from a position saved elsewhere.
//
// The settings are checked at no extra round trip. [Claim], [ClaimBatch]
// and [ApplyBatch] check them with the claim statement itself, before the
// write runs, so a write that runs SET LOCAL synchronous_commit = off
// after it is not caught: don't.
// [Effect.Apply] checks them in the key's INSERT, the statement just
// before COMMIT, so it sees them as COMMIT will, a write's SET LOCAL
// included (and, when it looks the key up first, before the write too).
var ErrAsyncCommit = errors.New("synchronous_commit is off, so an acknowledged commit can be lost in a crash: " +
	"set synchronous_commit=on, or use AllowAsyncCommit when the adapter is not used for ack-after-commit")

// SQLSTATEs the server raises when a transaction lost a race and retrying
// it whole is expected to succeed (40001, 40P01, 55P03), and others the
// package classifies.
const (
	sqlstateSerializationFailure = "40001"
	sqlstateDeadlockDetected     = "40P01"
	sqlstateLockNotAvailable     = "55P03"
	sqlstateUndefinedTable       = "42P01"
	sqlstateUniqueViolation      = "23505"
)

// keyTaken reports whether err is a unique violation on effectively_keys:
// a concurrent transaction committed the same key first, and the one that
// got the error was rolled back and may be retried (it will replay).
func keyTaken(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && isError(pgErr) &&
		pgErr.Code == sqlstateUniqueViolation && pgErr.TableName == "effectively_keys"
}

// serverError reports whether err is an ERROR the server answered with:
// the statement failed, and the connection is still usable.
func serverError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && isError(pgErr)
}

// preprocessingFailed classifies err if it is pgx's refusal to send a
// batch (a statement it could not prepare, arguments it could not encode),
// whose COMMIT was then never sent, and reports whether it was: arguments
// pgx could not encode (its "build" step: pgx says so only in the message)
// are the statement's fault and never retried, whatever pgx did to the
// connection; a statement the server would not prepare is classified as
// the server's error; a connection lost while preparing (broken) is
// transient.
func preprocessingFailed(ctx context.Context, op string, key effects.Key, err error, broken bool) (classified, bool) {
	var pe pgx.ErrPreprocessingBatch
	if !errors.As(err, &pe) {
		return classified{}, false
	}
	if strings.HasPrefix(pe.Error(), "error preprocessing batch (build)") {
		broken = false
	}
	return classify(ctx, op, key, err, false, broken), true
}

// lostRace reports whether SQLSTATE code says the transaction lost a race
// for a row or a lock and was rolled back: retrying it whole is expected
// to succeed.
func lostRace(code string) bool {
	switch code {
	case sqlstateSerializationFailure, sqlstateDeadlockDetected, sqlstateLockNotAvailable:
		return true
	}
	return false
}

// classified is the verdict on an error from one transaction attempt.
type classified struct {
	err    error // what to return
	retry  bool  // the whole transaction may be retried internally (40001, 40P01, 55P03)
	lookUp bool  // an attempt that did not look its key up first found it taken: look it up at once
}

// classify maps err, from one attempt of a transaction on behalf of op and
// key, to what the caller sees. It is the one place that decides what
// "retryable" means for this package:
//
//   - 40001 serialization_failure, 40P01 deadlock_detected and 55P03
//     lock_not_available (lock_timeout, NOWAIT), reported as an ERROR (so
//     the transaction was rolled back), by a statement or by COMMIT:
//     retry internally; if retries run out, [effects.Transient].
//   - committing is true when err came from COMMIT (or from an autocommit
//     statement, which is its own COMMIT). Unless pgconn reports that nothing
//     was sent, an error there is [effects.Ambiguous], because the server may
//     have committed and lost only the reply: a network error, a context
//     cancelled while waiting, a FATAL (e.g. 57P01 while the backend waits
//     for a synchronous standby after committing locally). Only an ERROR
//     reply proves the commit failed.
//   - Before COMMIT nothing is committed: a cancelled or expired ctx returns
//     the context error (wrapped, errors.Is works, its class is
//     [effects.Retryable]); a broken connection (a FATAL such as 57P01 from
//     pg_terminate_backend, an 08xxx, an I/O error, or broken reported by the
//     caller after checking the connection) is [effects.Transient].
//   - 42P01 undefined_table: a configuration error (missingTable).
//   - Anything else is returned wrapped with %w and is not retryable:
//     typically the caller's own error from its write.
func classify(ctx context.Context, op string, key effects.Key, err error, committing, broken bool) classified {
	var pgErr *pgconn.PgError
	isPg := errors.As(err, &pgErr)
	if isPg && isError(pgErr) && pgErr.Code == sqlstateUndefinedTable {
		// Nothing ran: the statement was refused before it started.
		return classified{err: missingTable(sqlkeys.Where(op, key), pgErr, err)}
	}
	if isPg && isError(pgErr) && lostRace(pgErr.Code) {
		return classified{err: effects.Transient(op, key, err), retry: true}
	}
	if committing && !pgconn.SafeToRetry(err) {
		switch {
		case isPg && isError(pgErr):
			// The server answered the COMMIT with an ERROR: it rolled back.
			if ctx.Err() != nil {
				return classified{err: sqlkeys.Canceled(ctx, op, key, err)}
			}
			return classified{err: fmt.Errorf("%s: commit failed, nothing was committed: %w", sqlkeys.Where(op, key), err)}
		case errors.Is(err, pgx.ErrTxCommitRollback):
			return classified{err: fmt.Errorf("%s: an earlier statement failed and its error was not returned, "+
				"so COMMIT rolled back; nothing was committed: %w", sqlkeys.Where(op, key), err)}
		}
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w: %w", ctx.Err(), err)
		}
		return classified{err: effects.Ambiguous(op, key, err)}
	}
	// Nothing was committed.
	if ctx.Err() != nil {
		return classified{err: sqlkeys.Canceled(ctx, op, key, err)}
	}
	if broken || connectionLost(err) {
		return classified{err: effects.Transient(op, key, err)}
	}
	return classified{err: fmt.Errorf("%s: %w", sqlkeys.Where(op, key), err)}
}

// isError reports whether the server reported pgErr as an ERROR, which
// aborts the transaction but keeps the session, as opposed to FATAL or
// PANIC, which end the session.
func isError(pgErr *pgconn.PgError) bool {
	sev := pgErr.SeverityUnlocalized
	if sev == "" {
		sev = pgErr.Severity
	}
	return sev == "ERROR"
}

// connectionLost reports whether err says the session is gone or could not
// be established, so that the transaction it was in is gone too.
func connectionLost(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// FATAL/PANIC end the session: 57P01 admin_shutdown
		// (pg_terminate_backend), 57P02 crash_shutdown, 57P03
		// cannot_connect_now, 53300 too_many_connections; 08xxx are
		// connection exceptions.
		return !isError(pgErr) || strings.HasPrefix(pgErr.Code, "08")
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// missingTable is the error of a statement that named a table the database
// does not have (42P01): a configuration error, an [*effects.ConfigError]
// naming the table, that wraps the server's error too. The adapter's own
// tables come from [Migrate]; a write's tables are the application's.
func missingTable(op string, pgErr *pgconn.PgError, err error) error {
	table := pgErr.TableName
	if table == "" { // PostgreSQL names it only in the message: relation "x" does not exist
		if _, rest, ok := strings.Cut(pgErr.Message, `"`); ok {
			table, _, _ = strings.Cut(rest, `"`)
		}
	}
	reason := "does not exist in the database"
	if strings.HasPrefix(table, "effectively_") || strings.Contains(table, ".effectively_") {
		reason += ": run postgres.Migrate"
	}
	return fmt.Errorf("%w: %w", &effects.ConfigError{Op: op, Option: "table " + table, Reason: reason}, err)
}
