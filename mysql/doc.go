// Package mysql makes writes to a MySQL or MariaDB database effectively
// once on top of at-least-once delivery: the twin of package postgres. It
// records each idempotency key in the InnoDB table effectively_keys, in
// the same transaction as the effect's own writes, so that the key and the
// effect commit together or not at all. A redelivered message finds its
// key and replays the stored reference instead of writing again; a
// concurrent duplicate waits for the first (InnoDB's lock on the key's
// row) and then replays. There is no window: the contract is
// effectively-once for as long as keys are kept.
//
// The ways to use it:
//
//   - [New] returns an [Effect] (an effects.Effect) that owns the
//     transaction: Apply runs your write function in a *sql.Tx and records
//     the key in it, commits, and classifies failures by the server's
//     error numbers (retrying deadlocks and lock wait timeouts itself).
//   - [Journal] implements journal.DoneJournal, the sent-record for
//     effects outside the database (an email, a Stripe or HTTP call, a
//     Kafka message), for the adapters built on effects/journal:
//     at-least-once with a declared window, not effectively once.
//
// It speaks database/sql through github.com/go-sql-driver/mysql, with any
// DSN options. Keys, scopes, fingerprints and references travel as bytes
// and are stored in VARBINARY and BLOB columns: a key column in MySQL's
// default collations (utf8mb4_general_ci, utf8mb4_0900_ai_ci) compares
// "Order-7" and "order-7" as one key, and utf8mb4_bin, PAD SPACE in
// MariaDB and MySQL 5.7, "tenant" and "tenant " as one scope. Two
// distinct messages would share one dedup row, and the second would be
// acknowledged without its effect. [Effect.Check] refuses such a table.
//
// What it costs: Apply on a new key takes a plain insert transaction's
// round trips (START TRANSACTION, the write, COMMIT) and one more, the
// key's INSERT, sent as one query; the log flush at COMMIT is paid once
// either way. A duplicate runs its write, which the key's INSERT rolls
// back, and a lookup, and flushes no log. BENCHMARKS.md has the
// measurements.
//
// Run [Migrate] once (or copy [Schema] into your migrations), and prune
// old keys ([Prune], or a paced [Pruner]), keeping them longer than the
// broker's retention plus the longest replay.
//
// The guarantee rests on rules the package enforces or documents: the key
// and the effect share one InnoDB transaction; the server makes a commit
// durable before it acknowledges it (innodb_flush_log_at_trx_commit = 1,
// and sync_binlog = 1 where the binary log is on: [Effect.Check] refuses
// other settings, see [ErrUnsafeDurability]); the write runs no statement
// that commits implicitly (DDL, LOCK TABLES); and a lost COMMIT reply is
// ambiguous ([effects.ErrAmbiguous]) and resolved by retrying the same
// key, never a new one. docs/mysql.md explains each setting.
//
// When not to use it: when the side effect is not a write to this
// database (use the owner's idempotency key, or a Journal and accept its
// window), or when the effect's tables live in another database server
// than the keys.
package mysql
