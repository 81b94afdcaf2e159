// Package outbox is the transactional outbox for Kafka: the application
// writes a record into an outbox table inside its own business
// transaction ([Enqueue]), so the record is published if and only if the
// transaction commits, and relays ([Relay]) publish the rows at least
// once, with the row's message id in the effectively.dev/kafka.KeyHeader
// header for downstream dedup.
//
// A relay never holds a database transaction across a produce: it claims
// rows in one short transaction, produces them outside any, and marks them
// sent in a second short one. A row the broker refuses for good (too
// large, an invalid record, a topic that does not exist or that the
// client may not write), or that keeps failing, is parked: kept with its
// error and attempt count, never claimed again, reported, and out of the
// way of the rows behind it. [ParkedFilter] lists, counts, retries and
// drops parked rows (the effectively command's "outbox" subcommands run
// it).
//
// It lives apart from package effectively.dev/kafka so that a program that
// only produces or consumes does not pull in pgx: the outbox table is in
// PostgreSQL.
//
// When not to use it: if the record is the only effect of a message, a
// [effectively.dev/kafka.Producer] with a journal is simpler; use the
// outbox when the record must be published exactly when a database
// transaction commits (an order row and its "order created" event).
// Consumers of the topic must dedup on the header: the relay publishes at
// least once.
package outbox

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
	"effectively.dev/kafka/internal/produce"
	"effectively.dev/postgres"
)

// schema is the outbox table and the indexes every relay needs.
//
//go:embed outbox.sql
var schema string

// keyOrderSchema is the index a relay [WithKeyOrder] claims rows by.
//
//go:embed keyorder.sql
var keyOrderSchema string

// Schema returns the SQL that [Migrate] runs for relays configured with
// opts: the effectively_outbox table, a unique index on message_id and
// partial indexes on pending and on parked rows; with [WithKeyOrder], also
// the index a key-ordered relay claims rows by (it costs [Enqueue] one
// more index entry per row, so it is only created for those relays).
// Options other than WithKeyOrder change nothing. It is for projects that
// manage their schema with their own migration tool: copy it into a
// migration instead of calling Migrate (on a large table, create its
// indexes CONCURRENTLY there).
func Schema(opts ...RelayOption) string {
	var cfg relayConfig
	for _, o := range opts {
		if o != nil {
			o.applyRelay(&cfg)
		}
	}
	if cfg.keyOrder {
		return schema + "\n" + keyOrderSchema
	}
	return schema
}

// lockID is the pg_advisory_xact_lock key that serializes Migrate calls;
// it spells "effoutbx" in ASCII.
const lockID int64 = 0x6566666f75746278

// Migrate creates what relays configured with opts need ([Schema]: the
// outbox table and its indexes, and with [WithKeyOrder] the key-order
// index) if it does not exist, in the connection's current schema. Pass
// it the relays' options, or just WithKeyOrder() when they use it. It is
// idempotent and safe to run concurrently. A nil db is an
// *[effects.ConfigError].
func Migrate(ctx context.Context, db postgres.DB, opts ...RelayOption) error {
	const op = "outbox.Migrate"
	if db == nil {
		return &effects.ConfigError{Op: op, Option: "db", Reason: "nil"}
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", op, err)
	}
	defer rollback(ctx, tx)
	if _, err := tx.Exec(ctx, sqlMigrateLock, lockID); err != nil {
		return fmt.Errorf("%s: lock: %w", op, err)
	}
	// Without arguments pgx uses the simple protocol: one round trip for
	// all statements.
	if _, err := tx.Exec(ctx, Schema(opts...)); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%s: commit: %w", op, err)
	}
	return nil
}

// Message is one record to publish through the outbox.
type Message struct {
	// ID is the message's identity, built like any key (effects.NewKey
	// from the business event's id). It is required, is unique in the
	// outbox, and travels in the effectively.dev/kafka.KeyHeader header so
	// that consumers can dedup the relay's at-least-once delivery.
	ID effects.Key
	// Topic is the topic to publish to.
	Topic string
	// Key is the record key; nil means ID.
	Key []byte
	// Value is the record value.
	Value []byte
	// Headers are extra headers; one named effectively.dev/kafka.KeyHeader
	// is replaced by ID.
	Headers []kgo.RecordHeader
}

// Size is the number of bytes of m's record that count against
// [WithMaxMessageBytes]: its key (ID when Key is nil), value, and the
// names and values of its headers, the id header included.
func (m Message) Size() int {
	return recordSize(produce.Record(m.ID, m.Topic, m.Key, m.Value, m.Headers))
}

func recordSize(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// defaultMaxMessageBytes is the largest [Message.Size] that [Enqueue] and
// [EnqueueStatement] accept without [WithMaxMessageBytes].
const defaultMaxMessageBytes = 960 << 10

// TooLargeError is the error [Enqueue] and [EnqueueStatement] return for a
// message over the maximum size: nothing was written, and the caller's
// transaction can go on (or roll back). It matches [effects.ErrRefused]
// (permanent: the same message is refused again), so a consumer whose
// handler enqueues it dead-letters the delivery at once.
type TooLargeError struct {
	// ID and Topic are the message's.
	ID    effects.Key
	Topic string
	// Size is [Message.Size]; Max the limit it exceeds.
	Size, Max int
}

// Error says which message, how large, and the limit.
func (e *TooLargeError) Error() string {
	return fmt.Sprintf("outbox: message %q for topic %q is %d bytes, over the maximum of %d (outbox.WithMaxMessageBytes; the producer's kgo.ProducerBatchMaxBytes and the topic's max.message.bytes must allow it too)",
		string(e.ID), e.Topic, e.Size, e.Max)
}

// Unwrap returns [effects.ErrRefused].
func (e *TooLargeError) Unwrap() error { return effects.ErrRefused }

type enqueueConfig struct {
	maxBytes int
	observer effects.Observer // for trace headers
}

// WithMaxMessageBytes sets the largest [Message.Size] accepted (default 960
// KiB, which leaves room for the record's framing below franz-go's default
// kgo.ProducerBatchMaxBytes, 1,000,012 bytes, and Kafka's default
// max.message.bytes, 1,048,588). Raise it together with the relay's
// kgo.ProducerBatchMaxBytes and the topic's max.message.bytes: a row the
// broker refuses is parked, not published. n must be at least 1.
func WithMaxMessageBytes(n int) EnqueueOption {
	return enqueueOpt(func(c *enqueueConfig) { c.maxBytes = n })
}

// Enqueue writes m into the outbox inside tx, the application's business
// transaction: the record is published if and only if tx commits. It
// reports whether m was inserted; enqueueing an ID that is already in the
// outbox with the same payload does nothing and returns false (so a
// redelivered business handler does not publish twice), and with another
// payload returns [effects.ErrKeyReused]. If another open transaction is
// inserting the same ID, Enqueue waits for it.
//
// A message over the maximum size ([WithMaxMessageBytes]) is refused with
// a *[TooLargeError] before any statement is sent, as are an invalid ID
// and an empty topic: tx stays usable.
//
// The table must exist ([Migrate]). Relays publish rows in id order, at
// least once; see [Relay] for what failures do to the order.
func Enqueue(ctx context.Context, tx pgx.Tx, m Message, opts ...EnqueueOption) (bool, error) {
	const op = "outbox.Enqueue"
	st, fp, err := insert(ctx, op, m, sqlInsertOrNothing, opts)
	if err != nil {
		return false, err
	}
	var id int64
	err = tx.QueryRow(ctx, st.SQL, st.Args...).Scan(&id)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("%s key %q: %w", op, string(m.ID), err)
	}
	var stored []byte
	if err := tx.QueryRow(ctx, sqlFingerprint, string(m.ID)).Scan(&stored); err != nil {
		return false, fmt.Errorf("%s key %q: %w", op, string(m.ID), err)
	}
	if !bytes.Equal(stored, fp) {
		return false, &effects.Error{Kind: effects.ErrKeyReused, Op: op, Key: m.ID,
			Err: errors.New("the outbox holds this message id with another payload")}
	}
	return false, nil
}

// EnqueueStatement returns the INSERT that writes m into the outbox, for a
// write that runs as statements: [postgres.NewPipelined] sends it with the
// business rows, the key's row and COMMIT in one round trip. Unlike
// [Enqueue] it reads nothing back, so an ID already in the outbox fails the
// whole transaction (a unique violation on effectively_outbox_message_id)
// whatever its payload: use it where the enclosing effect runs once per
// key, and derive m.ID from that key. It returns an error, before any I/O,
// for an invalid ID, an empty topic or a message over the maximum size
// (a *[TooLargeError]).
func EnqueueStatement(m Message, opts ...EnqueueOption) (postgres.Statement, error) {
	// No context, so no span: no trace headers.
	st, _, err := insert(context.Background(), "outbox.EnqueueStatement", m, "", opts)
	return st, err
}

// insert validates m and returns the INSERT of its row (followed by
// suffix) and its fingerprint. The row's headers carry ctx's trace
// ([WithObserver]); the fingerprint does not.
func insert(ctx context.Context, op string, m Message, suffix string, opts []EnqueueOption) (postgres.Statement, []byte, error) {
	cfg := enqueueConfig{maxBytes: defaultMaxMessageBytes}
	for _, o := range opts {
		if o != nil {
			o.applyEnqueue(&cfg)
		}
	}
	if cfg.maxBytes < 1 {
		return postgres.Statement{}, nil, &effects.ConfigError{Op: op, Option: "WithMaxMessageBytes",
			Reason: fmt.Sprintf("%d bytes; need at least 1", cfg.maxBytes)}
	}
	if err := m.ID.Validate(); err != nil {
		return postgres.Statement{}, nil, err
	}
	if m.Topic == "" {
		return postgres.Statement{}, nil, fmt.Errorf("%s key %q: empty topic", op, string(m.ID))
	}
	rec := produce.Record(m.ID, m.Topic, m.Key, m.Value, m.Headers)
	if n := recordSize(rec); n > cfg.maxBytes {
		return postgres.Statement{}, nil, &TooLargeError{ID: m.ID, Topic: m.Topic, Size: n, Max: cfg.maxBytes}
	}
	fp := produce.Fingerprint(rec)
	hk, hv := splitHeaders(produce.TraceHeaders(ctx, cfg.observer, m.Headers))
	return postgres.Statement{SQL: sqlInsert + suffix,
		Args: []any{string(m.ID), fp, m.Topic, rec.Key, m.Value, hk, hv}}, fp, nil
}

func splitHeaders(hs []kgo.RecordHeader) ([]string, [][]byte) {
	keys := []string{}
	values := [][]byte{}
	for _, h := range hs {
		if h.Key == produce.KeyHeader {
			continue
		}
		keys = append(keys, h.Key)
		values = append(values, nonNilBytes(h.Value))
	}
	return keys, values
}

func joinHeaders(hk []string, hv [][]byte) []kgo.RecordHeader {
	hs := make([]kgo.RecordHeader, 0, len(hk))
	for i := range hk {
		if i < len(hv) {
			hs = append(hs, kgo.RecordHeader{Key: hk[i], Value: hv[i]})
		}
	}
	return hs
}

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// Prune deletes rows sent before olderThan, at most limit per call, and
// returns how many it deleted. A pruned message id can be enqueued again,
// so keep rows longer than a business event can be redelivered. limit must
// be at least 1. Parked rows are never pruned: retry or drop them
// ([ParkedFilter.Retry], [ParkedFilter.Drop]).
func Prune(ctx context.Context, db postgres.DB, olderThan time.Time, limit int) (int64, error) {
	const op = "outbox.Prune"
	switch {
	case db == nil:
		return 0, &effects.ConfigError{Op: op, Option: "db", Reason: "nil"}
	case limit < 1:
		return 0, &effects.ConfigError{Op: op, Option: "limit", Reason: fmt.Sprintf("%d rows; need at least 1", limit)}
	}
	var n int64
	err := inTx(ctx, db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sqlPrune, olderThan, limit)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	return n, nil
}

// inTx runs f in a transaction of db and commits.
func inTx(ctx context.Context, db postgres.DB, f func(tx pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer rollback(ctx, tx)
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// rollbackTimeout bounds a rollback, which runs even after ctx is done so
// that a healthy connection goes back to its pool.
const rollbackTimeout = 5 * time.Second

// rollback rolls tx back on a context detached from ctx's cancellation
// (a no-op after Commit).
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := retry.Detached(ctx, rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}
