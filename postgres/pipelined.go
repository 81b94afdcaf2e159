package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
)

// Statement is one SQL statement and its arguments, as pgx takes them.
type Statement struct {
	SQL  string
	Args []any
}

// StatementsFunc returns an effect's writes for in as statements that read
// nothing back, with the reference to store with key and replay (a row id
// the writes insert, made before they run: random, or derived from in). It
// must do no I/O: [Effect.Apply] calls it once, before its first round
// trip, and sends the statements with the key's row and COMMIT.
type StatementsFunc[In any] func(key effects.Key, in In) (ref string, writes []Statement, err error)

// NewPipelined is [New] for writes known in advance, as statements that
// read nothing back: Apply sends BEGIN, a check of the commit settings,
// the statements, the key's row and COMMIT in one pipeline, so that a new
// key costs one round trip whatever the number of statements, where [New]
// costs three, and one more per statement beyond the first that the write
// function runs. While duplicates are frequent (or with [WithLookupFirst])
// it looks the key up first, as New does: two round trips for a new key,
// two and no WAL for a duplicate. The ref must be known before the writes
// run (statements returns it). A statement that fails on the server fails the whole transaction
// and nothing is committed: put checks in SQL (a constraint, a statement
// that raises), since nothing can read a result before COMMIT. Everything
// else, the options, the errors, duplicates and retries, is as for [New].
// It returns an [*effects.ConfigError] where New does, and if statements is
// nil.
func NewPipelined[In any](pool *pgxpool.Pool, scope string, statements StatementsFunc[In], opts ...Option) (*Effect[In], error) {
	const op = "postgres.NewPipelined"
	if statements == nil {
		return nil, &effects.ConfigError{Op: op, Option: "statements", Reason: "nil statements function"}
	}
	e, err := newEffect[In](op, pool, scope, opts)
	if err != nil {
		return nil, err
	}
	e.statements = statements
	return e, nil
}

// queuedWrites are the statements of one Apply of a pipelined Effect.
type queuedWrites struct {
	ref    string
	writes []Statement
}

// queue calls the Effect's StatementsFunc and checks what it returned.
func (e *Effect[In]) queue(key effects.Key, in In) (*queuedWrites, error) {
	ref, writes, err := e.statements(key, in)
	if err != nil {
		return nil, fmt.Errorf("%s key %q: statements: %w", opApply, key, err)
	}
	for i, st := range writes {
		if st.SQL == "" {
			return nil, fmt.Errorf("%s key %q: statements: statement %d of %d has no SQL", opApply, key, i+1, len(writes))
		}
	}
	return &queuedWrites{ref: ref, writes: writes}, nil
}

// commitGuardSQL fails the transaction, before anything is written, when
// the commit settings make a commit unsafe to acknowledge (see
// ErrAsyncCommit; commitSettings.unsafeCommit says the same): it sets
// synchronous_commit, for this transaction only, to its own value, or to
// a value PostgreSQL rejects (22023, invalid_parameter_value) that names
// the refusal. It lets a pipelined attempt check the settings in the same
// round trip as its writes and COMMIT.
const commitGuardSQL = `SELECT set_config('synchronous_commit',
	CASE WHEN current_setting('synchronous_commit') = 'off'
		OR (current_setting('synchronous_commit') = 'local' AND current_setting('synchronous_standby_names') <> '')
	THEN '` + commitGuardMarker + `' || current_setting('synchronous_commit')
	ELSE current_setting('synchronous_commit') END, true)`

const commitGuardMarker = "refused by effectively.dev: "

// guardRefused reports whether err is commitGuardSQL's refusal.
func guardRefused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22023" && strings.Contains(pgErr.Message, commitGuardMarker)
}

// beginStatement is BEGIN with opts' isolation level.
func beginStatement(opts pgx.TxOptions) string {
	if opts.IsoLevel == "" {
		return "BEGIN"
	}
	return "BEGIN ISOLATION LEVEL " + strings.ToUpper(string(opts.IsoLevel))
}

// attemptPipelined runs one attempt of a pipelined Effect without looking
// its key up, in one round trip: BEGIN, the commit guard (unless async
// commits are allowed), the writes, the key's row and COMMIT. The key's
// primary key finds a duplicate, as in attempt.
func (e *Effect[In]) attemptPipelined(ctx context.Context, key effects.Key, fp []byte, q *queuedWrites) (effects.Result, classified) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return effects.Result{}, classify(ctx, opApply, key, err, false, false)
	}
	defer conn.Release() // destroys the connection unless it is idle, outside a transaction

	var b pgx.Batch
	b.Queue(beginStatement(e.txOptions))
	if !e.cfg.allowAsyncCommit {
		b.Queue(commitGuardSQL)
	}
	for _, st := range q.writes {
		b.Queue(st.SQL, st.Args...)
	}
	b.Queue(insertKeySQL, e.scope, string(key), fp, q.ref)
	b.Queue("COMMIT").Exec(commitTag)
	err = conn.SendBatch(ctx, &b).Close()
	if err == nil {
		return effects.Result{Status: effects.Applied, Ref: q.ref}, classified{}
	}
	end := func() { rollbackConn(ctx, conn.Conn()) }
	if failedTx(conn.Conn()) {
		// A statement failed and the server skipped the rest, COMMIT
		// included: nothing was committed.
		end()
	}
	switch {
	case guardRefused(err):
		return effects.Result{}, classified{err: asyncCommit(opApply, key)}
	case keyTaken(err):
		// The key was committed, before this attempt or by a concurrent
		// one: looking it up replays it.
		return effects.Result{}, classified{err: effects.Transient(opApply, key, err), retry: true, lookUp: true}
	case serverError(err):
		// A write (or COMMIT) failed on the server: nothing was committed.
		if committedMeanwhile(ctx, conn.Conn(), end, e.scope, key) {
			return effects.Result{}, classified{err: effects.Transient(opApply, key, err), retry: true, lookUp: true}
		}
		return effects.Result{}, classify(ctx, opApply, key, err, false, conn.Conn().IsClosed())
	}
	return effects.Result{}, classify(ctx, opApply, key, err, true, false)
}
