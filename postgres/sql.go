package postgres

// The package's SQL, in one place: every statement the adapters send,
// except the schema (schema.sql, applied by Migrate) and the transaction
// control statements (BEGIN, COMMIT, ROLLBACK). The Pruner's statement is
// in pruner.go.

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

const batchSetRefSQL = `UPDATE effectively_keys AS k SET ref = v.ref
	FROM unnest($2::text[], $3::text[]) AS v (key, ref)
	WHERE k.scope = $1 AND k.key = v.key`

// seenSQL reads a committed key with the session's commit settings.
const seenSQL = `SELECT fingerprint, ref, current_setting('synchronous_commit'),
	current_setting('synchronous_standby_names') <> ''
FROM effectively_keys WHERE scope = $1 AND key = $2`

// seenBatchSQL reads many committed keys with the session's commit
// settings (evaluated once).
const seenBatchSQL = `SELECT k.key, k.fingerprint, k.ref, s.sync_commit, s.sync_rep
FROM effectively_keys AS k,
	(SELECT current_setting('synchronous_commit') AS sync_commit,
		current_setting('synchronous_standby_names') <> '' AS sync_rep) AS s
WHERE k.scope = $1 AND k.key = ANY ($2::text[])`

const keysSQL = `SELECT key FROM effectively_keys WHERE scope = $1 AND created_at >= $2`

// claimSQL inserts the key and, in the same statement and round trip, reads
// synchronous_commit, so refusing asynchronous commit costs nothing extra.
// The row is new exactly when the INSERT returned it; a conflicting row,
// committed or still being inserted by a concurrent transaction (the INSERT
// waits for it), makes it return nothing and write nothing.
const claimSQL = `WITH ins AS (
	INSERT INTO effectively_keys (scope, key, fingerprint) VALUES ($1, $2, $3)
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING 1)
SELECT EXISTS (SELECT 1 FROM ins), current_setting('synchronous_commit'),
	current_setting('synchronous_standby_names') <> ''`

// lookupSQL reads the key back, for its fingerprint and ref. claimKey sends
// it in the same round trip as claimSQL (a pipeline), yet as a separate
// statement: a row committed by a concurrent duplicate while the claim
// waited is not in the claim statement's snapshot, but at READ COMMITTED
// this statement's new snapshot sees it. (At REPEATABLE READ and
// SERIALIZABLE the claim fails with 40001 in that case instead.)
const lookupSQL = `SELECT fingerprint, ref FROM effectively_keys WHERE scope = $1 AND key = $2`

const setRefSQL = `UPDATE effectively_keys SET ref = $3 WHERE scope = $1 AND key = $2`

// replayBarrierSQL makes the replaying transaction a writing one: a
// transactional logical message (a few bytes of WAL, no table touched, no
// special privilege) gives it a transaction id and WAL, so its COMMIT waits,
// under synchronous replication, for the standby to confirm it. (Assigning
// a transaction id alone, as txid_current() does, is not enough: PostgreSQL
// skips the wait for a transaction that wrote no WAL.) The
// earlier commit that made the key visible precedes it in the WAL, so once
// this COMMIT returns, that earlier commit is on the standby too.
//
// Without it a replay could acknowledge an effect that exists only on the
// primary: when the earlier attempt's COMMIT was cancelled while it waited
// for the standby (a caller's timeout, pg_terminate_backend), PostgreSQL
// keeps the commit locally, makes it visible, and only warns; a failover
// then loses it, although the replay was acked. The barrier costs about a
// hundred bytes of WAL and one standby round trip per replay, and only when
// synchronous_standby_names is set; without a synchronous standby a replay
// still writes nothing.
const replayBarrierSQL = `SELECT pg_logical_emit_message(true, 'effectively.replay', '')`

// insertKeySQL records the key with its ref. It is a plain INSERT, no ON
// CONFLICT: if a transaction that the lookup did not see (a concurrent
// Apply, Claim or ClaimBatch, or a commit after a REPEATABLE READ
// snapshot) committed the key meanwhile, it fails with 23505 and the whole
// attempt, write included, rolls back and is retried, and the retry
// replays.
const insertKeySQL = `INSERT INTO effectively_keys (scope, key, fingerprint, ref) VALUES ($1, $2, $3, $4)`

// guardedInsertKeySQL is insertKeySQL that also fails, and with it the
// transaction, when the commit settings make the COMMIT that follows it
// unsafe to acknowledge (commitGuardExpr, empty when they are safe): the
// check costs no statement of its own, and it sees the settings as
// COMMIT will, after everything the write ran (a SET LOCAL
// synchronous_commit = off in the write included).
const guardedInsertKeySQL = `INSERT INTO effectively_keys (scope, key, fingerprint, ref) VALUES ($1, $2, $3, $4 || ` + commitGuardExpr + `)`

// beginSQL takes the key in one statement: a new key is inserted pending
// with a lease; an existing one is taken over (attempt + 1, new lease) only
// if it is not done, has the same fingerprint and no live lease. RETURNING
// gives a row exactly when the caller now holds the lease. Leases use the
// database's clock, so the callers' clocks do not matter. A pending
// record's ref is its lease's holder token (see lostLeases): a Begin that
// names it ($6, the tokens of this Journal's lost leases of the key) takes
// the lease back although it is live, as the same attempt (the one whose
// Begin lost its reply, and did nothing).
const beginSQL = `INSERT INTO effectively_journal AS j (scope, key, fingerprint, lease_until, ref)
VALUES ($1, $2, $3, now() + $4 * interval '1 microsecond', $5)
ON CONFLICT (scope, key) DO UPDATE
	SET attempt = CASE WHEN j.lease_until > now() THEN j.attempt ELSE j.attempt + 1 END,
		lease_until = excluded.lease_until, ref = excluded.ref, updated_at = now()
	WHERE NOT j.done AND j.fingerprint = excluded.fingerprint
		AND (j.lease_until IS NULL OR j.lease_until <= now() OR j.ref = ANY($6::text[]))
RETURNING j.attempt`

// beginBatchSQL is beginSQL for many keys at once (distinct keys: ON
// CONFLICT DO UPDATE cannot touch one row twice), in key order, so that
// two statements lock their rows in one order and cannot deadlock.
// RETURNING names the keys the caller now holds.
const beginBatchSQL = `INSERT INTO effectively_journal AS j (scope, key, fingerprint, lease_until, ref)
SELECT $1, u.key, u.fp, now() + u.micros * interval '1 microsecond', u.token
FROM unnest($2::text[], $3::bytea[], $4::bigint[], $5::text[]) AS u(key, fp, micros, token)
ORDER BY u.key COLLATE "C"
ON CONFLICT (scope, key) DO UPDATE
	SET attempt = j.attempt + 1, lease_until = excluded.lease_until, ref = excluded.ref, updated_at = now()
	WHERE NOT j.done AND j.fingerprint = excluded.fingerprint
		AND (j.lease_until IS NULL OR j.lease_until <= now())
RETURNING j.key, j.attempt`

// leaseLeftExpr is what is left of a record's lease, in microseconds of
// the database's clock: positive while the lease is live.
const leaseLeftExpr = `coalesce(ceil(extract(epoch FROM lease_until - now()) * 1000000), 0)::bigint`

// journalLookupManySQL is journalLookupSQL for many keys.
const journalLookupManySQL = `SELECT key, fingerprint, done, ref, attempt, ` + leaseLeftExpr + `
FROM effectively_journal WHERE scope = $1 AND key = ANY($2::text[])`

// completeBatchSQL is completeSQL for many distinct keys.
const completeBatchSQL = `UPDATE effectively_journal AS j SET done = true, ref = u.ref, lease_until = NULL, updated_at = now()
FROM unnest($2::text[], $3::text[]) AS u(key, ref)
WHERE j.scope = $1 AND j.key = u.key AND NOT j.done
RETURNING j.key`

// journalLookupSQL reads one key's record (see readRow): why beginSQL or
// markDoneSQL took nothing, and Lookup.
const journalLookupSQL = `SELECT fingerprint, done, ref, attempt, ` + leaseLeftExpr + `
FROM effectively_journal WHERE scope = $1 AND key = $2`

const completeSQL = `UPDATE effectively_journal SET done = true, ref = $3, lease_until = NULL, updated_at = now()
WHERE scope = $1 AND key = $2 AND NOT done`

const releaseSQL = `UPDATE effectively_journal SET lease_until = NULL, updated_at = now()
WHERE scope = $1 AND key = $2 AND NOT done AND attempt = $3`

// markDoneSQL records a key done, inserting it if it was never begun; a
// pending record with the same fingerprint is completed and its lease
// dropped. RETURNING gives a row exactly when it wrote: no row means the
// key was done already (its first ref stays) or has another fingerprint.
const markDoneSQL = `INSERT INTO effectively_journal AS j (scope, key, fingerprint, done, ref)
VALUES ($1, $2, $3, true, $4)
ON CONFLICT (scope, key) DO UPDATE SET done = true, ref = excluded.ref, lease_until = NULL, updated_at = now()
	WHERE NOT j.done AND j.fingerprint = excluded.fingerprint
RETURNING true`

// commitGuardExpr is the empty string when the commit settings make a
// commit safe to acknowledge, and fails the statement, and with it the
// transaction, when they do not (see ErrAsyncCommit;
// commitSettings.unsafeCommit says the same): it casts a text that names
// the refusal to an integer, which PostgreSQL rejects (22P02,
// invalid_text_representation). It costs
// nothing more than reading the settings: no GUC is set. The key's INSERT
// carries it (guardedInsertKeySQL), so the settings are checked in the
// statement just before COMMIT, after everything the write ran.
const commitGuardExpr = `CASE WHEN current_setting('synchronous_commit') = 'off'
		OR (current_setting('synchronous_commit') = 'local' AND current_setting('synchronous_standby_names') <> '')
	THEN ('` + commitGuardMarker + `synchronous_commit = ' || current_setting('synchronous_commit'))::int::text
	ELSE '' END`

const commitGuardMarker = "refused by effectively.dev: "

// keyLookupSQL looks the key up with the settings that decide whether a replay
// may be acknowledged, in one statement that always returns one row (found
// false for a new key). Sent with BEGIN, it is the lookup of an attempt
// that looks first; after a failed attempt, the lookup that replays a
// duplicate. It takes no lock: a concurrent Apply of the same key that it
// did not see is settled by the key's INSERT (see insertKeySQL).
const keyLookupSQL = `SELECT k.key IS NOT NULL, k.fingerprint, k.ref, s.sync_commit, s.sync_rep
FROM (SELECT current_setting('synchronous_commit') AS sync_commit,
		current_setting('synchronous_standby_names') <> '' AS sync_rep) AS s
	LEFT JOIN effectively_keys AS k ON k.scope = $1 AND k.key = $2`

const pruneSQL = `DELETE FROM effectively_keys WHERE ctid IN (
	SELECT ctid FROM effectively_keys WHERE scope = $1 AND created_at < $2 LIMIT $3)`

const pruneJournalSQL = `DELETE FROM effectively_journal WHERE ctid IN (
	SELECT ctid FROM effectively_journal WHERE scope = $1 AND created_at < $2
	AND (lease_until IS NULL OR lease_until < now()) LIMIT $3)`

// migrateLockSQL serializes concurrent Migrates (see migrateLockID).
const migrateLockSQL = `SELECT pg_advisory_xact_lock($1)`

// journalDoneSQL reads whether a key whose Complete updated nothing is done
// (completed before) or missing (never begun).
const journalDoneSQL = `SELECT done FROM effectively_journal WHERE scope = $1 AND key = $2`

// journalDoneManySQL is journalDoneSQL for many keys.
const journalDoneManySQL = `SELECT key, done FROM effectively_journal WHERE scope = $1 AND key = ANY($2::text[])`

// checkSQL reads whether table $1 exists (on the search path) and the
// session's commit settings, for Check.
const checkSQL = `SELECT to_regclass($1) IS NOT NULL, current_setting('synchronous_commit'),
	current_setting('synchronous_standby_names') <> ''`
