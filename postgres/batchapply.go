package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
)

// BatchWriteFunc does the writes of items[i] of an [ApplyBatch] call in tx,
// the transaction that holds the claims of the whole batch, and returns a
// reference to what it wrote (a ledger row id) or "". Like a [WriteFunc] it
// must write only through tx and must not commit or roll back; it may run
// more than once for the same i, in a new transaction, when ApplyBatch
// retries.
type BatchWriteFunc func(ctx context.Context, tx pgx.Tx, i int) (ref string, err error)

// maxFailedWrites is how many failing writes one ApplyBatch call isolates
// (each costs a rolled-back transaction) before it gives up on the items
// not yet committed.
const maxFailedWrites = 3

// errBatchAbandoned is the cause of the items ApplyBatch did not apply
// because too many writes failed.
var errBatchAbandoned = fmt.Errorf("not applied: the batch was abandoned after %d failing writes of other items", maxFailedWrites)

const batchSetRefSQL = `UPDATE effectively_keys AS k SET ref = v.ref
	FROM unnest($2::text[], $3::text[]) AS v (key, ref)
	WHERE k.scope = $1 AND k.key = v.key`

// ApplyBatch makes the writes of many messages effectively once with one
// transaction for the whole batch: it claims every item's key with
// [ClaimBatch] (one statement), runs write for each item whose key is new,
// in index order and in the same transaction, stores the non-empty refs
// (one statement) and commits. Items whose key was committed before are
// Replayed with their stored ref, and write is not called for them. It is
// the natural body of an effects.BatchHandler; see [BatchErrors].
//
// The results are in the order of items. For an Applied item, Ref is what
// write returned; a key repeated within items is written once, for its
// first occurrence, and the repeats are Replayed with the same Ref (or get
// ErrKeyReused when their fingerprint differs). An item's Err is set, and
// the rest of the batch still commits, when:
//
//   - its key is known with another fingerprint ([effects.ErrKeyReused]);
//   - its write returned an error that is not the transaction's (not a
//     serialization failure, deadlock, lost connection or done ctx): the
//     transaction is rolled back and the batch runs again without that
//     item, so one bad message does not fail its neighbours. Each failing
//     write costs a rolled-back transaction; after 3 in one call, the items
//     not yet applied get an error saying so (ErrTransient: nothing of
//     theirs was written, retry them).
//
// The returned error concerns the whole batch, and then results is nil:
// [effects.ErrInvalidKey] (checked before any I/O), [ErrAsyncCommit],
// [effects.ErrTransient] (nothing committed; serialization failures and
// deadlocks are first retried internally, see [WithMaxRetries]), the
// context's error (nothing committed), or [effects.ErrAmbiguous] when the
// COMMIT's reply was lost: retry the same items, and they replay or apply.
// Ack the messages only after ApplyBatch returned, and only those whose
// result has no Err.
//
// Options: [WithMaxRetries], [WithIsolation] and [AllowAsyncCommit] apply.
// An empty batch does nothing.
func ApplyBatch(ctx context.Context, pool *pgxpool.Pool, scope string, items []BatchItem, write BatchWriteFunc, opts ...Option) ([]BatchResult, error) {
	const op = "postgres.ApplyBatch"
	if pool == nil || write == nil {
		return nil, fmt.Errorf("%s: nil pool or write function", op)
	}
	for i, it := range items {
		if err := it.Key.Validate(); err != nil {
			return nil, fmt.Errorf("%s: item %d: %w", op, i, err)
		}
	}
	if err := validateScope(op, scope); err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, nil
	}
	cfg := newConfig(opts)
	b := &applyBatch{
		op: op, pool: pool, scope: scope, items: items, write: write, opts: opts,
		txOptions: pgx.TxOptions{IsoLevel: cfg.isolation},
		failed:    make([]error, len(items)),
	}
	for attempt, failures := 0, 0; ; {
		results, c, itemErr := b.attempt(ctx)
		switch {
		case itemErr != nil:
			failures++
			if failures < maxFailedWrites {
				continue // run again without the failed item
			}
			for i := range b.failed {
				if b.failed[i] == nil {
					b.failed[i] = effects.Transient(op, items[i].Key, errBatchAbandoned)
				}
			}
			results = make([]BatchResult, len(items))
			for i := range results {
				results[i].Err = b.failed[i]
			}
			return results, nil
		case c.err == nil:
			return results, nil
		case !c.retry || attempt >= cfg.maxRetries:
			return nil, c.err
		}
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return nil, canceled(ctx, op, "", c.err)
		}
		attempt++
	}
}

// applyBatch is one ApplyBatch call.
type applyBatch struct {
	op        string
	pool      *pgxpool.Pool
	scope     string
	items     []BatchItem
	write     BatchWriteFunc
	opts      []Option
	txOptions pgx.TxOptions
	failed    []error // items[i] failed for good with failed[i]; left out of later attempts
}

// attempt runs the batch, without the failed items, in one transaction.
// On success c.err and itemErr are nil. When an item's write failed with
// an error of its own, it records it in b.failed and returns it as itemErr
// (after rolling back): run again.
func (b *applyBatch) attempt(ctx context.Context) (results []BatchResult, c classified, itemErr error) {
	op := b.op
	idx := make([]int, 0, len(b.items)) // index in items of each claimed item
	sub := make([]BatchItem, 0, len(b.items))
	for i, it := range b.items {
		if b.failed[i] == nil {
			idx = append(idx, i)
			sub = append(sub, it)
		}
	}
	results = make([]BatchResult, len(b.items))
	for i, err := range b.failed {
		results[i].Err = err
	}
	if len(sub) == 0 {
		return results, classified{}, nil
	}

	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, classify(ctx, op, "", err, false, false), nil
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, b.txOptions)
	if err != nil {
		return nil, classify(ctx, op, "", err, false, conn.Conn().IsClosed()), nil
	}
	ending := false
	defer func() {
		if !ending {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			_ = tx.Rollback(rctx)
			cancel()
		}
	}()

	claimed, err := ClaimBatch(ctx, tx, b.scope, sub, b.opts...)
	if err != nil {
		// ClaimBatch classified it; retry serialization failures, deadlocks
		// and keys pruned under our feet here, like Apply does.
		return nil, classified{err: err, retry: raceLost(err) || errors.Is(err, errVanished)}, nil
	}

	var refKeys, refs []string
	firstRef := map[effects.Key]string{}
	for j, r := range claimed {
		i := idx[j]
		switch {
		case r.Err != nil:
			results[i].Err = r.Err
		case r.Status == effects.Replayed:
			results[i] = BatchResult{Status: effects.Replayed, Ref: r.Ref}
		default:
			ref, err := b.write(ctx, tx, i)
			if err != nil {
				c := classify(ctx, op, b.items[i].Key, err, false, conn.Conn().IsClosed())
				if c.retry || ctx.Err() != nil || errors.Is(c.err, effects.ErrTransient) {
					return nil, c, nil // the transaction's failure, not the item's
				}
				b.failed[i] = fmt.Errorf("%s: item %d: write failed, other items unaffected: %w", op, i, err)
				return nil, classified{}, b.failed[i]
			}
			results[i] = BatchResult{Status: effects.Applied, Ref: ref}
			firstRef[b.items[i].Key] = ref
			if ref != "" {
				refKeys = append(refKeys, string(b.items[i].Key))
				refs = append(refs, ref)
			}
		}
	}
	// Repeats of a key new in this batch replay its first occurrence's ref.
	for i, r := range results {
		if r.Err == nil && r.Status == effects.Replayed && r.Ref == "" {
			if ref, ok := firstRef[b.items[i].Key]; ok {
				results[i].Ref = ref
			}
		}
	}

	ending = true // from here on, never roll back: the COMMIT may have happened
	var batch pgx.Batch
	if len(refKeys) > 0 {
		batch.Queue(batchSetRefSQL, b.scope, refKeys, refs)
	}
	batch.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" {
			return pgx.ErrTxCommitRollback
		}
		return nil
	})
	if err := conn.SendBatch(ctx, &batch).Close(); err != nil {
		return nil, classify(ctx, op, "", err, true, false), nil
	}
	return results, classified{}, nil
}

// raceLost reports whether err is a serialization failure or a deadlock
// reported as an ERROR: the transaction lost a race and may be retried.
func raceLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && isError(pgErr) &&
		(pgErr.Code == sqlstateSerializationFailure || pgErr.Code == sqlstateDeadlockDetected)
}

// BatchErrors turns what [ApplyBatch] returned into the one-error-per-item
// slice an effects.BatchHandler returns: err for every item when err is not
// nil (nothing, or an unknown part, was committed: every item must be
// retried), else each result's Err.
func BatchErrors(n int, results []BatchResult, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		switch {
		case err != nil:
			errs[i] = err
		case i < len(results):
			errs[i] = results[i].Err
		default:
			errs[i] = fmt.Errorf("postgres.BatchErrors: no result for item %d of %d", i, n)
		}
	}
	return errs
}

// Querier is what [Seen] and [Keys] need: *pgxpool.Pool, *pgx.Conn and
// pgx.Tx all satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Seen is a read-only pre-check: it reports whether key was committed under
// scope, with one SELECT on the primary key of effectively_keys, no
// transaction and no WAL. When it was, with the same fingerprint, Seen
// returns Status Replayed and the stored Ref (what the effect's Apply would
// return for the redelivery) and true; with another fingerprint, an
// [effects.ErrKeyReused] error. When it was not, it returns false: do the
// effect with Apply, which claims the key and stays the authority.
//
// Seen is an optimization for replay storms, where most deliveries are
// duplicates: one SELECT instead of BEGIN, claim, ROLLBACK. It sees only
// committed keys, so a duplicate that is being applied concurrently reads
// as not seen, and the Apply that follows waits for it and replays; Seen
// can never make a write be skipped that should happen. It costs a wasted
// round trip for every new key: package negcache keeps a Bloom filter that
// lets new keys skip it. fingerprint must be computed as the effect
// computes it (the default is effects.FingerprintJSON of the input).
func Seen(ctx context.Context, db Querier, scope string, key effects.Key, fingerprint []byte) (effects.Result, bool, error) {
	const op = "postgres.Seen"
	if err := key.Validate(); err != nil {
		return effects.Result{}, false, err
	}
	if err := validateScope(op, scope); err != nil {
		return effects.Result{}, false, err
	}
	var storedFP []byte
	var ref string
	err := db.QueryRow(ctx, lookupSQL, scope, string(key)).Scan(&storedFP, &ref)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return effects.Result{}, false, nil
	case err != nil:
		return effects.Result{}, false, classify(ctx, op, key, err, false, false).err
	case !bytes.Equal(storedFP, nonNil(fingerprint)):
		return effects.Result{}, false, reused(op, key)
	}
	return effects.Result{Status: effects.Replayed, Ref: ref}, true, nil
}

const keysSQL = `SELECT key FROM effectively_keys WHERE scope = $1 AND created_at >= $2`

// Keys calls fn with every key of scope committed at or after since, for
// instance to warm a negcache.Filter at startup so that a replay storm of
// messages handled before the restart finds them. It reads with one
// streaming query; an error from fn stops it and is returned.
func Keys(ctx context.Context, db Querier, scope string, since time.Time, fn func(effects.Key) error) error {
	const op = "postgres.Keys"
	if err := validateScope(op, scope); err != nil {
		return err
	}
	rows, err := db.Query(ctx, keysSQL, scope, since)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	var k string
	_, err = pgx.ForEachRow(rows, []any{&k}, func() error { return fn(effects.Key(k)) })
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}
