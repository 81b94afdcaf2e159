package postgres

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
)

// batchClaimSQL claims many keys in one statement and reports which were
// new. Rows are inserted in array order; ClaimBatch sorts the keys so that
// concurrent batches lock overlapping keys in the same order and do not
// deadlock each other.
const batchClaimSQL = `WITH ins AS (
	INSERT INTO effectively_keys (scope, key, fingerprint)
	SELECT $1, k, f FROM unnest($2::text[], $3::bytea[]) AS t (k, f)
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING key)
SELECT coalesce((SELECT array_agg(key) FROM ins), '{}'), current_setting('synchronous_commit'),
	current_setting('synchronous_standby_names') <> ''`

const batchLookupSQL = `SELECT key, fingerprint, ref FROM effectively_keys WHERE scope = $1 AND key = ANY ($2::text[])`

// BatchItem is one message's key and fingerprint for [ClaimBatch].
type BatchItem struct {
	Key         effects.Key
	Fingerprint []byte // nil is stored as empty
}

// BatchResult is what [ClaimBatch] found for the [BatchItem] at the same
// index.
type BatchResult struct {
	// Status is [effects.Applied] when the key was new and is now claimed in
	// the transaction: do this item's effect in it. It is
	// [effects.Replayed] when the key was committed earlier with the same
	// fingerprint (or appeared earlier in the same batch): do nothing. It is
	// zero when Err is set.
	Status effects.Status
	// Ref is the stored reference of a replayed key; empty for a key new in
	// this batch (see [SetRef]).
	Ref string
	// Err is nil, or an error wrapping [effects.ErrKeyReused]: the key is
	// known with a different fingerprint. Other items are unaffected.
	Err error
}

// ClaimBatch claims many keys in tx, a transaction the caller owns, with one
// INSERT ... SELECT unnest(...) ON CONFLICT DO NOTHING RETURNING key, and a
// second query only when some keys were already taken (to compare
// fingerprints and read refs). It is how a consumer that takes messages in
// batches stays effectively once at a fraction of the per-message cost: one
// transaction claims the whole batch, the caller writes the effects of the
// new items in the same transaction, commits, then acks the batch.
//
// The results are in the order of items. As with [Claim], the claims take
// effect only when tx commits, and the caller must ack only after the commit
// returned nil.
//
// All keys are validated first: if any is invalid, ClaimBatch returns an
// [effects.ErrInvalidKey] error naming it and does no I/O. A key that occurs
// more than once in items is claimed once, for its first occurrence; a later
// occurrence with the same fingerprint gets Status Replayed (with the first
// occurrence's Ref, empty if that one is new) and one with a different
// fingerprint gets ErrKeyReused, so the effect is done once per key.
//
// An error returned by ClaimBatch itself concerns the whole batch: roll back.
// [effects.ErrTransient] (serialization failure, deadlock, broken
// connection) means retry the whole transaction. Options: only
// [AllowAsyncCommit] applies. An empty batch does nothing.
func ClaimBatch(ctx context.Context, tx pgx.Tx, scope string, items []BatchItem, opts ...Option) ([]BatchResult, error) {
	const op = "postgres.ClaimBatch"
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

	// first[k] is the index of k's first occurrence.
	first := make(map[effects.Key]int, len(items))
	keys := make([]string, 0, len(items))
	for i, it := range items {
		if _, dup := first[it.Key]; !dup {
			first[it.Key] = i
			keys = append(keys, string(it.Key))
		}
	}
	slices.Sort(keys)
	fps := make([][]byte, len(keys))
	for i, k := range keys {
		fps[i] = nonNil(items[first[effects.Key(k)]].Fingerprint)
	}

	var inserted []string
	var settings claimOutcome
	if err := tx.QueryRow(ctx, batchClaimSQL, scope, keys, fps).Scan(&inserted, &settings.syncCommit, &settings.syncRep); err != nil {
		return nil, classify(ctx, op, "", err, false, tx.Conn().IsClosed()).err
	}
	if settings.unsafeCommit() && !cfg.allowAsyncCommit {
		return nil, fmt.Errorf("%s: %w", op, ErrAsyncCommit)
	}
	if settings.needsBarrier() && len(inserted) < len(keys) {
		// Some keys replay: make the commit wait for the standby, as Claim does.
		if _, err := tx.Exec(ctx, replayBarrierSQL); err != nil {
			return nil, classify(ctx, op, "", err, false, tx.Conn().IsClosed()).err
		}
	}

	type stored struct {
		fp  []byte
		ref string
	}
	isNew := make(map[effects.Key]bool, len(inserted))
	for _, k := range inserted {
		isNew[effects.Key(k)] = true
	}
	var seen map[effects.Key]stored
	if len(inserted) < len(keys) {
		taken := make([]string, 0, len(keys)-len(inserted))
		for _, k := range keys {
			if !isNew[effects.Key(k)] {
				taken = append(taken, k)
			}
		}
		rows, _ := tx.Query(ctx, batchLookupSQL, scope, taken)
		seen = make(map[effects.Key]stored, len(taken))
		var k string
		var s stored
		_, err := pgx.ForEachRow(rows, []any{&k, &s.fp, &s.ref}, func() error {
			seen[effects.Key(k)] = stored{fp: s.fp, ref: s.ref}
			return nil
		})
		if err != nil {
			return nil, classify(ctx, op, "", err, false, tx.Conn().IsClosed()).err
		}
		if len(seen) < len(taken) {
			return nil, effects.Transient(op, "", errVanished)
		}
	}

	results := make([]BatchResult, len(items))
	for i, it := range items {
		f := first[it.Key]
		switch {
		case f < i: // a repeat within the batch: compare with the first occurrence
			if !bytes.Equal(nonNil(it.Fingerprint), nonNil(items[f].Fingerprint)) {
				results[i].Err = reused(op, it.Key)
			} else if results[f].Err != nil {
				results[i].Err = results[f].Err
			} else {
				results[i] = BatchResult{Status: effects.Replayed, Ref: results[f].Ref}
			}
		case isNew[it.Key]:
			results[i].Status = effects.Applied
		default:
			s := seen[it.Key]
			if !bytes.Equal(s.fp, nonNil(it.Fingerprint)) {
				results[i].Err = reused(op, it.Key)
			} else {
				results[i] = BatchResult{Status: effects.Replayed, Ref: s.ref}
			}
		}
	}
	return results, nil
}
