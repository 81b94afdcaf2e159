package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
	"effectively.dev/internal/sqlkeys"
)

// errBatchAbandoned is the cause of the items ApplyBatch did not apply
// because too many writes failed.
var errBatchAbandoned = fmt.Errorf("not applied: the batch was abandoned after %d failing writes of other items", maxFailedWrites)

// ApplyBatch makes the writes of many messages effectively once with one
// transaction for the whole batch: it claims every item's key with
// [ClaimBatch] (one statement, pipelined with BEGIN), runs write for each
// item whose key is new, in index order and in the same transaction, stores
// the non-empty refs and commits (one round trip for both). Items whose key
// was committed before are Replayed with their stored ref, and write is not
// called for them. It is the natural body of a consume.WithBatch handler; see
// [BatchErrors].
//
// With [WithPrecheck], the keys a filter may have seen are first looked up
// with one read-only query: those committed replay without a
// transaction, and only the rest are claimed. That is the cheap path for a
// replay storm, where most keys of a batch were applied before.
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
// [*effects.ConfigError] (a nil pool or write, a bad scope or option),
// [effects.ErrInvalidKey] (both checked before any I/O), [ErrAsyncCommit],
// [effects.ErrTransient] (nothing committed; serialization failures and
// deadlocks are first retried internally, see [WithMaxRetries]), the
// context's error (nothing committed), or [effects.ErrAmbiguous] when the
// COMMIT's reply was lost: retry the same items, and they replay or apply.
// Ack the messages only after ApplyBatch returned, and only those whose
// result has no Err.
//
// write does the writes of items[i] in tx, the transaction that holds the
// claims of the whole batch, and returns a reference to what it wrote (a
// ledger row id) or "". Like [New]'s write it must write only through tx
// and must not commit or roll back; it may run more than once for the same
// i, in a new transaction, when ApplyBatch retries. An empty batch does
// nothing.
func ApplyBatch(ctx context.Context, pool *pgxpool.Pool, scope string, items []BatchItem, write func(ctx context.Context, tx pgx.Tx, i int) (ref string, err error), opts ...BatchOption) ([]BatchResult, error) {
	const op = "postgres.ApplyBatch"
	switch {
	case pool == nil:
		return nil, effects.ConfigErrorf(op, "pool", "nil")
	case write == nil:
		return nil, effects.ConfigErrorf(op, "write", "nil write function")
	}
	if err := validateBatch(op, scope, items); err != nil {
		return nil, err
	}
	cfg, err := newBatchConfig(op, opts)
	if err != nil || len(items) == 0 {
		return nil, err
	}
	b := &applyBatch{
		op: op, pool: pool, scope: scope, items: items, write: write, cfg: cfg,
		txOptions: pgx.TxOptions{IsoLevel: cfg.isolation},
		failed:    make([]error, len(items)),
		done:      make([]bool, len(items)),
	}
	precheck := make([]BatchResult, len(items))
	if cfg.precheck != nil {
		if err := b.precheck(ctx, precheck); err != nil {
			return nil, err
		}
	}
	results, err := b.run(ctx)
	if err != nil {
		return nil, err
	}
	for i, r := range precheck {
		if b.done[i] {
			results[i] = r
		}
	}
	if b.replays && !b.barrierPassed {
		// Only the pre-check replayed, and under synchronous replication:
		// report those replays once the standby has what they found.
		if _, err := pool.Exec(ctx, replayBarrierSQL); err != nil {
			berr := classify(ctx, op, "", err, false, false).err
			for i := range results {
				if b.done[i] && results[i].Err == nil {
					results[i] = BatchResult{Err: berr}
				}
			}
		}
	}
	if cfg.precheck != nil {
		for i, r := range results {
			if !b.done[i] && r.Err == nil {
				cfg.precheck.Add(items[i].Key) // committed: now the filter may know it
			}
		}
	}
	return results, nil
}

// applyBatch is one ApplyBatch call.
type applyBatch struct {
	op        string
	pool      *pgxpool.Pool
	scope     string
	items     []BatchItem
	write     func(ctx context.Context, tx pgx.Tx, i int) (string, error)
	cfg       batchConfig
	txOptions pgx.TxOptions
	failed    []error // items[i] failed for good with failed[i]; left out of later attempts
	done      []bool  // items[i] was settled by the pre-check; left out of the transaction

	replays       bool // the pre-check replayed keys under synchronous replication
	barrierPassed bool // a commit that waited for the standby followed the pre-check
}

// precheck looks up, with one query, the items whose key the filter may
// have seen, and settles those found committed: out[i] is their result and
// done[i] is set. A failed lookup settles nothing (the transaction, which
// is the authority, decides), unless ctx is done or commits are unsafe.
func (b *applyBatch) precheck(ctx context.Context, out []BatchResult) error {
	var idx []int
	var maybe []BatchItem
	for i, it := range b.items {
		if b.cfg.precheck.MaybeSeen(it.Key) {
			idx = append(idx, i)
			maybe = append(maybe, it)
		}
	}
	if len(maybe) == 0 {
		return nil
	}
	found, settings, err := seenBatch(ctx, b.pool, b.op, b.scope, maybe)
	switch {
	case err != nil && ctx.Err() != nil:
		return sqlkeys.Canceled(ctx, b.op, "", err)
	case err != nil:
		return nil // fall back to the transaction
	case len(found) > 0 && settings.unsafeCommit() && !b.cfg.allowAsyncCommit:
		return fmt.Errorf("%s: %w", b.op, ErrAsyncCommit)
	}
	for j, i := range idx {
		if s, ok := found[maybe[j].Key]; ok {
			out[i] = s.result(b.op, maybe[j])
			b.done[i] = true
			b.replays = b.replays || (out[i].Err == nil && settings.replayNeedsBarrier())
		}
	}
	return nil
}

// run claims and writes the items the pre-check did not settle, retrying
// lost races and isolating failing writes.
func (b *applyBatch) run(ctx context.Context) ([]BatchResult, error) {
	for attempt, failures := 1, 0; ; {
		results, c, itemErr := b.attempt(ctx)
		switch {
		case itemErr != nil:
			failures++
			if failures < maxFailedWrites {
				continue // run again without the failed item
			}
			results = make([]BatchResult, len(b.items))
			for i := range results {
				switch {
				case b.failed[i] != nil:
					results[i].Err = b.failed[i]
				case !b.done[i]:
					results[i].Err = effects.Transient(b.op, b.items[i].Key, errBatchAbandoned)
				}
			}
			return results, nil
		case c.err == nil:
			return results, nil
		case !c.retry || attempt > b.cfg.maxRetries:
			return nil, c.err
		}
		if err := retry.Sleep(ctx, retryBackoff.Delay(attempt)); err != nil {
			return nil, sqlkeys.Canceled(ctx, b.op, "", c.err)
		}
		attempt++
	}
}

// attempt runs the batch, without the failed and settled items, in one
// transaction. On success c.err and itemErr are nil. When an item's write
// failed with an error of its own, it records it in b.failed and returns it
// as itemErr (after rolling back): run again.
func (b *applyBatch) attempt(ctx context.Context) (results []BatchResult, c classified, itemErr error) {
	idx, sub := b.pending()
	results = make([]BatchResult, len(b.items))
	for i, err := range b.failed {
		results[i].Err = err
	}
	if len(sub) == 0 {
		return results, classified{}, nil
	}
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, classify(ctx, b.op, "", err, false, false), nil
	}
	defer conn.Release()
	claim := newBatchClaim(b.op, b.scope, sub)
	tx, claimed, c := b.begin(ctx, conn, claim)
	if c.err != nil {
		return nil, c, nil
	}
	ending := false
	defer func() {
		if !ending {
			rollback(ctx, tx)
		}
	}()
	refs, c, itemErr := b.writeAll(ctx, tx, conn.Conn().IsClosed, idx, claimed, results)
	if c.err != nil || itemErr != nil {
		return nil, c, itemErr
	}
	replayFirstRefs(b.items, results, refs.first)
	ending = true // from here on, never roll back blindly: the COMMIT may have happened
	if c := b.commit(ctx, conn, tx, refs, claim.needsBarrier() || b.replays); c.err != nil {
		return nil, c, nil
	}
	return results, classified{}, nil
}

// pending returns the items of the next attempt (neither failed nor
// settled by the pre-check) and their indexes in b.items.
func (b *applyBatch) pending() (idx []int, sub []BatchItem) {
	idx = make([]int, 0, len(b.items))
	sub = make([]BatchItem, 0, len(b.items))
	for i, it := range b.items {
		if b.failed[i] == nil && !b.done[i] {
			idx = append(idx, i)
			sub = append(sub, it)
		}
	}
	return idx, sub
}

// begin sends BEGIN with the claim of every key, in one round trip, and
// returns the transaction and what the claim found (classified, with
// keys pruned under the claim retried as serialization failures and
// deadlocks are). On an error the transaction is rolled back.
func (b *applyBatch) begin(ctx context.Context, conn *pgxpool.Conn, claim *batchClaim) (pgx.Tx, []BatchResult, classified) {
	var batch pgx.Batch
	batch.BeginTx(b.txOptions)
	claim.queue(&batch)
	br := conn.SendBatch(ctx, &batch)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		rollback(ctx, tx)
		return nil, nil, classify(ctx, b.op, "", err, false, conn.Conn().IsClosed())
	}
	claimed, err := claim.finish(ctx, tx, b.cfg.allowAsyncCommit)
	if err != nil {
		rollback(ctx, tx)
		return nil, nil, classified{err: err, retry: raceLost(err) || errors.Is(err, errVanished)}
	}
	return tx, claimed, classified{}
}

// batchRefs are the refs an attempt stores: the non-empty ones with their
// keys, and every new key's first ref (for its repeats in the batch).
type batchRefs struct {
	keys, refs []string
	first      map[effects.Key]string
}

// writeAll fills results for the claimed items (idx[j] is claimed[j]'s
// index in b.items): their error, their replay, or, for a new key, the
// ref of its write, run in tx. A write that failed with an error of its
// own is recorded in b.failed and returned as itemErr; one that failed
// with the transaction's is returned as c.
func (b *applyBatch) writeAll(ctx context.Context, tx pgx.Tx, closed func() bool, idx []int, claimed, results []BatchResult) (refs batchRefs, c classified, itemErr error) {
	refs.first = map[effects.Key]string{}
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
				c, itemErr := b.writeFailed(ctx, i, err, closed())
				return refs, c, itemErr
			}
			results[i] = BatchResult{Status: effects.Applied, Ref: ref}
			refs.first[b.items[i].Key] = ref
			if ref != "" {
				refs.keys = append(refs.keys, string(b.items[i].Key))
				refs.refs = append(refs.refs, ref)
			}
		}
	}
	return refs, classified{}, nil
}

// writeFailed classifies the error of items[i]'s write: the
// transaction's (a race lost, a lost connection, ctx ended) as c; else
// the item's own, recorded in b.failed and returned as itemErr.
func (b *applyBatch) writeFailed(ctx context.Context, i int, err error, closed bool) (classified, error) {
	c := classify(ctx, b.op, b.items[i].Key, err, false, closed)
	if c.retry || ctx.Err() != nil || errors.Is(c.err, effects.ErrTransient) {
		return c, nil
	}
	b.failed[i] = fmt.Errorf("%s: item %d: write failed, other items unaffected: %w", b.op, i, err)
	return classified{}, b.failed[i]
}

// replayFirstRefs gives the repeats of a key new in the batch (Replayed
// with no ref) its first occurrence's ref.
func replayFirstRefs(items []BatchItem, results []BatchResult, first map[effects.Key]string) {
	for i, r := range results {
		if r.Err == nil && r.Status == effects.Replayed && r.Ref == "" {
			if ref, ok := first[items[i].Key]; ok {
				results[i].Ref = ref
			}
		}
	}
}

// commit stores the refs and commits, in one round trip, with the replay
// barrier first when barrier (replays, of the claim or of the pre-check,
// under synchronous replication: this COMMIT then waits for the standby).
func (b *applyBatch) commit(ctx context.Context, conn *pgxpool.Conn, tx pgx.Tx, refs batchRefs, barrier bool) classified {
	var end pgx.Batch
	if len(refs.keys) > 0 {
		end.Queue(batchSetRefSQL, b.scope, refs.keys, refs.refs)
	}
	if barrier {
		end.Queue(replayBarrierSQL)
	}
	end.Queue("COMMIT").Exec(commitTag)
	if err := conn.SendBatch(ctx, &end).Close(); err != nil {
		if failedTx(conn.Conn()) {
			rollback(ctx, tx)
		}
		return classify(ctx, b.op, "", err, true, false)
	}
	b.barrierPassed = b.barrierPassed || barrier
	return classified{}
}

// raceLost reports whether err is a serialization failure, a deadlock or
// a lock not available reported as an ERROR: the transaction lost a race
// and may be retried (lostRace).
func raceLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && isError(pgErr) && lostRace(pgErr.Code)
}

// BatchErrors turns what [ApplyBatch] returned into the one-error-per-item
// slice a consume.WithBatch handler returns: err for every item when err is not
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

// Seen is a read-only pre-check: it reports whether key was committed under
// scope, with one SELECT on the primary key of effectively_keys, no
// transaction and no WAL. When it was, with the same fingerprint, Seen
// returns Status Replayed and the stored Ref (what the effect's Apply would
// return for the redelivery) and true; with another fingerprint, an
// [effects.ErrKeyReused] error. When it was not, it returns false: do the
// effect with Apply, which stays the authority.
//
// Seen is an optimization for replay storms, where most deliveries are
// duplicates: one SELECT instead of a transaction. It sees only committed
// keys, so a duplicate that is being applied concurrently reads as not
// seen, and the Apply that follows waits for it and replays; Seen can never
// make a write be skipped that should happen. It costs a wasted round trip
// for every new key: package negcache keeps a Bloom filter that lets new
// keys skip it; for many keys at once, use [ApplyBatch] with
// [WithPrecheck]. fingerprint must be
// computed as the effect computes it (the default is
// effects.FingerprintJSON of the input).
//
// As a replay it follows Apply's rules: under synchronous replication it
// reports a found key only after the replay barrier (an autocommit
// statement that writes a few bytes of WAL and waits for the standby; in a
// pgx.Tx, the caller's COMMIT waits instead, so ack after it), and with
// unsafe commit settings it returns [ErrAsyncCommit]. Its only
// [Option] is [AllowAsyncCommit].
func Seen(ctx context.Context, db DB, scope string, key effects.Key, fingerprint []byte, opts ...Option) (effects.Result, bool, error) {
	const op = "postgres.Seen"
	if err := key.Validate(); err != nil {
		return effects.Result{}, false, err
	}
	if err := validateScope(op, scope); err != nil {
		return effects.Result{}, false, err
	}
	cfg := newTxConfig(opts)
	var s stored
	var settings commitSettings
	err := db.QueryRow(ctx, seenSQL, scope, string(key)).Scan(&s.fp, &s.ref, &settings.syncCommit, &settings.syncRep)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return effects.Result{}, false, nil
	case err != nil:
		return effects.Result{}, false, classify(ctx, op, key, err, false, false).err
	case settings.unsafeCommit() && !cfg.allowAsyncCommit:
		return effects.Result{}, false, asyncCommit(op, key)
	}
	r := s.result(op, BatchItem{Key: key, Fingerprint: fingerprint})
	if r.Err != nil {
		return effects.Result{}, false, r.Err
	}
	if settings.replayNeedsBarrier() {
		if _, err := db.Exec(ctx, replayBarrierSQL); err != nil {
			return effects.Result{}, false, classify(ctx, op, key, err, false, false).err
		}
	}
	return effects.Result{Status: r.Status, Ref: r.Ref}, true, nil
}

// seenBatch looks up the distinct keys of items, returning those committed
// and the session's commit settings (zero when none was found).
func seenBatch(ctx context.Context, db DB, op, scope string, items []BatchItem) (map[effects.Key]stored, commitSettings, error) {
	keys := make([]string, 0, len(items))
	dedup := make(map[effects.Key]bool, len(items))
	for _, it := range items {
		if !dedup[it.Key] {
			dedup[it.Key] = true
			keys = append(keys, string(it.Key))
		}
	}
	found := make(map[effects.Key]stored, len(keys))
	var settings commitSettings
	rows, _ := db.Query(ctx, seenBatchSQL, scope, keys)
	var k string
	var s stored
	_, err := pgx.ForEachRow(rows, []any{&k, &s.fp, &s.ref, &settings.syncCommit, &settings.syncRep}, func() error {
		found[effects.Key(k)] = stored{fp: s.fp, ref: s.ref}
		return nil
	})
	if err != nil {
		return nil, commitSettings{}, classify(ctx, op, "", err, false, false).err
	}
	return found, settings, nil
}

// Keys calls fn with every key of scope committed at or after since, for
// instance to warm a negcache.Filter at startup so that a replay storm of
// messages handled before the restart finds them. It reads with one
// streaming query; an error from fn stops it and is returned.
func Keys(ctx context.Context, db DB, scope string, since time.Time, fn func(effects.Key) error) error {
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

// maxFailedWrites is how many failing writes one ApplyBatch call isolates
// (each costs a rolled-back transaction) before it gives up on the items
// not yet committed.
const maxFailedWrites = 3
