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
//     [journal.Journaled]'s protocol and policy, the same as package email's
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
//   - [ShareSource]: an [effects.Source] over a share group (KIP-932,
//     queues for Kafka): records are acquired, accepted ([ShareSource.Ack])
//     or released ([ShareSource.Release]) one by one, with no Ordering, so
//     a consumer runs more handlers than there are partitions and a stuck
//     record blocks nothing behind it. The delivery count is the
//     delivery's attempt; held records' acquisition locks are renewed in
//     the background; see "Share groups" below.
//   - The transactional outbox, in package effectively.dev/kafka/outbox
//     (apart, so that a program that only produces or consumes does not
//     pull in pgx): the application writes the record into an outbox table
//     in its own business transaction; relays publish the rows at least
//     once, with the row's message id in the [KeyHeader] header for
//     downstream dedup.
//   - [Replay]: re-feed an offset or time range of a topic through a
//     handler at a rate limit, so a replay does not starve live traffic.
//
// # Errors and start-up checks
//
// Every error of a [Producer] is in one class of [effects.ClassOf]: a
// record that may have been written is [effects.ErrAmbiguous], a
// retryable broker error [effects.ErrTransient], a topic the cluster does
// not have or a refused authorization a configuration error (a
// *[effects.ConfigError] naming the topic or the credentials, which stops
// a consumer instead of dead-lettering every event), and the broker's
// other refusals (MESSAGE_TOO_LARGE, INVALID_RECORD) [effects.ErrRefused].
// [Producer] and [Source] are [effects.Checker]s: Check asks the brokers
// whether the topics exist and the group may be used, so a worker can
// refuse to start (effects.Plan.Check runs a Producer step's). A Source
// refuses options without topics or a group, and its Next returns the
// configuration error its own start-up check finds, so a misspelled topic
// stops the consumer instead of leaving it idle.
//
// # Options
//
// Options follow franz-go's kgo.Opt: one option type per constructor, as
// a small interface, and an option several constructors share satisfies
// each of their types, so a misplaced option fails at compile time and
// names need no prefixes. [Option] ([WithObserver], [WithLogger])
// configures [NewSource], [NewShareSource] and [NewProducer];
// [ConsumerOption] ([WithMaxPoll]) both sources; [IDOption]
// ([WithIDHeader]) both sources and [Redrive]; [ReadOption]
// ([WithTimeRange], [WithLimiter], [WithProgress]) [Replay] and [Redrive];
// [SourceOption], [ShareOption], [ProducerOption], [ReplayOption],
// [RedriveOption], [TransformOption] and [DeadLetterOption] one
// constructor each.
// What a component handles on its own goes to the observer, or without
// one to the logger, rate-limited; with an [effects.Propagator] observer
// a Producer writes trace headers that a consumer's delivery span
// continues.
//
// # Share groups or consumer groups
//
// Use [Source] (a consumer group) when records of one key must be handled
// in order: it hands a partition's records out in offset order and
// commits offsets, so a record that keeps failing holds back its
// partition (and only its partition). Use [ShareSource] (a share group)
// when order does not matter: every handler is busy whatever the
// partition count, and a record whose effect takes seconds, or keeps
// failing, delays nothing but itself (BENCHMARKS.md, "Share groups").
//
// The price of a share group is the acquisition lock
// (share.record.lock.duration.ms, 30 s by default). The source renews the
// locks of the records it holds; a process that cannot renew (frozen by
// SIGSTOP, a debugger, a long pause) loses its records to other members,
// which run the same effects while the first may still be running them.
// That is the concurrent duplicate an effectively-once effect absorbs (a
// postgres claim waits for the first transaction and replays it; Stripe
// answers 409 in flight, then replays): use share groups only with
// idempotent effects, which is what this module is for. The late
// handler's Ack returns [ErrLockExpired].
//
// Retries and the delivery limit: with a share group the consumer
// releases a failed delivery to the broker after its backoff (the retry
// may run on another member, and the broker's delivery count, which is
// Delivery.Attempt, keeps [effectively.dev/effects/consume.WithMaxAttempts] across processes).
// The broker archives a record after share.delivery.count.limit
// deliveries (5 by default, at most 10), so the source refuses to
// release a record on its last allowed delivery (an error wrapping
// [effects.ErrNotReleased]) and
// the consumer retries it in place until its attempts run out and the
// dead-letter hook takes it; tell the source the group's limit with
// [WithDeliveryLimit]. A dead-lettered delivery is accepted, not
// rejected: the hook handled it. Crashes count toward the limit too (see
// [ShareSource]).
//
// kfake serves share groups (acquisition locks, renewals, delivery
// limits, sharing partitions among members), and the tests here use it;
// it takes the lock duration and the delivery limit from broker configs
// (kafkatest.ShareBrokerConfigs), where Kafka takes them per group.
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
