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

// NewPipelined is [New] for writes known in advance, as statements that
// read nothing back: Apply sends BEGIN, the statements, the key's row
// (which also checks the commit settings) and COMMIT in one pipeline, so
// that a new key costs one round trip whatever the number of statements,
// where [New] costs three, and one more per statement beyond the first
// that the write function runs. A duplicate fails the pipeline (the key's row,
// or a statement that runs into the earlier one's rows) and rolls back,
// its statements with it, and replays, in three round trips (the
// pipeline, ROLLBACK, a lookup of the key); under synchronous replication,
// one more for the replay barrier. With [WithLookupFirst] it looks the key
// up first, as New does: two round trips for a new key, two and no WAL
// for a duplicate. A pipeline that failed (a duplicate's, a refused
// setting's) makes pgx forget the connection's prepared statements of it:
// the next Apply there prepares them again, one round trip more. The ref
// must be known
// before the writes run (statements returns it). A statement that fails
// on the server fails the whole transaction and nothing is committed: put
// checks in SQL (a constraint, a statement that raises), since nothing
// can read a result before COMMIT. Everything else, the options, the
// fingerprint, the errors, duplicates and retries, is as for [New]. It
// returns an [*effects.ConfigError] where New does, if statements is nil,
// and for [WithoutGroupCommit]: a pipelined Effect has no grouped shape.
//
// statements returns the effect's writes for in as statements that read
// nothing back, with the reference to store with key and replay (a row id
// the writes insert, made before they run: random, or derived from in). It
// must do no I/O: [Effect.Apply] calls it once, with its own ctx, before
// its first round trip, and sends the statements with the key's row and
// COMMIT.
func NewPipelined[In any](pool *pgxpool.Pool, scope string, statements func(ctx context.Context, key effects.Key, in In) (ref string, writes []Statement, err error), opts ...EffectOption) (*Effect[In], error) {
	const op = "postgres.NewPipelined"
	if statements == nil {
		return nil, effects.ConfigErrorf(op, "statements", "nil statements function")
	}
	e, err := newEffect[In](op, pool, scope, opts)
	if err != nil {
		return nil, err
	}
	if e.cfg.noGroupCommit {
		return nil, effects.ConfigErrorf(op, "WithoutGroupCommit", "a pipelined Effect has no grouped shape; leave it out")
	}
	e.statements = statements
	return e, nil
}

// queuedWrites are the statements of one Apply of a pipelined Effect.
type queuedWrites struct {
	ref    string
	writes []Statement
}

// queue calls the Effect's statements function and checks what it returned.
func (e *Effect[In]) queue(ctx context.Context, key effects.Key, in In) (*queuedWrites, error) {
	ref, writes, err := e.statements(ctx, key, in)
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

// queueOn queues the writes on b.
func (q *queuedWrites) queueOn(b *pgx.Batch) {
	for _, st := range q.writes {
		b.Queue(st.SQL, st.Args...)
	}
}

// guardRefused reports whether err is commitGuardExpr's refusal.
func guardRefused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, commitGuardMarker)
}

// beginStatement is BEGIN with opts' isolation level.
func beginStatement(opts pgx.TxOptions) string {
	if opts.IsoLevel == "" {
		return "BEGIN"
	}
	return "BEGIN ISOLATION LEVEL " + strings.ToUpper(string(opts.IsoLevel))
}

// attemptPipelined runs one attempt of a pipelined Effect without looking
// its key up first, in one round trip: BEGIN, the writes, the key's row
// (with the commit guard unless async commits are allowed) and COMMIT. A
// key committed before fails the key's INSERT (or a write that runs into
// the earlier one's rows fails first), and is looked up after the
// rollback (endFailed).
func (e *Effect[In]) attemptPipelined(ctx context.Context, key effects.Key, fp []byte, q *queuedWrites) (effects.Result, classified) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return effects.Result{}, classify(ctx, opApply, key, err, false, false)
	}
	defer conn.Release() // destroys the connection unless it is idle, outside a transaction

	var b pgx.Batch
	b.Queue(beginStatement(e.txOptions))
	q.queueOn(&b)
	queueKeyInsert(&b, e.scope, key, fp, q.ref, !e.cfg.allowAsyncCommit)
	b.Queue("COMMIT").Exec(commitTag)
	if err = conn.SendBatch(ctx, &b).Close(); err == nil {
		if c := waitCut(ctx, key); c.err != nil {
			return effects.Result{}, c
		}
		return effects.Result{Status: effects.Applied, Ref: q.ref}, classified{}
	}
	return e.endFailed(ctx, conn.Conn(), func() { rollbackConn(ctx, conn.Conn()) }, key, fp, err, true, false)
}
