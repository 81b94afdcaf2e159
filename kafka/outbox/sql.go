package outbox

// Every statement the package sends, in one place. The schema itself is in
// outbox.sql and keyorder.sql ([Schema]).

const (
	// sqlMigrateLock serializes Migrate calls (pg_advisory_xact_lock on
	// lockID); used by migrate.
	sqlMigrateLock = `SELECT pg_advisory_xact_lock($1)`

	// sqlInsert writes one row; Enqueue appends sqlInsertOrNothing,
	// EnqueueStatement sends it as it is.
	sqlInsert = `INSERT INTO effectively_outbox
	(message_id, fingerprint, topic, key, value, header_keys, header_values)
VALUES ($1, $2, $3, $4, $5, $6, $7)`
	sqlInsertOrNothing = ` ON CONFLICT (message_id) DO NOTHING RETURNING id`

	// sqlFingerprint reads the payload fingerprint of a message id that is
	// already in the outbox; used by Enqueue to tell a replay from key
	// reuse.
	sqlFingerprint = `SELECT fingerprint FROM effectively_outbox WHERE message_id = $1`

	// sqlClaim claims up to $1 rows, neither sent nor parked nor claimed by
	// a relay whose claim is still running, in id order: claimed_until =
	// now() + $2 microseconds, claim_token = $3. It commits on its own, so
	// no row lock outlives it. Used by Relay.claim.
	sqlClaim = `WITH c AS (
	SELECT id FROM effectively_outbox
	WHERE sent_at IS NULL AND parked_at IS NULL
	  AND (claimed_until IS NULL OR claimed_until < now())
	ORDER BY id
	LIMIT $1
	FOR UPDATE SKIP LOCKED)
` + sqlClaimSet

	// sqlClaimKeyOrder is sqlClaim for a relay WithKeyOrder: a row is
	// claimed only when no earlier row of its topic and key is unsent
	// (pending, claimed or parked). Used by Relay.claim.
	sqlClaimKeyOrder = `WITH c AS (
	SELECT o.id FROM effectively_outbox AS o
	WHERE o.sent_at IS NULL AND o.parked_at IS NULL
	  AND (o.claimed_until IS NULL OR o.claimed_until < now())
	  AND NOT EXISTS (
		SELECT 1 FROM effectively_outbox AS e
		WHERE e.sent_at IS NULL AND e.topic = o.topic
		  AND sha256(e.key) = sha256(o.key) AND e.key = o.key AND e.id < o.id)
	ORDER BY o.id
	LIMIT $1
	FOR UPDATE OF o SKIP LOCKED)
` + sqlClaimSet

	sqlClaimSet = `UPDATE effectively_outbox AS o
SET claimed_until = now() + $2 * interval '1 microsecond', claim_token = $3
FROM c
WHERE o.id = c.id
RETURNING o.id, o.message_id, o.topic, o.key, o.value, o.header_keys, o.header_values, o.attempts`

	// sqlMarkSent records the broker's ack of rows $1 at refs $2 (rows
	// another relay marked already keep their ref). Used by Relay.mark.
	sqlMarkSent = `UPDATE effectively_outbox AS o
SET sent_at = now(), ref = u.ref, attempts = o.attempts + 1, last_error = NULL,
    claimed_until = NULL, claim_token = NULL
FROM unnest($1::bigint[], $2::text[]) AS u(id, ref)
WHERE o.id = u.id AND o.sent_at IS NULL`

	// sqlDeleteSent deletes rows $1 once the broker acked them
	// (WithDeleteSent). Used by Relay.mark.
	sqlDeleteSent = `DELETE FROM effectively_outbox WHERE id = ANY($1::bigint[])`

	// sqlMarkFailed records failed produces of rows $1 claimed with token
	// $2: the error $3, whether the attempt counts ($4), whether to park
	// the row ($5) and the class to park it with ($6); the others' claims
	// are released with a pause of $7 microseconds before their next
	// claim. Used by Relay.mark.
	sqlMarkFailed = `UPDATE effectively_outbox AS o
SET attempts = o.attempts + u.counted::int,
    last_error = u.msg,
    claim_token = NULL,
    claimed_until = CASE WHEN u.park THEN NULL ELSE now() + u.pause * interval '1 microsecond' END,
    parked_at = CASE WHEN u.park THEN now() END,
    error_class = CASE WHEN u.park THEN u.class END
FROM unnest($1::bigint[], $3::text[], $4::bool[], $5::bool[], $6::text[], $7::bigint[])
     AS u(id, msg, counted, park, class, pause)
WHERE o.id = u.id AND o.claim_token = $2 AND o.sent_at IS NULL
RETURNING o.id`

	// sqlPrune deletes up to $2 rows sent before $1. Used by Prune.
	sqlPrune = `DELETE FROM effectively_outbox WHERE id IN (
	SELECT id FROM effectively_outbox WHERE sent_at < $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)`

	// sqlParkedWhere selects parked rows by a [ParkedFilter]: $1 row ids,
	// $2 message ids, $3 topic, $4 error class, $5 and $6 the parked_at
	// range, $7 the row id to start after; a NULL argument leaves its
	// condition out.
	sqlParkedWhere = `parked_at IS NOT NULL
  AND ($1::bigint[] IS NULL OR id = ANY($1::bigint[]))
  AND ($2::text[] IS NULL OR message_id = ANY($2::text[]))
  AND ($3::text IS NULL OR topic = $3::text)
  AND ($4::text IS NULL OR error_class = $4::text)
  AND ($5::timestamptz IS NULL OR parked_at >= $5::timestamptz)
  AND ($6::timestamptz IS NULL OR parked_at < $6::timestamptz)
  AND id > $7`

	// sqlParkedIDs is the first $8 parked rows of a filter (all for a NULL
	// $8), locked for ParkedFilter.Retry and ParkedFilter.Drop.
	sqlParkedIDs = `SELECT id FROM effectively_outbox WHERE ` + sqlParkedWhere + `
ORDER BY id LIMIT $8 FOR UPDATE`

	// sqlListParked reads the parked rows of a filter. Used by
	// ParkedFilter.List.
	sqlListParked = `SELECT id, message_id, topic, key, value, header_keys, header_values,
	created_at, parked_at, attempts, coalesce(last_error, ''), coalesce(error_class, '')
FROM effectively_outbox WHERE ` + sqlParkedWhere + `
ORDER BY id LIMIT $8`

	// sqlCountParked counts the parked rows of a filter (its limit
	// ignored). Used by ParkedFilter.Count.
	sqlCountParked = `SELECT count(*) FROM (SELECT 1 FROM effectively_outbox WHERE ` + sqlParkedWhere + `
LIMIT $8) AS p`

	// sqlRetryParked returns the parked rows of a filter to the relay with
	// a fresh attempt budget. Used by ParkedFilter.Retry.
	sqlRetryParked = `UPDATE effectively_outbox
SET parked_at = NULL, error_class = NULL, attempts = 0, claimed_until = NULL, claim_token = NULL
WHERE id IN (` + sqlParkedIDs + `)`

	// sqlDropParked deletes the parked rows of a filter. Used by
	// ParkedFilter.Drop.
	sqlDropParked = `DELETE FROM effectively_outbox WHERE id IN (` + sqlParkedIDs + `)`
)
