package postgres

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
)

// BatchItem is one message's key and fingerprint for [ClaimBatch].
type BatchItem struct {
	Key         effects.Key
	Fingerprint []byte // nil is stored as empty
}

// BatchResult is what [ClaimBatch] or [ApplyBatch] found for the
// [BatchItem] at the same index.
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
// connection) means retry the whole transaction. An empty batch does
// nothing. Its only [Option] is [AllowAsyncCommit].
func ClaimBatch(ctx context.Context, tx pgx.Tx, scope string, items []BatchItem, opts ...Option) ([]BatchResult, error) {
	const op = "postgres.ClaimBatch"
	if err := validateBatch(op, scope, items); err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, nil
	}
	cfg := newTxConfig(opts)
	c := newBatchClaim(op, scope, items)
	if err := c.scan(tx.QueryRow(ctx, batchClaimSQL, c.scope, c.keys, c.fps)); err != nil {
		return nil, classify(ctx, op, "", err, false, tx.Conn().IsClosed()).err
	}
	results, err := c.finish(ctx, tx, cfg.allowAsyncCommit)
	if err != nil {
		return nil, err
	}
	if c.needsBarrier() {
		// Some keys replay: make the commit wait for the standby, as Claim does.
		if _, err := tx.Exec(ctx, replayBarrierSQL); err != nil {
			return nil, classify(ctx, op, "", err, false, tx.Conn().IsClosed()).err
		}
	}
	return results, nil
}

// validateBatch checks every key, then scope, before any I/O.
func validateBatch(op, scope string, items []BatchItem) error {
	for i, it := range items {
		if err := it.Key.Validate(); err != nil {
			return fmt.Errorf("%s: item %d: %w", op, i, err)
		}
	}
	return validateScope(op, scope)
}

// batchClaim is one claim of a batch of items: queue sends the claim
// statement (in a pipeline that may begin the transaction), finish reads
// back the keys that were taken and builds the results.
type batchClaim struct {
	op, scope string
	items     []BatchItem
	first     map[effects.Key]int // index of each key's first occurrence
	keys      []string            // distinct keys, sorted
	fps       [][]byte            // their first occurrence's fingerprint
	inserted  []string            // keys the claim inserted
	settings  commitSettings
}

func newBatchClaim(op, scope string, items []BatchItem) *batchClaim {
	c := &batchClaim{op: op, scope: scope, items: items, first: make(map[effects.Key]int, len(items))}
	for i, it := range items {
		if _, dup := c.first[it.Key]; !dup {
			c.first[it.Key] = i
			c.keys = append(c.keys, string(it.Key))
		}
	}
	slices.Sort(c.keys)
	c.fps = make([][]byte, len(c.keys))
	for i, k := range c.keys {
		c.fps[i] = nonNil(items[c.first[effects.Key(k)]].Fingerprint)
	}
	return c
}

// queue adds the claim statement to batch.
func (c *batchClaim) queue(batch *pgx.Batch) {
	batch.Queue(batchClaimSQL, c.scope, c.keys, c.fps).QueryRow(c.scan)
}

// scan reads the claim statement's row.
func (c *batchClaim) scan(row pgx.Row) error {
	return row.Scan(&c.inserted, &c.settings.syncCommit, &c.settings.syncRep)
}

// needsBarrier reports whether some keys replay under synchronous
// replication, so that the transaction must pass the replay barrier.
func (c *batchClaim) needsBarrier() bool {
	return c.settings.replayNeedsBarrier() && len(c.inserted) < len(c.keys)
}

// finish runs after the claim statement: it refuses unsafe commit
// settings, reads the fingerprints and refs of the keys that were taken
// (one query, only if there are any) and returns the results in the order
// of items.
func (c *batchClaim) finish(ctx context.Context, tx pgx.Tx, allowAsyncCommit bool) ([]BatchResult, error) {
	op := c.op
	if c.settings.unsafeCommit() && !allowAsyncCommit {
		return nil, fmt.Errorf("%s: %w", op, ErrAsyncCommit)
	}
	isNew := make(map[effects.Key]bool, len(c.inserted))
	for _, k := range c.inserted {
		isNew[effects.Key(k)] = true
	}
	var seen map[effects.Key]stored
	if len(c.inserted) < len(c.keys) {
		taken := make([]string, 0, len(c.keys)-len(c.inserted))
		for _, k := range c.keys {
			if !isNew[effects.Key(k)] {
				taken = append(taken, k)
			}
		}
		rows, _ := tx.Query(ctx, batchLookupSQL, c.scope, taken)
		var err error
		if seen, err = collectStored(rows, len(taken)); err != nil {
			return nil, classify(ctx, op, "", err, false, tx.Conn().IsClosed()).err
		}
		if len(seen) < len(taken) {
			return nil, effects.Transient(op, "", errVanished)
		}
	}

	results := make([]BatchResult, len(c.items))
	for i, it := range c.items {
		f := c.first[it.Key]
		switch {
		case f < i: // a repeat within the batch: compare with the first occurrence
			if !bytes.Equal(nonNil(it.Fingerprint), nonNil(c.items[f].Fingerprint)) {
				results[i].Err = reused(op, it.Key)
			} else if results[f].Err != nil {
				results[i].Err = results[f].Err
			} else {
				results[i] = BatchResult{Status: effects.Replayed, Ref: results[f].Ref}
			}
		case isNew[it.Key]:
			results[i].Status = effects.Applied
		default:
			results[i] = seen[it.Key].result(op, it)
		}
	}
	return results, nil
}

// stored is a committed key's fingerprint and ref.
type stored struct {
	fp  []byte
	ref string
}

// result is what an item whose key is stored gets: a replay with the
// stored ref, or ErrKeyReused when the fingerprints differ.
func (s stored) result(op string, it BatchItem) BatchResult {
	if !bytes.Equal(s.fp, nonNil(it.Fingerprint)) {
		return BatchResult{Err: reused(op, it.Key)}
	}
	return BatchResult{Status: effects.Replayed, Ref: s.ref}
}

// collectStored reads rows of (key, fingerprint, ref).
func collectStored(rows pgx.Rows, n int) (map[effects.Key]stored, error) {
	out := make(map[effects.Key]stored, n)
	var k string
	var s stored
	_, err := pgx.ForEachRow(rows, []any{&k, &s.fp, &s.ref}, func() error {
		out[effects.Key(k)] = stored{fp: s.fp, ref: s.ref}
		return nil
	})
	return out, err
}
