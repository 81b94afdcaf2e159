package postgres_test

// BenchmarkApplyShapes measures, by hand-written SQL on one durable
// cluster, the shapes of transaction Apply could take for a new key, side
// by side (round-robin, key by key), to choose the cheapest way to keep the
// ref that stays correct. See bench_test.go for the command.
//
// Every shape but plain_insert and handwritten sends BEGIN in one pipelined
// batch with the statements that follow it (pgx Batch.BeginTx), so each
// takes three round trips, as plain_insert does:
//
//   - plain_insert: BEGIN; INSERT ledger; COMMIT (no dedup, the baseline).
//   - handwritten: the essay's fixed handler: BEGIN; INSERT key ON CONFLICT
//     DO NOTHING; INSERT ledger; COMMIT (four round trips, no ref kept, no
//     fingerprint compared, no setting read).
//   - claim_update: [BEGIN, claim CTE, read-back]; INSERT ledger; [UPDATE
//     ref, COMMIT]: the key row is inserted first and updated with the ref
//     (the prototype).
//   - claim_noref: the same without the UPDATE (the ref is lost).
//   - lock_insert: [BEGIN, advisory lock on the key's hash with the
//     settings, read-back]; INSERT ledger; [INSERT key with its ref,
//     COMMIT]: the key row is written once, with its ref. What Apply did
//     until it dropped the lock.
//   - lookup_insert: lock_insert without the advisory lock: a concurrent
//     duplicate is not made to wait, runs its write, and rolls back at the
//     key's INSERT (23505).
//   - lookup_merged: lookup_insert with the settings and the lookup in one
//     statement: what Apply does while duplicates are frequent.
//   - settings_insert: [BEGIN, the settings]; INSERT ledger; [INSERT key
//     with its ref, COMMIT]: no lookup, the key's INSERT finds a
//     duplicate. What Apply does for a new key while duplicates are rare.
//   - apply: Effect.Apply itself.
//   - floor_batch_begin, floor_key_row: lower bounds that do not dedup:
//     plain_insert with BEGIN in a batch, and that plus the key row
//     inserted before COMMIT without any lookup.

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
)

const (
	shapeClaimSQL = `WITH ins AS (
	INSERT INTO effectively_keys (scope, key, fingerprint) VALUES ($1, $2, $3)
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING 1)
SELECT EXISTS (SELECT 1 FROM ins), current_setting('synchronous_commit'),
	current_setting('synchronous_standby_names') <> ''`
	shapeLookupSQL = `SELECT fingerprint, ref FROM effectively_keys WHERE scope = $1 AND key = $2`
	shapeLockSQL   = `SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2)), current_setting('synchronous_commit'),
	current_setting('synchronous_standby_names') <> ''`
	// shapeNoLockSQL reads the same settings, without the lock.
	shapeNoLockSQL = `SELECT $1::text, $2::text, current_setting('synchronous_commit'),
	current_setting('synchronous_standby_names') <> ''`
	shapeInsertKeySQL = `INSERT INTO effectively_keys (scope, key, fingerprint, ref) VALUES ($1, $2, $3, $4)`
)

// runShape runs one new key through a shape of three round trips: [BEGIN,
// what first queues]; the ledger write; [what last queues, COMMIT]. The new
// function first returns reports, once the batch ran, whether the key was
// found new.
func runShape(b *testing.B, lb *ledgerBench, k effects.Key,
	first func(batch *pgx.Batch, fp []byte) (isNew func() bool),
	last func(batch *pgx.Batch, fp []byte, ref string)) {
	ctx := lb.ctx
	conn, err := lb.pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	fp, _ := effects.FingerprintJSON(benchPayment(k))
	var batch pgx.Batch
	batch.BeginTx(pgx.TxOptions{})
	isNew := first(&batch, fp)
	br := conn.SendBatch(ctx, &batch)
	tx := br.Tx()
	if err := br.Close(); err != nil || !isNew() {
		b.Fatal("key not new", err)
	}
	ref, err := writeLedger(ctx, tx, benchPayment(k))
	if err != nil {
		b.Fatal(err)
	}
	var end pgx.Batch
	last(&end, fp, ref)
	end.Queue("COMMIT")
	if err := conn.SendBatch(ctx, &end).Close(); err != nil {
		b.Fatal(err)
	}
}

// shapeClaim inserts the key first, and updates its ref before COMMIT if
// withRef.
func shapeClaim(b *testing.B, lb *ledgerBench, k effects.Key, withRef bool) {
	runShape(b, lb, k, func(batch *pgx.Batch, fp []byte) func() bool {
		var inserted, rep bool
		var sc, storedRef string
		var storedFP []byte
		batch.Queue(shapeClaimSQL, "billing", string(k), fp).QueryRow(func(r pgx.Row) error { return r.Scan(&inserted, &sc, &rep) })
		batch.Queue(shapeLookupSQL, "billing", string(k)).QueryRow(func(r pgx.Row) error { return r.Scan(&storedFP, &storedRef) })
		return func() bool { return inserted && sc == "on" }
	}, func(batch *pgx.Batch, _ []byte, ref string) {
		if withRef {
			batch.Queue(`UPDATE effectively_keys SET ref = $3 WHERE scope = $1 AND key = $2`, "billing", string(k), ref)
		}
	})
}

// shapeLockInsert looks the key up (after an advisory lock if lock) and
// inserts it with its ref before COMMIT.
func shapeLockInsert(b *testing.B, lb *ledgerBench, k effects.Key, lock bool) {
	runShape(b, lb, k, func(batch *pgx.Batch, _ []byte) func() bool {
		var sc string
		var rep bool
		found := true
		settings := func(r pgx.Row) error { return r.Scan(nil, nil, &sc, &rep) }
		if lock {
			batch.Queue(shapeLockSQL, "billing", string(k)).QueryRow(func(r pgx.Row) error { return r.Scan(nil, &sc, &rep) })
		} else {
			batch.Queue(shapeNoLockSQL, "billing", string(k)).QueryRow(settings)
		}
		batch.Queue(shapeLookupSQL, "billing", string(k)).QueryRow(func(r pgx.Row) error {
			var fp []byte
			var ref string
			if err := r.Scan(&fp, &ref); errors.Is(err, pgx.ErrNoRows) {
				found = false
			}
			return nil
		})
		return func() bool { return !found && sc == "on" }
	}, func(batch *pgx.Batch, fp []byte, ref string) {
		batch.Queue(shapeInsertKeySQL, "billing", string(k), fp, ref)
	})
}

// shapeFloor is plain_insert with BEGIN sent in a batch, and, if keyRow,
// the key row inserted before COMMIT with no lookup: what storing a key row
// costs at the least.
func shapeFloor(b *testing.B, lb *ledgerBench, k effects.Key, keyRow bool) {
	runShape(b, lb, k, func(*pgx.Batch, []byte) func() bool { return func() bool { return true } },
		func(batch *pgx.Batch, fp []byte, ref string) {
			if keyRow {
				batch.Queue(shapeInsertKeySQL, "billing", string(k), fp, ref)
			}
		})
}

func BenchmarkApplyShapes(b *testing.B) {
	lb := newLedgerBench(b)
	lb.paired(b, []variant{
		{"plain_insert", func(k effects.Key) { lb.plainInsert(b, k) }},
		{"handwritten", func(k effects.Key) { lb.handwritten(b, k) }},
		{"claim_update", func(k effects.Key) { shapeClaim(b, lb, k, true) }},
		{"claim_noref", func(k effects.Key) { shapeClaim(b, lb, k, false) }},
		{"lock_insert", func(k effects.Key) { shapeLockInsert(b, lb, k, true) }},
		{"lookup_insert", func(k effects.Key) { shapeLockInsert(b, lb, k, false) }},
		{"lookup_merged", func(k effects.Key) { shapeLookupMerged(b, lb, k) }},
		{"settings_insert", func(k effects.Key) { shapeSettingsInsert(b, lb, k) }},
		{"apply", func(k effects.Key) { lb.apply(b, lb.fx, k, effects.Applied) }},
		// Lower bounds, not correct dedup: [BEGIN]; write; [COMMIT] and the
		// same with the key row inserted before COMMIT and no lookup.
		{"floor_batch_begin", func(k effects.Key) { shapeFloor(b, lb, k, false) }},
		{"floor_key_row", func(k effects.Key) { shapeFloor(b, lb, k, true) }},
	})
}

// shapeLookupMergedSQL reads the settings and looks the key up in one
// statement, without a lock.
const shapeLookupMergedSQL = `SELECT s.sc, s.sr, k.fingerprint, k.ref
FROM (VALUES (current_setting('synchronous_commit'), current_setting('synchronous_standby_names') <> '')) AS s (sc, sr)
LEFT JOIN effectively_keys k ON k.scope = $1 AND k.key = $2`

// shapeLookupMerged is lookup_insert with the settings and the lookup in
// one statement.
func shapeLookupMerged(b *testing.B, lb *ledgerBench, k effects.Key) {
	runShape(b, lb, k, func(batch *pgx.Batch, _ []byte) func() bool {
		var sc string
		var rep bool
		var fp []byte
		batch.Queue(shapeLookupMergedSQL, "billing", string(k)).QueryRow(func(r pgx.Row) error {
			var ref *string
			return r.Scan(&sc, &rep, &fp, &ref)
		})
		return func() bool { return fp == nil && sc == "on" }
	}, func(batch *pgx.Batch, fp []byte, ref string) {
		batch.Queue(shapeInsertKeySQL, "billing", string(k), fp, ref)
	})
}

// shapeSettingsSQL reads the commit settings and nothing else.
const shapeSettingsSQL = `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names') <> ''`

// shapeSettingsInsert is floor_key_row with the settings read in BEGIN's
// round trip: no lookup, the key's INSERT decides (a duplicate fails it).
func shapeSettingsInsert(b *testing.B, lb *ledgerBench, k effects.Key) {
	runShape(b, lb, k, func(batch *pgx.Batch, _ []byte) func() bool {
		var sc string
		var rep bool
		batch.Queue(shapeSettingsSQL).QueryRow(func(r pgx.Row) error { return r.Scan(&sc, &rep) })
		return func() bool { return sc == "on" }
	}, func(batch *pgx.Batch, fp []byte, ref string) {
		batch.Queue(shapeInsertKeySQL, "billing", string(k), fp, ref)
	})
}
