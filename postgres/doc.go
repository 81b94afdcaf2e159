// Package postgres makes writes to a PostgreSQL database effectively once on
// top of at-least-once delivery. It records each idempotency key in the
// table effectively_keys, in the same transaction as the effect's own
// writes, so that the key and the effect commit together or not at all. A
// redelivered message finds its key and replays the stored reference instead
// of writing again; a concurrent duplicate waits for the first and then
// replays. There is no window: the contract is effectively-once for as long
// as keys are kept.
//
// The ways to use it, from most to least managed:
//
//   - [New] returns an [Effect] (an effects.Effect) that owns the
//     transaction: Apply runs your write function and records the key in
//     the same transaction, commits, and classifies failures (retrying
//     serialization failures and deadlocks itself).
//   - [NewPipelined] is New for writes known before they run, as
//     statements: they travel with BEGIN, the key's
//     row and COMMIT in one round trip.
//   - [Claim] and [SetRef] work inside a pgx.Tx you own, for code that
//     already has a transaction. You commit, and you ack only after the
//     commit succeeded.
//   - [ApplyBatch] claims many keys with one statement and runs the writes
//     of the new ones in the same transaction, for batch consumers
//     (consume.WithBatch); [ClaimBatch] is its building block inside a
//     transaction you own.
//   - For replay storms, where most deliveries were handled before:
//     [ApplyBatch] with [WithPrecheck] looks up, with one query, the keys a
//     filter (package negcache) may have seen, replays those committed
//     without a transaction and claims only the rest; [Seen] is that
//     pre-check on its own, for one key.
//   - [Journal] implements journal.Journal, the sent-record for effects
//     outside the database (email, an API call): at-least-once with a
//     declared window, not effectively once.
//
// What it costs: Apply on a new key takes the round trips of a plain
// BEGIN/INSERT/COMMIT (BEGIN; the write; the key's INSERT, which also
// checks the commit settings, with COMMIT; the key's primary key finds a
// duplicate), and [NewPipelined] takes one. Each Effect has one shape,
// fixed when it is built (see [Effect.Apply]): [New]'s, by default, is
// grouped: when the Effect's transactions hold every connection of the
// pool, the Applies that arrive share the next transaction, their keys'
// INSERTs sent with its one COMMIT (group commit; [WithoutGroupCommit]
// turns it off); with [WithLookupFirst] it looks every key up first, in
// BEGIN's round trip, so that a duplicate takes two round trips, runs no
// write and writes no WAL: the shape for replays. BENCHMARKS.md has the
// measurements.
//
// Options are scoped by type: [New] and [NewPipelined] take an
// [EffectOption], [ApplyBatch] a [BatchOption], and [Claim], [ClaimBatch]
// and [Seen] an [Option], so an option a function does not use does not
// compile there. Each function validates its options once, before any I/O, and
// returns an [*effects.ConfigError] for a bad value. The [Pruner] is
// configured by its fields.
//
// Run [Migrate] once (or copy [Schema] into your migrations), and prune
// old keys ([Pruner], or [Prune] periodically), keeping them longer than the broker's retention
// plus the longest replay.
//
// The guarantee rests on three rules the package enforces or documents: the
// claim and the effect share one transaction (never a separate "seen" table
// written in another transaction);
// synchronous_commit is not off ([ErrAsyncCommit]), because an acked
// commit must survive a crash; and a lost COMMIT reply is ambiguous
// ([effects.ErrAmbiguous]) and resolved by retrying the same key, never a
// new one. Under synchronous replication (synchronous_standby_names set) a
// replay is reported only after a COMMIT that waited for the standby, so an
// earlier commit whose standby wait was cancelled is never acked before the
// standby has it (RELIABILITY.md: a few bytes of WAL per replay, only then).
//
// When not to use it: when the side effect is not a write to this database.
// A dedup row here cannot make an HTTP call, an email or a message to
// another system effectively once, because that effect does not roll back
// with the transaction; use the owner's idempotency key (package stripe,
// s3, kafka) or a Journal and accept its window. Nor when the effect's
// tables live in another database than the keys: two databases do not
// commit atomically.
package postgres
