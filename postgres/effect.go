package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
	"effectively.dev/internal/sqlkeys"
)

// Effect is an [effects.Effect] whose side effect is a set of writes to the
// same PostgreSQL database that holds its keys. Apply runs them in one
// transaction with a row in effectively_keys, so the writes and the record
// that they happened commit together or not at all: effectively once, with
// no window. Create it with [New] or [NewPipelined]; it is safe for
// concurrent use.
type Effect[In any] struct {
	pool        *pgxpool.Pool
	scope       string
	write       func(ctx context.Context, tx pgx.Tx, in In) (string, error)                    // set by New
	statements  func(ctx context.Context, key effects.Key, in In) (string, []Statement, error) // set by NewPipelined
	group       *coalescer[groupReq[In], groupRes]                                             // the grouped shape's, if it has it (set by New)
	fingerprint func(In) ([]byte, error)
	txOptions   pgx.TxOptions
	cfg         effectConfig
}

var _ effects.Effect[struct{}] = (*Effect[struct{}])(nil)

// New returns an Effect that runs write under keys in scope (an application
// or tenant name; keys are unique per scope). The tables must exist: see
// [Migrate]. Apply fingerprints its input with the input's method
// Fingerprint() ([]byte, error) when In has one, else with
// [effects.FingerprintJSON]: fingerprint only what identifies the request,
// and deterministically, or every redelivery is [effects.ErrKeyReused].
// New returns an [*effects.ConfigError] if pool or write is nil, scope is
// empty, not UTF-8 or contains NUL, only *In has the Fingerprint method,
// or an option's value is invalid.
//
// write does the effect's writes in tx, the transaction that also holds
// the claim on its key, and returns a reference to what it wrote (a ledger
// row id, say) or "". It must write only through tx: anything it does
// outside the transaction (an HTTP call, a message sent) is not undone when
// the transaction rolls back and is repeated when Apply retries. It must not
// keep tx after it returns, nor end it: Apply commits it with the key's
// row, and tx's Commit and Rollback return an error (an attempt whose
// write ran COMMIT or ROLLBACK as SQL fails, and commits nothing with the
// key). A statement that fails on the server fails the whole transaction,
// and the attempt fails even if the write ignores the error.
//
// tx is pgx's own transaction, begun before write is called (with
// the lookup of the key, in one round trip, with [WithLookupFirst]).
// Unless the key was looked up first, nothing stops a duplicate's function
// early: one of its statements (on the earlier Apply's rows, say) or the
// key's INSERT fails, and Apply looks the key up. The commit settings (see
// [ErrAsyncCommit]) are checked by the key's INSERT, after the function
// returned: a function that turns synchronous_commit off is refused too,
// and nothing is written.
func New[In any](pool *pgxpool.Pool, scope string, write func(ctx context.Context, tx pgx.Tx, in In) (ref string, err error), opts ...EffectOption) (*Effect[In], error) {
	const op = "postgres.New"
	if write == nil {
		return nil, effects.ConfigErrorf(op, "write", "nil write function")
	}
	e, err := newEffect[In](op, pool, scope, opts)
	if err != nil {
		return nil, err
	}
	e.write = write
	if !e.cfg.lookupFirst && !e.cfg.noGroupCommit {
		e.group = newGroup(e, pool)
	}
	return e, nil
}

// newEffect validates what [New] and [NewPipelined] share and returns an
// Effect without its writes.
func newEffect[In any](op string, pool *pgxpool.Pool, scope string, opts []EffectOption) (*Effect[In], error) {
	if pool == nil {
		return nil, effects.ConfigErrorf(op, "pool", "nil")
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
	return &Effect[In]{
		pool:        pool,
		scope:       scope,
		fingerprint: fingerprint,
		txOptions:   pgx.TxOptions{IsoLevel: cfg.isolation},
		cfg:         cfg,
	}, nil
}

// Contract declares effectively-once, enforced by the primary key of
// effectively_keys in the write's own transaction, for as long as keys are
// kept (until [Prune] removes them), with key reuse detected by fingerprint.
func (e *Effect[In]) Contract() effects.Contract {
	return effects.Contract{
		Guarantee:       effects.EffectivelyOnce,
		Enforcer:        "postgres: UNIQUE(scope, key) in the same transaction as the write",
		Horizon:         0,
		DetectsKeyReuse: true,
	}
}

// Apply runs the effect for in under key, once. In one transaction it runs
// the write and inserts (scope, key, fingerprint, ref) and commits,
// returning [effects.Applied] with the ref. If the key was committed
// before with the same fingerprint, it returns [effects.Replayed] with the
// stored ref and commits nothing. The primary key of effectively_keys is
// the authority: the key's INSERT, just before COMMIT, fails if the key
// is there, and waits for a concurrent transaction that inserted it and
// fails if that one commits; the attempt then rolls back, its write with
// it, and Apply looks the key up, which replays. A write that fails
// because the key was committed (on a row the duplicate wrote or locked,
// say) is handled the same way: after a failed write Apply looks the key
// up.
//
// Apply has one shape per configuration, chosen when the Effect is built
// and never changed by what earlier calls saw:
//   - [New], by default, grouped: an Apply that finds fewer of the
//     Effect's transactions in flight than the pool has connections
//     (MaxConns) runs alone, at once, waiting for nothing:
//     BEGIN in a round trip of its own; the write; the key's INSERT with
//     COMMIT. Nothing looks the key up before the write: the key's INSERT
//     finds a duplicate, and a new key pays for no check. The Applies that
//     arrive while those transactions are in flight wait for one of them to
//     end and then run together in the next transaction (group commit; up
//     to 32, with distinct keys): BEGIN; each member's write, in the
//     order they arrived; then every member's key's INSERT, in key order,
//     with COMMIT, in one round trip. A member whose write or key's INSERT
//     fails fails the transaction: it rolls back, that member's Apply goes
//     on as after a failed write (a duplicate replays), and every other
//     member runs again at once, alone (nothing of it was committed). A
//     failure of the
//     transaction itself (a lost connection, a serialization failure at
//     COMMIT) is every member's: a lost COMMIT reply makes each
//     [effects.ErrAmbiguous], and each retries under its own key. A COMMIT
//     that fails with an ERROR of another kind (a deferred constraint of a
//     member's write) committed nothing: each member runs again alone,
//     looking its key up first, so that the error is the Apply's that
//     caused it. The
//     write of a member runs with its caller's context values, but ends
//     only when every member's caller has gone: a caller whose ctx ends
//     while its group runs gets ErrAmbiguous (the group may commit its
//     write), and one whose ctx ends while it waits for a group the
//     context's error (nothing of it was sent).
//   - [New] with [WithoutGroupCommit]: the lone shape above for every
//     Apply.
//   - [New] with [WithLookupFirst]: the lookup of the key travels with
//     BEGIN, and a duplicate runs no statement of the write at all.
//   - [NewPipelined], by default: BEGIN, the writes, the key's INSERT and
//     COMMIT in one round trip.
//   - [NewPipelined] with [WithLookupFirst]: BEGIN with the lookup; the
//     writes, the key's INSERT and COMMIT.
//
// Cost of a new key, for a write of one statement: in a group of n, n+2
// round trips and one COMMIT for all (a group with a duplicate or a
// failing member costs its round trips and ROLLBACK, then each other
// member's alone); alone, three round trips for
// [New] with or without the lookup first (a plain insert transaction's, and one statement
// more, the key's INSERT, which also checks the commit settings; the
// lookup first is one more statement in BEGIN's round trip). Cost of a
// duplicate: by default the write, run and rolled back (for New with one
// statement: BEGIN, the write, the key's INSERT with COMMIT, which fail,
// ROLLBACK and the lookup, five round trips; for NewPipelined, three);
// looked up first, two and no WAL (BEGIN with the lookup, then ROLLBACK).
// A duplicate found by the key's INSERT makes pgx forget the prepared
// statements of the failed batch, as after any failed batch: the
// connection deallocates them in one round trip more, and its next Apply
// prepares them again, in one more.
// Under synchronous replication a replay also passes the replay barrier
// (see RELIABILITY.md): a few bytes of WAL and a COMMIT that waits for the
// standby, in the round trip of the ROLLBACK, or of its own after the
// lookup. A concurrent duplicate found by the key's INSERT costs the new
// key's round trips, a ROLLBACK and the lookup.
//
// Errors:
//   - [effects.ErrInvalidKey]: key is invalid; checked before any I/O.
//   - [effects.ErrKeyReused]: the key was used with another fingerprint;
//     nothing was written.
//   - [ErrAsyncCommit]: synchronous_commit is off (see [AllowAsyncCommit]);
//     nothing was written.
//   - [effects.ErrTransient]: nothing was committed (a broken connection
//     before COMMIT, or serialization failures, deadlocks, locks not
//     available (lock_timeout, NOWAIT) or keys taken concurrently beyond
//     [WithMaxRetries]); retry with the same key.
//   - [effects.ErrAmbiguous]: COMMIT was sent but its reply was lost (or ctx
//     ended while waiting for it, even if the COMMIT then succeeded: its
//     wait for a synchronous standby may have been cancelled); the effect
//     may have committed. Retry with the same key: it replays or applies.
//   - the context's error, wrapped, when ctx ended before COMMIT was sent:
//     nothing was committed.
//   - the write's own error, wrapped with %w, after rolling back.
//
// Retry when effects.ClassOf(err) is [effects.Retryable].
func (e *Effect[In]) Apply(ctx context.Context, key effects.Key, in In) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	fp, err := e.fingerprint(in)
	if err != nil {
		return effects.Result{}, fmt.Errorf("%s key %q: fingerprint: %w", opApply, key, err)
	}
	fp = nonNil(fp)
	var queued *queuedWrites
	if e.statements != nil {
		if queued, err = e.queue(ctx, key, in); err != nil {
			return effects.Result{}, err
		}
	}
	lookFirst := e.cfg.lookupFirst
	for attempt := 1; ; {
		res, c := e.attemptOnce(ctx, key, fp, in, queued, lookFirst)
		if c.lookUp {
			// The key turned out to be committed already: look it up now,
			// at once, which replays it (or reports its reuse).
			lookFirst = true
			continue
		}
		if !c.retry || attempt > e.cfg.maxRetries {
			return res, c.err
		}
		if err := retry.Sleep(ctx, retryBackoff.Delay(attempt)); err != nil {
			return effects.Result{}, sqlkeys.Canceled(ctx, opApply, key, c.err)
		}
		attempt++
	}
}

// attemptOnce runs one attempt in the Effect's shape (see Apply): a
// pipelined Effect's that does not look its key up first is one round
// trip (attemptPipelined); a grouped Effect's that does not look first
// runs alone or in a group (attemptGrouped); every other is attempt's.
func (e *Effect[In]) attemptOnce(ctx context.Context, key effects.Key, fp []byte, in In, queued *queuedWrites, lookFirst bool) (effects.Result, classified) {
	switch {
	case queued != nil && !lookFirst:
		return e.attemptPipelined(ctx, key, fp, queued)
	case e.group != nil && !lookFirst:
		return e.attemptGrouped(ctx, key, fp, in)
	}
	return e.attempt(ctx, key, fp, in, queued, lookFirst)
}

// attempt runs one transaction: BEGIN, with the lookup of the key when
// lookFirst, in a round trip of its own (begin); the write
// (or, for a pipelined Effect, which always looks first here, its queued
// statements, with the key's row); the key's row (with the commit guard
// unless async commits are allowed) and COMMIT, in one round trip. A
// duplicate that was not looked up first fails the key's INSERT (or a
// statement of the write), and is looked up after the rollback
// (failedBeforeCommit, endFailed).
//
// It runs on a connection of its own rather than a pgxpool.Tx so that it
// can end the transaction with the key's INSERT and COMMIT pipelined in
// one round trip; the pgx.Tx that begin gave the write is then
// abandoned, and Release checks that the connection is idle before pooling
// it again.
func (e *Effect[In]) attempt(ctx context.Context, key effects.Key, fp []byte, in In, queued *queuedWrites, lookFirst bool) (effects.Result, classified) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return effects.Result{}, classify(ctx, opApply, key, err, false, false)
	}
	defer conn.Release() // destroys the connection unless it is idle, outside a transaction

	var (
		p   keyLookup
		ref string
	)
	tx, err := e.begin(ctx, conn, key, lookFirst, &p)
	if err != nil {
		return effects.Result{}, classify(ctx, opApply, key, err, false, conn.Conn().IsClosed())
	}
	ending := false
	defer func() {
		if !ending {
			rollback(ctx, tx)
		}
	}()

	switch {
	case p.unsafeCommit() && !e.cfg.allowAsyncCommit:
		return effects.Result{}, classified{err: asyncCommit(opApply, key)}
	case p.found:
		ending = true
		return replayFound(ctx, conn.Conn(), key, fp, &p)
	}

	end := func() { rollback(ctx, tx) }
	var last pgx.Batch // ends the transaction
	if queued != nil {
		ref = queued.ref
		queued.queueOn(&last)
	} else if ref, err = e.write(ctx, writeTx{tx}, in); err != nil {
		return e.failedBeforeCommit(ctx, conn.Conn(), end, key, fp, err)
	} else if !inTransaction(conn.Conn()) {
		return effects.Result{}, classified{err: errNoTransaction(key)}
	}
	ending = true // from here on, never roll back blindly: the COMMIT may have happened
	queueKeyInsert(&last, e.scope, key, fp, ref, !e.cfg.allowAsyncCommit)
	last.Queue("COMMIT").Exec(commitTag)
	if err := conn.SendBatch(ctx, &last).Close(); err != nil {
		return e.endFailed(ctx, conn.Conn(), end, key, fp, err, queued != nil, lookFirst)
	}
	if c := waitCut(ctx, key); c.err != nil {
		return effects.Result{}, c
	}
	return effects.Result{Status: effects.Applied, Ref: ref}, classified{}
}

// begin begins an attempt's transaction: with the lookup of key, read
// into p, in one round trip (pgx's Batch.BeginTx) when lookFirst; else
// with pgx's Conn.BeginTx, one simple-protocol BEGIN, which spares the
// client the batch's pipeline. On an error nothing is left open.
func (e *Effect[In]) begin(ctx context.Context, conn *pgxpool.Conn, key effects.Key, lookFirst bool, p *keyLookup) (pgx.Tx, error) {
	if !lookFirst {
		return conn.BeginTx(ctx, e.txOptions)
	}
	var batch pgx.Batch
	batch.BeginTx(e.txOptions)
	queueLookup(&batch, e.scope, key, p)
	br := conn.SendBatch(ctx, &batch)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		rollback(ctx, tx) // a no-op if BEGIN failed
		return nil, err
	}
	return tx, nil
}

// endFailed classifies err from the batch that ends an attempt with the
// key's INSERT and COMMIT (and, for a pipelined Effect, queued, its writes
// and, in its one-round-trip form, BEGIN before them).
// end rolls the transaction back, for a server that failed it and skipped
// COMMIT. A key committed before the attempt or concurrently with it is
// replayed at once (see replayIfCommitted). lookedFirst says whether the
// attempt looked the key up first.
func (e *Effect[In]) endFailed(ctx context.Context, conn *pgx.Conn, end func(), key effects.Key, fp []byte, err error, queued, lookedFirst bool) (effects.Result, classified) {
	if failedTx(conn) {
		// The server failed the transaction before COMMIT (which it then
		// skipped): nothing was committed. Roll back to keep the
		// connection.
		end()
		end = func() {}
	}
	if c, ok := preprocessingFailed(ctx, opApply, key, err, conn.IsClosed()); ok {
		// pgx refused to send the batch: COMMIT was never sent.
		return effects.Result{}, c
	}
	switch {
	case guardRefused(err):
		return effects.Result{}, classified{err: asyncCommit(opApply, key)}
	case serverError(err):
		// A statement of the batch (a queued write, the key's row, one
		// that failed because the write ignored an earlier failure) or
		// COMMIT itself failed with an ERROR: nothing was committed. The
		// key may have been committed, before this attempt (if it did not
		// look) or by a concurrent transaction: it replays.
		if res, c, ok := e.replayIfCommitted(ctx, conn, end, key, fp); ok {
			return res, c
		}
		if keyTaken(err) {
			// The lookup could not tell: the retry replays it (looking
			// the key up first, unless this attempt did: then it is an
			// ordinary retry, counted and delayed).
			return effects.Result{}, classified{err: effects.Transient(opApply, key, err), retry: true, lookUp: !lookedFirst}
		}
		return effects.Result{}, classify(ctx, opApply, key, err, !queued, conn.IsClosed())
	}
	return effects.Result{}, classify(ctx, opApply, key, err, true, false)
}

// failedBeforeCommit classifies a write that failed before COMMIT: nothing
// was committed. If the key was committed meanwhile, before this attempt
// (if it did not look) or by a concurrent Apply while the write ran (the
// write may have failed on what that one wrote or locked), it replays.
func (e *Effect[In]) failedBeforeCommit(ctx context.Context, conn *pgx.Conn, end func(), key effects.Key, fp []byte, err error) (effects.Result, classified) {
	if res, c, ok := e.replayIfCommitted(ctx, conn, end, key, fp); ok {
		return res, c
	}
	return effects.Result{}, classify(ctx, opApply, key, err, false, conn.IsClosed())
}

// replayIfCommitted ends the transaction of an attempt that failed before
// COMMIT (with end) and looks its key up (keyLookupSQL): if the key has been
// committed, before the attempt or concurrently with it, it replays it
// (replayFound, after the same check of the commit settings as a lookup
// first: a replay acked under unsafe settings could ack a commit that a
// crash or a failover loses) and reports true. One round trip more than
// end's, on the failure path only. It reports false when the key is not
// committed, and when it cannot tell (ctx ended, the connection is lost);
// then it leaves the transaction to the caller's rollback, or to Release,
// which destroys a connection that is not idle.
func (e *Effect[In]) replayIfCommitted(ctx context.Context, conn *pgx.Conn, end func(), key effects.Key, fp []byte) (effects.Result, classified, bool) {
	if ctx.Err() != nil || conn.IsClosed() {
		return effects.Result{}, classified{}, false
	}
	if inTx(conn) { // not after a COMMIT that failed: that ended it
		end()
	}
	var p keyLookup
	if p.scan(conn.QueryRow(ctx, keyLookupSQL, e.scope, string(key))) != nil || !p.found {
		return effects.Result{}, classified{}, false
	}
	res, c := e.replay(ctx, conn, key, fp, &p)
	return res, c, true
}

// replay replays key, found committed by p (a lookup first or after a failed attempt): it
// refuses with ErrAsyncCommit instead when the session's commit settings
// make acknowledging unsafe (a replay acked under them could ack a commit
// that a crash or a failover loses; AllowAsyncCommit allows it), and
// otherwise replays (replayFound).
func (e *Effect[In]) replay(ctx context.Context, conn *pgx.Conn, key effects.Key, fp []byte, p *keyLookup) (effects.Result, classified) {
	if p.unsafeCommit() && !e.cfg.allowAsyncCommit {
		if inTx(conn) {
			rollbackConn(ctx, conn)
		}
		return effects.Result{}, classified{err: asyncCommit(opApply, key)}
	}
	return replayFound(ctx, conn, key, fp, p)
}

// commitTag fails a COMMIT that the server answered with ROLLBACK (the
// transaction had failed earlier without the error being returned).
func commitTag(tag pgconn.CommandTag) error {
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// failedTx reports whether conn is in a transaction that the server has
// marked failed: an ERROR was raised, and nothing of it can commit.
func failedTx(conn *pgx.Conn) bool {
	return !conn.IsClosed() && conn.PgConn().TxStatus() == 'E'
}

// rollbackConn ends the transaction open on conn, if any, even when ctx is
// done (see rollback).
func rollbackConn(ctx context.Context, conn *pgx.Conn) {
	rctx, cancel := retry.Detached(ctx, rollbackTimeout)
	defer cancel()
	_, _ = conn.Exec(rctx, "ROLLBACK")
}

// rollback ends tx, even when ctx is done, so that a healthy connection
// goes back to the pool. If it fails, pgx closes the connection and the
// pool discards it.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := retry.Detached(ctx, rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}

const opApply = "postgres.Apply"
