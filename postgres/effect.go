package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
)

// WriteFunc does an effect's writes in tx, the transaction that also holds
// the claim on its key, and returns a reference to what it wrote (a ledger
// row id, say) or "". It must write only through tx: anything it does
// outside the transaction (an HTTP call, a message sent) is not undone when
// the transaction rolls back and is repeated when Apply retries. It must not
// commit or roll back tx (Apply does), nor keep tx after it returns.
type WriteFunc[In any] func(ctx context.Context, tx pgx.Tx, in In) (ref string, err error)

// Effect is an [effects.Effect] whose side effect is a set of writes to the
// same PostgreSQL database that holds its keys. Apply runs them in one
// transaction with a row in effectively_keys, so the writes and the record
// that they happened commit together or not at all: effectively once, with
// no window. Create it with [New]; it is safe for concurrent use.
type Effect[In any] struct {
	pool        *pgxpool.Pool
	scope       string
	write       WriteFunc[In]
	fingerprint func(In) ([]byte, error)
	txOptions   pgx.TxOptions
	cfg         config
}

var _ effects.Effect[struct{}] = (*Effect[struct{}])(nil)

// New returns an Effect that runs write under keys in scope (an application
// or tenant name; keys are unique per scope). The tables must exist: see
// [Migrate]. It fails if pool or write is nil, scope is empty, not UTF-8 or
// contains NUL, or a [WithFingerprint] option is for another input type.
func New[In any](pool *pgxpool.Pool, scope string, write WriteFunc[In], opts ...Option) (*Effect[In], error) {
	const op = "postgres.New"
	if pool == nil {
		return nil, fmt.Errorf("%s: nil pool", op)
	}
	if write == nil {
		return nil, fmt.Errorf("%s: nil write function", op)
	}
	if err := validateScope(op, scope); err != nil {
		return nil, err
	}
	cfg := newConfig(opts)
	e := &Effect[In]{
		pool:        pool,
		scope:       scope,
		write:       write,
		fingerprint: func(in In) ([]byte, error) { return effects.FingerprintJSON(in) },
		txOptions:   pgx.TxOptions{IsoLevel: cfg.isolation},
		cfg:         cfg,
	}
	if cfg.fingerprint != nil {
		f, ok := cfg.fingerprint.(func(In) ([]byte, error))
		if !ok {
			var zero In
			return nil, fmt.Errorf("%s: WithFingerprint: got %T, want func(%T) ([]byte, error)", op, cfg.fingerprint, zero)
		}
		e.fingerprint = f
	}
	return e, nil
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

// Apply runs the effect for in under key, once. In one transaction it
// inserts (scope, key, fingerprint) with ON CONFLICT DO NOTHING; if the row
// is new it runs the write, stores its ref (if not empty) and commits,
// returning [effects.Applied] with the ref. If the key was committed before
// with the same fingerprint, it rolls back and returns [effects.Replayed]
// with the stored ref; a concurrent duplicate waits for the first to finish
// and then replays (or applies, if the first rolled back). Cost of a new
// key: round trips for BEGIN, the claim (pipelined with a read-back of the
// key), the write, and COMMIT (pipelined with the UPDATE that stores a
// non-empty ref). Cost of a duplicate: BEGIN, the claim, ROLLBACK, and no
// WAL.
//
// Errors:
//   - [effects.ErrInvalidKey]: key is invalid; checked before any I/O.
//   - [effects.ErrKeyReused]: the key was used with another fingerprint;
//     nothing was written.
//   - [ErrAsyncCommit]: synchronous_commit is off (see [AllowAsyncCommit]);
//     nothing was written.
//   - [effects.ErrTransient]: nothing was committed (a broken connection
//     before COMMIT, or serialization failures/deadlocks beyond
//     [WithMaxRetries]); retry with the same key.
//   - [effects.ErrAmbiguous]: COMMIT was sent but its reply was lost (or ctx
//     ended while waiting for it); the effect may have committed. Retry with
//     the same key: it replays or applies.
//   - the context's error, wrapped, when ctx ended before COMMIT was sent:
//     nothing was committed.
//   - the write's own error, wrapped with %w, after rolling back.
//
// Use [effects.Retryable] to decide whether to retry.
func (e *Effect[In]) Apply(ctx context.Context, key effects.Key, in In) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	fp, err := e.fingerprint(in)
	if err != nil {
		return effects.Result{}, fmt.Errorf("%s key %q: fingerprint: %w", opApply, key, err)
	}
	fp = nonNil(fp)
	for attempt := 0; ; attempt++ {
		res, c := e.attempt(ctx, key, fp, in)
		if !c.retry || attempt >= e.cfg.maxRetries {
			return res, c.err
		}
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return effects.Result{}, canceled(ctx, opApply, key, c.err)
		}
	}
}

const opApply = "postgres.Apply"

// rollbackTimeout bounds a rollback, which runs even when the caller's
// context is done so that a healthy connection goes back to the pool.
const rollbackTimeout = 5 * time.Second

// attempt runs one transaction. On success c.err is nil.
//
// It runs on a connection of its own rather than a pgxpool.Tx so that it
// can end the transaction with the ref UPDATE and COMMIT pipelined in one
// round trip; the pgx.Tx given to the write is then abandoned, and Release
// checks that the connection is idle before pooling it again.
func (e *Effect[In]) attempt(ctx context.Context, key effects.Key, fp []byte, in In) (effects.Result, classified) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return effects.Result{}, classify(ctx, opApply, key, err, false, false)
	}
	defer conn.Release() // destroys the connection unless it is idle, outside a transaction
	tx, err := conn.BeginTx(ctx, e.txOptions)
	if err != nil {
		return effects.Result{}, classify(ctx, opApply, key, err, false, conn.Conn().IsClosed())
	}
	ending := false
	defer func() {
		if !ending {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			_ = tx.Rollback(rctx) // if this fails, the connection is closed and discarded
			cancel()
		}
	}()
	fail := func(err error) (effects.Result, classified) {
		return effects.Result{}, classify(ctx, opApply, key, err, false, conn.Conn().IsClosed())
	}

	out, err := claimKey(ctx, tx, opApply, e.scope, key, fp)
	switch {
	case errors.Is(err, effects.ErrKeyReused):
		return effects.Result{}, classified{err: err}
	case errors.Is(err, errVanished):
		return effects.Result{}, classified{err: effects.Transient(opApply, key, err), retry: true}
	case err != nil:
		return fail(err)
	case out.unsafeCommit() && !e.cfg.allowAsyncCommit:
		return effects.Result{}, classified{err: asyncCommit(opApply, key)}
	case out.needsBarrier():
		// Report the replay only once the earlier commit is surely on the
		// synchronous standby (see replayBarrierSQL).
		ending = true
		var batch pgx.Batch
		batch.Queue(replayBarrierSQL)
		batch.Queue("COMMIT")
		if err := conn.SendBatch(ctx, &batch).Close(); err != nil {
			return effects.Result{}, classify(ctx, opApply, key, err, true, false)
		}
		return effects.Result{Status: effects.Replayed, Ref: out.ref}, classified{}
	case !out.inserted:
		return effects.Result{Status: effects.Replayed, Ref: out.ref}, classified{}
	}

	ref, err := e.write(ctx, tx, in)
	if err != nil {
		return fail(err)
	}
	ending = true // from here on, never roll back: the COMMIT may have happened
	if ref == "" {
		err = tx.Commit(ctx)
	} else {
		var batch pgx.Batch
		batch.Queue(setRefSQL, e.scope, string(key), ref)
		batch.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
			if tag.String() == "ROLLBACK" {
				return pgx.ErrTxCommitRollback
			}
			return nil
		})
		err = conn.SendBatch(ctx, &batch).Close()
	}
	if err != nil {
		return effects.Result{}, classify(ctx, opApply, key, err, true, false)
	}
	return effects.Result{Status: effects.Applied, Ref: ref}, classified{}
}

// backoff returns the pause before retry number attempt+1: a random time
// between half and all of a ceiling that doubles from 2 ms up to 100 ms.
func backoff(attempt int) time.Duration {
	ceiling := min(2*time.Millisecond<<min(attempt, 10), 100*time.Millisecond)
	return ceiling/2 + rand.N(ceiling/2+1)
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
