package mysql

import (
	"encoding/hex"
	"strings"
)

// The package's SQL, in one place: every statement the adapter sends,
// except the schema (schema.sql, applied by Migrate) and the transaction
// control statements that database/sql sends (START TRANSACTION, COMMIT,
// ROLLBACK). Keys, scopes, fingerprints and refs travel as bytes, so that
// neither the connection's character set nor client-side interpolation
// changes a byte of them: as []byte arguments, or, in Apply's two
// statements, as hexadecimal literals (X'...').
//
// Apply's statements carry their values as hexadecimal literals and no
// arguments, so that database/sql sends each as one query in one round
// trip: with arguments, go-sql-driver (unless the DSN sets
// interpolateParams) prepares the statement, executes it and closes it,
// two round trips. A hexadecimal literal is a binary string of exactly the
// bytes given, whatever the connection's character set; it needs no
// escaping, so no value can change the statement.

// hexLiteral returns b as a MySQL hexadecimal literal, X'...'.
func hexLiteral(b []byte) string {
	var sb strings.Builder
	sb.Grow(3 + 2*len(b))
	sb.WriteString("X'")
	sb.WriteString(hex.EncodeToString(b))
	sb.WriteByte('\'')
	return sb.String()
}

// insertKeyQuery records the key with its ref, in the write's
// transaction, just before COMMIT. It is a plain INSERT: if the key was
// committed before, it fails with 1062 (ER_DUP_ENTRY); if a concurrent
// transaction inserted it and has not ended, InnoDB makes it wait, and it
// fails with 1062 if that one commits. The attempt then rolls back, its
// write with it, and Apply looks the key up (lookupQuery), which replays.
func insertKeyQuery(scope, key string, fp []byte, ref string) string {
	return "INSERT INTO effectively_keys (scope, `key`, fingerprint, ref) VALUES (" +
		hexLiteral([]byte(scope)) + ", " + hexLiteral([]byte(key)) + ", " + hexLiteral(fp) + ", " + hexLiteral([]byte(ref)) + ")"
}

// lookupQuery reads a committed key, for its fingerprint and ref. Apply
// runs it outside any transaction (autocommit), so its snapshot is new and
// sees every committed row, whatever the isolation level of the attempt
// that found the key taken.
func lookupQuery(scope, key string) string {
	return "SELECT fingerprint, ref FROM effectively_keys WHERE scope = " + hexLiteral([]byte(scope)) + " AND `key` = " + hexLiteral([]byte(key))
}

// pruneSQL deletes up to limit (the third parameter) keys of a scope created before a time given
// as Unix seconds with microseconds (a decimal string: FROM_UNIXTIME reads
// it in the session's time zone, as TIMESTAMP values are read).
const pruneSQL = "DELETE FROM effectively_keys WHERE scope = ? AND created_at < FROM_UNIXTIME(CAST(? AS DECIMAL(20,6))) LIMIT ?"

// pruneOlderThanSQL is pruneSQL with the cutoff computed by the server,
// whose clock set created_at: the second parameter is the horizon in
// microseconds.
const pruneOlderThanSQL = "DELETE FROM effectively_keys WHERE scope = ? AND created_at < NOW(6) - INTERVAL ? MICROSECOND LIMIT ?"

// pruneJournalSQL deletes up to limit (the third parameter) journal records created before a
// time, done or not, except those whose lease is live.
const pruneJournalSQL = "DELETE FROM effectively_journal WHERE scope = ? AND created_at < FROM_UNIXTIME(CAST(? AS DECIMAL(20,6))) " +
	"AND (lease_until IS NULL OR lease_until < NOW(6)) LIMIT ?"

// checkSQL reads, for Check, the engine of table ? (NULL when it does not
// exist in the connection's database), its scope and key columns that are
// not binary strings (compared byte by byte), and the settings that decide
// whether an acknowledged commit survives a crash.
const checkSQL = "SELECT " +
	"(SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?), " +
	"(SELECT GROUP_CONCAT(CONCAT(COLUMN_NAME, ' ', COLUMN_TYPE, IFNULL(CONCAT(' COLLATE ', COLLATION_NAME), '')) SEPARATOR ', ') " +
	"FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? " +
	"AND COLUMN_NAME IN ('scope', 'key') AND DATA_TYPE NOT IN ('varbinary', 'binary')), " +
	"@@GLOBAL.innodb_flush_log_at_trx_commit, @@GLOBAL.sync_binlog, @@GLOBAL.log_bin"

// leaseLeftExpr is what is left of a record's lease, in microseconds of
// the database's clock: positive while the lease is live.
const leaseLeftExpr = "COALESCE(TIMESTAMPDIFF(MICROSECOND, NOW(6), lease_until), 0)"

// takeExpr is true when a Begin may take the existing record of an
// ON DUPLICATE KEY UPDATE: not done, the same fingerprint, no live lease.
// Assignments of ON DUPLICATE KEY UPDATE run left to right and each sees
// the ones before it, so beginSQL assigns lease_until, which takeExpr
// reads, last.
const takeExpr = "(NOT done AND fingerprint = VALUES(fingerprint) AND (lease_until IS NULL OR lease_until <= NOW(6)))"

// beginSQL takes the key in one statement: a new key is inserted pending
// with a lease and the caller's holder token in ref; an existing one is
// taken over (attempt + 1, new lease, the caller's token) only if takeExpr
// holds. Whether the caller now holds the lease is read back
// (journalLookupSQL: the ref is its token) rather than from the affected
// rows, which a DSN's clientFoundRows changes. Leases use the database's
// clock, so the callers' clocks do not matter.
const beginSQL = "INSERT INTO effectively_journal (scope, `key`, fingerprint, ref, lease_until) " +
	"VALUES (?, ?, ?, ?, NOW(6) + INTERVAL ? MICROSECOND) ON DUPLICATE KEY UPDATE " +
	"attempt = IF(" + takeExpr + ", attempt + 1, attempt), " +
	"ref = IF(" + takeExpr + ", VALUES(ref), ref), " +
	"updated_at = IF(" + takeExpr + ", NOW(6), updated_at), " +
	"lease_until = IF(" + takeExpr + ", VALUES(lease_until), lease_until)"

// journalLookupSQL reads one key's record: why beginSQL or markDoneSQL
// took nothing, and Lookup.
const journalLookupSQL = "SELECT fingerprint, done, ref, attempt, " + leaseLeftExpr +
	" FROM effectively_journal WHERE scope = ? AND `key` = ?"

const completeSQL = "UPDATE effectively_journal SET done = TRUE, ref = ?, lease_until = NULL, updated_at = NOW(6) " +
	"WHERE scope = ? AND `key` = ? AND NOT done"

// journalDoneSQL reads whether a key whose Complete updated nothing is
// done (completed before) or missing (never begun).
const journalDoneSQL = "SELECT done FROM effectively_journal WHERE scope = ? AND `key` = ?"

const releaseSQL = "UPDATE effectively_journal SET lease_until = NULL, updated_at = NOW(6) " +
	"WHERE scope = ? AND `key` = ? AND NOT done AND attempt = ?"

// markDoneExpr is true when MarkDone may complete the existing record of
// an ON DUPLICATE KEY UPDATE: not done yet, the same fingerprint.
// markDoneSQL assigns done, which it reads, last.
const markDoneExpr = "(NOT done AND fingerprint = VALUES(fingerprint))"

// markDoneSQL records a key done, inserting it if it was never begun; a
// pending record with the same fingerprint is completed and its lease
// dropped. A key done already keeps its first ref; one with another
// fingerprint is left as it is (MarkDone reads the record back to tell).
const markDoneSQL = "INSERT INTO effectively_journal (scope, `key`, fingerprint, ref, done) VALUES (?, ?, ?, ?, TRUE) " +
	"ON DUPLICATE KEY UPDATE " +
	"ref = IF(" + markDoneExpr + ", VALUES(ref), ref), " +
	"lease_until = IF(" + markDoneExpr + ", NULL, lease_until), " +
	"updated_at = IF(" + markDoneExpr + ", NOW(6), updated_at), " +
	"done = IF(" + markDoneExpr + ", TRUE, done)"
