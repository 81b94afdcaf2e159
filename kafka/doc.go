// Package kafka maps Kafka's delivery guarantees onto package effects, over
// franz-go (github.com/twmb/franz-go/pkg/kgo).
//
// Kafka's own exactly-once semantics stop at Kafka's edge: the idempotent
// producer dedups only its own retries within one producer session and one
// partition, and transactions make "input offsets plus output records"
// atomic only when both live in Kafka. This package offers one tool for
// each shape of work, and each says what it guarantees:
//
//   - [Producer]: an [effects.Effect] that produces one record per key with
//     the idempotent producer (acks=all), the key in the [KeyHeader]
//     header. Alone it is at-least-once with any redelivery in its window: a
//     restarted process produces again. With a journal ([WithJournal], e.g.
//     postgres.NewJournal) a recorded success is replayed instead, and
//     duplicates are left only after an unknown outcome (after the broker's
//     ack, before the journal records it). The journal runs
//     [effects.Journaled]'s protocol and policy, the same as package email's
//     and package stripe's. An Apply never waits for the client's linger.
//   - [Transform]: consume-transform-produce in one Kafka transaction per
//     poll over a kgo.GroupTransactSession. Effectively once inside Kafka:
//     the input offsets and output records commit together. Readers of the
//     output must consume with kgo.FetchIsolationLevel(kgo.ReadCommitted()).
//   - [Source]: an [effects.Source] over a consumer group that commits an
//     offset only after every earlier delivery of its partition was acked,
//     so side effect first, then commit, and acking out of order never skips
//     a record. It hands records out fairly across partitions, bounds each
//     partition's unfinished records, and commits the acked marks of every
//     partition in one OffsetCommit request at a time (group commit).
//   - The transactional outbox, in package effectively.dev/kafka/outbox
//     (apart, so that a program that only produces or consumes does not
//     pull in pgx): the application writes the record into an outbox table
//     in its own business transaction; relays publish the rows at least
//     once, with the row's message id in the [KeyHeader] header for
//     downstream dedup.
//   - [Replay]: re-feed an offset or time range of a topic through a
//     handler at a rate limit, so a replay does not starve live traffic.
//
// Changed on purpose in this version: the Producer's journal protocol is
// effects.Journaled's, so a record the broker acked but the journal could
// not record is Applied (logged) instead of [effects.ErrAmbiguous]; an
// ambiguous journal Begin (nothing was produced) is [effects.ErrTransient];
// Complete stops retrying at an error that is not retryable; the default
// lease is [effects.DefaultLease] (a minute, was 30 s), and an Apply stops
// waiting for its record at nine tenths of the lease. Apply no longer waits
// for the client's linger (it waited up to kgo.ProducerLinger, 10 ms by
// default). The outbox moved to package effectively.dev/kafka/outbox
// (MigrateOutbox, OutboxMessage, PruneOutbox and WithRelayErrors are now
// outbox.Migrate, outbox.Message, outbox.Prune and
// outbox.WithErrorHandler). Replay and ReplayBatch take the topic and
// [ReplayOption] values ([WithReplayOffsetRange], [WithReplayTimeRange],
// [WithReplayRate], ...) instead of a ReplayOptions struct, and refuse
// what they used to reinterpret quietly (an empty partition list, a
// negative start, an end before the start, a limiter with a rate).
//
// When not to use it: if your consumer's effect lives in your database, a
// dedup row in the same database transaction (package postgres) is
// effectively once and needs none of this; and no Kafka feature makes an
// effect outside Kafka (a charge, an email) effectively once, so do not
// reach for [Transform] there. Downstream consumers of anything produced
// at least once must dedup on the [KeyHeader] header.
//
// Tests in this package run against kfake, the franz-go author's in-process
// Kafka; set KAFKA_BROKERS (comma-separated host:port) to run them against
// a real cluster instead (tests that inject broker faults then skip).
package kafka
