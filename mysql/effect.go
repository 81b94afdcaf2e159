package mysql

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
	"effectively.dev/internal/sqlkeys"
)

// Effect is an [effects.Effect] whose side effect is a set of writes to the
// same MySQL or MariaDB database that holds its keys. Apply runs them in
// one InnoDB transaction with a row in effectively_keys, so the writes and
// the record that they happened commit together or not at all:
// effectively once, with no window. Create it with [New]; it is safe for
// concurrent use.
type Effect[In any] struct {
	db          *sql.DB
	scope       string
	write       func(ctx context.Context, tx *sql.Tx, in In) (string, error)
	fingerprint func(In) ([]byte, error)
	txOptions   *sql.TxOptions
	cfg         effectConfig
}

var _ effects.Effect[struct{}] = (*Effect[struct{}])(nil)

// New returns an Effect that runs write under keys in scope (an
// application or tenant name, at most 255 bytes; keys are unique per
// scope). db is a *sql.DB of github.com/go-sql-driver/mysql (any DSN
// options). The tables must exist: see [Migrate]. New does no I/O; run
// [Effect.Check] at start-up. Apply fingerprints its input with the
// input's method Fingerprint() ([]byte, error) when In has one, else with
// [effects.FingerprintJSON]: fingerprint only what identifies the request,
// and deterministically, or every redelivery is [effects.ErrKeyReused].
// New returns an [*effects.ConfigError] if db or write is nil, scope is
// empty, longer than 255 bytes, not UTF-8 or contains NUL, only *In has
// the Fingerprint method, or an option's value is invalid.
//
// write does the effect's writes in tx, the transaction that also
// records its key, and returns a reference to what it wrote (a ledger row
// id, say) or "". It must write only through tx: anything it does outside
// the transaction (an HTTP call, a message sent, a statement on another
// connection) is not undone when the transaction rolls back and is
// repeated when Apply retries. It must not keep tx after it returns, nor
// end it: Apply inserts the key's row and commits. A write that ends tx
// (tx.Commit, tx.Rollback) fails the attempt, and nothing is committed
// with the key. It must not run a statement that MySQL commits implicitly
// (DDL such as CREATE or ALTER TABLE, LOCK TABLES, START TRANSACTION,
// COMMIT as SQL): the server commits the transaction there, without the
// key, and database/sql cannot see it.
//
// tx begins with database/sql's BeginTx, at the server's isolation level
// (REPEATABLE READ unless configured) or [WithIsolation]'s. Nothing stops
// a duplicate's write early: the key's INSERT after it fails (or one of
// its statements does, on the rows the first delivery wrote or locked),
// the transaction rolls back, and Apply looks the key up.
func New[In any](db *sql.DB, scope string, write func(ctx context.Context, tx *sql.Tx, in In) (ref string, err error), opts ...EffectOption) (*Effect[In], error) {
	const op = "mysql.New"
	switch {
	case db == nil:
		return nil, effects.ConfigErrorf(op, "db", "nil")
	case write == nil:
		return nil, effects.ConfigErrorf(op, "write", "nil write function")
	}
	if err := validateScope(op, scope); err != nil {
		return nil, err
	}
	cfg, err := newEffectConfig(op, opts)
	if err != nil {
		return nil, err
	}
	fingerprint, err := sqlkeys.Fingerprint[In](op)
	if err != nil {
		return nil, err
	}
	e := &Effect[In]{db: db, scope: scope, write: write, fingerprint: fingerprint, cfg: cfg}
	if cfg.isolation != sql.LevelDefault {
		e.txOptions = &sql.TxOptions{Isolation: cfg.isolation}
	}
	return e, nil
}

// Contract declares effectively-once, enforced by the primary key of
// effectively_keys in the write's own transaction, for as long as keys are
// kept (until [Prune] removes them), with key reuse detected by fingerprint.
func (e *Effect[In]) Contract() effects.Contract {
	return effects.Contract{
		Guarantee:       effects.EffectivelyOnce,
		Enforcer:        "mysql: PRIMARY KEY (scope, key) of effectively_keys (InnoDB, VARBINARY) in the same transaction as the write",
		Horizon:         0,
		DetectsKeyReuse: true,
	}
}

// Apply runs the effect for in under key, once. In one transaction it runs
// the write and inserts (scope, key, fingerprint, ref), and commits,
// returning [effects.Applied] with the ref. If the key was committed
// before with the same fingerprint, it returns [effects.Replayed] with the
// stored ref and commits nothing. The primary key of effectively_keys is
// the authority: the key's INSERT, just before COMMIT, fails with 1062 if
// the key is there, and waits for a concurrent transaction that inserted
// it and fails if that one commits; the attempt then rolls back, its write
// with it, and Apply looks the key up outside the transaction, which
// replays. A write that fails while the key was committed (on a row the
// duplicate wrote or locked, say) is looked up the same way.
//
// Cost of a new key: a plain insert transaction's round trips (START
// TRANSACTION, the write, COMMIT) and one more, the key's INSERT (sent as
// one query, its values as hexadecimal literals); the log flush at
// COMMIT is paid once either way. Cost of a duplicate: START TRANSACTION,
// the write, run and rolled back, the key's INSERT, which fails, ROLLBACK
// and the lookup (one query), and no log flush. BENCHMARKS.md has the
// measurements.
//
// Errors:
//   - [effects.ErrInvalidKey]: key is invalid; checked before any I/O.
//   - [effects.ErrKeyReused]: the key was used with another fingerprint;
//     nothing was written.
//   - [effects.ErrTransient]: nothing was committed (a connection lost
//     before COMMIT was sent, a read-only server (1290, 1836) during a
//     failover, a server shutting down, or deadlocks and lock wait
//     timeouts beyond [WithMaxRetries]); retry with the same key.
//   - [effects.ErrAmbiguous]: COMMIT was sent but its reply was lost; the
//     effect may have committed. Retry with the same key: the retry's
//     INSERT of the key finds it if it committed, and replays.
//   - an [*effects.ConfigError] (errors.Is [effects.ErrInvalidConfig]):
//     an unknown table or column (1146, 1054), an unknown database, a
//     missing privilege; run [Migrate] for effectively_keys.
//   - the context's error, wrapped, when ctx ended before COMMIT was sent:
//     nothing was committed.
//   - the write's own error, wrapped with %w, after rolling back.
//
// [effects.ClassOf] says whether to retry.
func (e *Effect[In]) Apply(ctx context.Context, key effects.Key, in In) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	fp, err := e.fingerprint(in)
	if err != nil {
		return effects.Result{}, fmt.Errorf("%s key %q: fingerprint: %w", opApply, key, err)
	}
	fp = nonNil(fp)
	for attempt := 1; ; attempt++ {
		res, c := e.attempt(ctx, key, fp, in)
		if !c.retry || attempt > e.cfg.maxRetries {
			return res, c.err
		}
		if err := retry.Sleep(ctx, retryBackoff.Delay(attempt)); err != nil {
			return effects.Result{}, sqlkeys.Canceled(ctx, opApply, key, c.err)
		}
	}
}

// attempt runs one transaction: START TRANSACTION; the write; the key's
// INSERT; COMMIT. A key found taken, by the INSERT or after a failed
// write, is looked up after the rollback (replayIfCommitted).
func (e *Effect[In]) attempt(ctx context.Context, key effects.Key, fp []byte, in In) (effects.Result, classified) {
	tx, err := e.db.BeginTx(ctx, e.txOptions)
	if err != nil {
		// Nothing began: a refused or lost connection, or a done ctx.
		return effects.Result{}, classify(ctx, opApply, key, err, false, true)
	}
	ref, err := e.write(ctx, tx, in)
	if err != nil {
		return e.failedBeforeCommit(ctx, tx, key, fp, err, false)
	}
	if _, err := tx.ExecContext(ctx, insertKeyQuery(e.scope, string(key), fp, ref)); err != nil {
		if errors.Is(err, sql.ErrTxDone) && ctx.Err() == nil {
			return effects.Result{}, classified{err: fmt.Errorf("%s key %q: %w: nothing is committed with the key, and what the write committed stays", opApply, key, errWriteEndedTx)}
		}
		return e.failedBeforeCommit(ctx, tx, key, fp, err, isNumber(err, erDupEntry))
	}
	if err := tx.Commit(); err != nil {
		return effects.Result{}, classify(ctx, opApply, key, err, true, false)
	}
	return effects.Result{Status: effects.Applied, Ref: ref}, classified{}
}

// errWriteEndedTx is the error of an attempt whose write ended its
// transaction: Apply ends it, with the key's row.
var errWriteEndedTx = errors.New("mysql: a write function must not commit or roll back the transaction: Apply ends it, with the key's row")

// failedBeforeCommit rolls back an attempt that failed before COMMIT
// (nothing was committed) and classifies err. If the key was committed
// meanwhile, before this attempt or by a concurrent Apply, it replays:
// always looked up when the key's INSERT found it taken (taken), and after
// any other failure on a connection that is still up.
func (e *Effect[In]) failedBeforeCommit(ctx context.Context, tx *sql.Tx, key effects.Key, fp []byte, err error, taken bool) (effects.Result, classified) {
	broken := rollback(tx)
	if ctx.Err() == nil && (taken || !broken) {
		if res, c, ok := e.replayIfCommitted(ctx, key, fp); ok {
			return res, c
		}
	}
	if taken && ctx.Err() == nil {
		// The key was taken by a transaction that the lookup could not
		// see committed (pruned since, or the lookup failed): the retry
		// settles it.
		return effects.Result{}, classified{err: effects.Transient(opApply, key, err), retry: true}
	}
	return effects.Result{}, classify(ctx, opApply, key, err, false, broken)
}

// replayIfCommitted looks key up (lookupQuery, outside any transaction): if
// it has been committed, it replays it, or reports its reuse with another
// fingerprint, and reports true. It reports false when the key is not
// committed, and when it cannot tell (the lookup failed).
func (e *Effect[In]) replayIfCommitted(ctx context.Context, key effects.Key, fp []byte) (effects.Result, classified, bool) {
	var storedFP, ref []byte
	if err := e.db.QueryRowContext(ctx, lookupQuery(e.scope, string(key))).Scan(&storedFP, &ref); err != nil {
		return effects.Result{}, classified{}, false
	}
	if !bytes.Equal(storedFP, fp) {
		return effects.Result{}, classified{err: reused(opApply, key)}, true
	}
	return effects.Result{Status: effects.Replayed, Ref: string(ref)}, classified{}, true
}

// rollback ends tx and reports whether the connection broke: ROLLBACK
// failed other than because tx had ended already (database/sql rolled it
// back when ctx ended, or the write ended it).
func rollback(tx *sql.Tx) (broken bool) {
	err := tx.Rollback()
	return err != nil && !errors.Is(err, sql.ErrTxDone)
}

const opApply = "mysql.Apply"
