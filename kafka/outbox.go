package kafka

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
)

// OutboxSchema is the SQL that [MigrateOutbox] runs: the effectively_outbox
// table, a unique index on message_id and a partial index on unsent rows.
// It is exported for projects that manage their schema with their own
// migration tool: copy it into a migration instead of calling MigrateOutbox.
//
//go:embed outbox.sql
var OutboxSchema string

// outboxLockID is the pg_advisory_xact_lock key that serializes
// MigrateOutbox calls; it spells "effoutbx" in ASCII.
const outboxLockID int64 = 0x6566666f75746278

// TxBeginner starts transactions: *pgxpool.Pool, *pgx.Conn and pgx.Tx
// (which opens a savepoint) all satisfy it.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// MigrateOutbox creates the outbox table and its indexes ([OutboxSchema])
// if they do not exist, in the connection's current schema. It is
// idempotent and safe to run concurrently.
func MigrateOutbox(ctx context.Context, db TxBeginner) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("kafka.MigrateOutbox: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", outboxLockID); err != nil {
		return fmt.Errorf("kafka.MigrateOutbox: lock: %w", err)
	}
	// Without arguments pgx uses the simple protocol: one round trip for
	// all statements.
	if _, err := tx.Exec(ctx, OutboxSchema); err != nil {
		return fmt.Errorf("kafka.MigrateOutbox: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("kafka.MigrateOutbox: commit: %w", err)
	}
	return nil
}

// OutboxMessage is one record to publish through the outbox.
type OutboxMessage struct {
	// ID is the message's identity, built like any key (effects.NewKey
	// from the business event's id). It is required, is unique in the
	// outbox, and travels in the [KeyHeader] header so that consumers can
	// dedup the relay's at-least-once delivery.
	ID effects.Key
	// Topic is the topic to publish to.
	Topic string
	// Key is the record key; nil means ID.
	Key []byte
	// Value is the record value.
	Value []byte
	// Headers are extra headers; one named [KeyHeader] is replaced by ID.
	Headers []kgo.RecordHeader
}

// Enqueue writes m into the outbox inside tx, the application's business
// transaction: the record is published if and only if tx commits. It
// reports whether m was inserted; enqueueing an ID that is already in the
// outbox with the same payload does nothing and returns false (so a
// redelivered business handler does not publish twice), and with another
// payload returns [effects.ErrKeyReused]. If another open transaction is
// inserting the same ID, Enqueue waits for it.
//
// The table must exist ([MigrateOutbox]). The relay publishes rows in id
// order, at least once.
func Enqueue(ctx context.Context, tx pgx.Tx, m OutboxMessage) (bool, error) {
	const op = "kafka.Enqueue"
	if err := m.ID.Validate(); err != nil {
		return false, err
	}
	if m.Topic == "" {
		return false, fmt.Errorf("%s key %q: empty topic", op, string(m.ID))
	}
	rec := outboxRecord(m.ID, m.Topic, m.Key, m.Value, m.Headers)
	fp := fingerprint(rec)
	hk, hv := splitHeaders(m.Headers)
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO effectively_outbox
	(message_id, fingerprint, topic, key, value, header_keys, header_values)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (message_id) DO NOTHING
RETURNING id`, string(m.ID), fp, m.Topic, rec.Key, m.Value, hk, hv).Scan(&id)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("%s key %q: %w", op, string(m.ID), err)
	}
	var stored []byte
	if err := tx.QueryRow(ctx, `SELECT fingerprint FROM effectively_outbox WHERE message_id = $1`, string(m.ID)).Scan(&stored); err != nil {
		return false, fmt.Errorf("%s key %q: %w", op, string(m.ID), err)
	}
	if !bytes.Equal(stored, fp) {
		return false, &effects.Error{Kind: effects.ErrKeyReused, Op: op, Key: m.ID,
			Err: errors.New("the outbox holds this message id with another payload")}
	}
	return false, nil
}

func splitHeaders(hs []kgo.RecordHeader) ([]string, [][]byte) {
	keys := []string{}
	values := [][]byte{}
	for _, h := range hs {
		if h.Key == KeyHeader {
			continue
		}
		keys = append(keys, h.Key)
		values = append(values, nonNilBytes(h.Value))
	}
	return keys, values
}

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// outboxRecord builds the record for an outbox row: the ID in KeyHeader,
// and as the record key unless one was given.
func outboxRecord(id effects.Key, topic string, key, value []byte, hs []kgo.RecordHeader) *kgo.Record {
	r := &kgo.Record{Topic: topic, Key: key, Value: value}
	if r.Key == nil {
		r.Key = []byte(id)
	}
	for _, h := range hs {
		if h.Key != KeyHeader {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: KeyHeader, Value: []byte(id)})
	return r
}

// Relay publishes outbox rows to Kafka, at least once.
//
// Each batch is one database transaction: select up to the batch size of
// unsent rows in id order with FOR UPDATE SKIP LOCKED, produce them with
// the idempotent producer, and mark the acked ones sent (sent_at, and ref
// = "partition/offset") before committing. Relays running at once take
// disjoint batches, so they neither lose nor duplicate rows; rows whose
// produce failed stay unsent (attempts and last_error say why) and are
// retried by the next batch.
//
// The duplicate window: a crash, or a lost COMMIT, after the broker's ack
// and before the rows are marked sent leaves them unsent, and the next
// batch publishes them again. Consumers dedup on the [KeyHeader] header,
// which holds the message id.
//
// Ordering: one relay publishes in id order. Several relays (or a retry
// after a failure) can publish rows out of id order, also for one record
// key; if consumers need per-key order, run one relay.
//
// Each batch holds its rows locked for the duration of a produce; keep
// batches small enough for that to be short.
type Relay struct {
	db       TxBeginner
	client   *kgo.Client
	batch    int
	interval time.Duration
	onErr    func(error)

	// afterProduce, if set, runs after the produce and before the rows
	// are marked sent; tests use it to crash in the duplicate window.
	afterProduce func(ctx context.Context) error
}

// RelayOption configures a [Relay].
type RelayOption func(*Relay)

// WithBatchSize sets how many rows one batch takes (default 100).
func WithBatchSize(n int) RelayOption { return func(r *Relay) { r.batch = n } }

// WithPollInterval sets how long [Relay.Run] waits after a batch that
// found fewer rows than the batch size (default 200 ms), and after an
// error.
func WithPollInterval(d time.Duration) RelayOption { return func(r *Relay) { r.interval = d } }

// WithRelayErrors receives the errors that [Relay.Run] retries; by default
// they are dropped.
func WithRelayErrors(f func(error)) RelayOption { return func(r *Relay) { r.onErr = f } }

// NewRelay returns a relay of the outbox in db to Kafka through client,
// which must be an idempotent acks=all producer as for [NewProducer].
func NewRelay(db TxBeginner, client *kgo.Client, opts ...RelayOption) (*Relay, error) {
	if db == nil || client == nil {
		return nil, errors.New("kafka.NewRelay: nil database or client")
	}
	if err := checkIdempotent(client); err != nil {
		return nil, fmt.Errorf("kafka.NewRelay: %w", err)
	}
	r := &Relay{db: db, client: client, batch: 100, interval: 200 * time.Millisecond}
	for _, o := range opts {
		o(r)
	}
	if r.batch <= 0 || r.interval <= 0 {
		return nil, errors.New("kafka.NewRelay: batch size and poll interval must be positive")
	}
	return r, nil
}

type outboxRow struct {
	id  int64
	rec *kgo.Record
}

// RelayBatch publishes one batch and returns how many rows it marked sent.
// An error says which rows failed; the rows marked sent are committed
// anyway.
func (r *Relay) RelayBatch(ctx context.Context) (int, error) {
	const op = "kafka.Relay"
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("%s: begin: %w", op, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	rows, err := tx.Query(ctx, `SELECT id, message_id, topic, key, value, header_keys, header_values
FROM effectively_outbox
WHERE sent_at IS NULL
ORDER BY id
LIMIT $1
FOR UPDATE SKIP LOCKED`, r.batch)
	if err != nil {
		return 0, fmt.Errorf("%s: selecting unsent rows: %w", op, err)
	}
	var batch []outboxRow
	for rows.Next() {
		var (
			id         int64
			msgID      string
			topic      string
			key, value []byte
			hk         []string
			hv         [][]byte
		)
		if err := rows.Scan(&id, &msgID, &topic, &key, &value, &hk, &hv); err != nil {
			rows.Close()
			return 0, fmt.Errorf("%s: %w", op, err)
		}
		hs := make([]kgo.RecordHeader, 0, len(hk))
		for i := range hk {
			if i < len(hv) {
				hs = append(hs, kgo.RecordHeader{Key: hk[i], Value: hv[i]})
			}
		}
		batch = append(batch, outboxRow{id: id, rec: outboxRecord(effects.Key(msgID), topic, key, value, hs)})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("%s: selecting unsent rows: %w", op, err)
	}
	if len(batch) == 0 {
		return 0, nil
	}
	recs := make([]*kgo.Record, len(batch))
	for i, b := range batch {
		recs[i] = b.rec
	}
	// ProduceSync waits for every record's outcome: franz-go does not
	// abandon an idempotent record that was sent.
	results := r.client.ProduceSync(ctx, recs...)
	if r.afterProduce != nil {
		if err := r.afterProduce(ctx); err != nil {
			return 0, err
		}
	}
	// The records are in Kafka: record that even if ctx is done, or they
	// are published again.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var (
		sentIDs  []int64
		sentRefs []string
		failIDs  []int64
		failMsgs []string
		errs     []error
	)
	for i, res := range results {
		// results are in promise order; map them back by record.
		id := rowID(batch, res.Record, i)
		if res.Err != nil {
			failIDs = append(failIDs, id)
			failMsgs = append(failMsgs, res.Err.Error())
			errs = append(errs, fmt.Errorf("row %d: %w", id, res.Err))
			continue
		}
		sentIDs = append(sentIDs, id)
		sentRefs = append(sentRefs, ref(res.Record))
	}
	if len(sentIDs) > 0 {
		if _, err := tx.Exec(mctx, `UPDATE effectively_outbox AS o
SET sent_at = now(), ref = u.ref, attempts = o.attempts + 1, last_error = NULL
FROM unnest($1::bigint[], $2::text[]) AS u(id, ref)
WHERE o.id = u.id`, sentIDs, sentRefs); err != nil {
			return 0, fmt.Errorf("%s: marking %d rows sent (they will be published again): %w", op, len(sentIDs), err)
		}
	}
	if len(failIDs) > 0 {
		if _, err := tx.Exec(mctx, `UPDATE effectively_outbox AS o
SET attempts = o.attempts + 1, last_error = u.msg
FROM unnest($1::bigint[], $2::text[]) AS u(id, msg)
WHERE o.id = u.id`, failIDs, failMsgs); err != nil {
			errs = append(errs, err)
		}
	}
	if err := tx.Commit(mctx); err != nil {
		return 0, fmt.Errorf("%s: commit (%d rows produced will be published again): %w", op, len(sentIDs), err)
	}
	if len(errs) > 0 {
		return len(sentIDs), fmt.Errorf("%s: %d of %d rows failed: %w", op, len(failIDs), len(batch), errors.Join(errs...))
	}
	return len(sentIDs), nil
}

// rowID finds the outbox row of a produced record: ProduceSync returns
// results in completion order, which need not be the batch's order.
func rowID(batch []outboxRow, rec *kgo.Record, i int) int64 {
	if i < len(batch) && batch[i].rec == rec {
		return batch[i].id
	}
	for _, b := range batch {
		if b.rec == rec {
			return b.id
		}
	}
	panic("kafka.Relay: produced record not in the batch")
}

// Run relays batches until ctx is done, then returns nil. It runs the next
// batch at once after a full one, and waits the poll interval after a
// partial batch or an error (errors go to [WithRelayErrors] and are
// retried).
func (r *Relay) Run(ctx context.Context) error {
	for {
		n, err := r.RelayBatch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && r.onErr != nil {
			r.onErr(err)
		}
		if err == nil && n == r.batch {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.interval):
		}
	}
}

// PruneOutbox deletes rows sent before olderThan, at most limit per call,
// and returns how many it deleted. A pruned message id can be enqueued
// again, so keep rows longer than a business event can be redelivered.
func PruneOutbox(ctx context.Context, db TxBeginner, olderThan time.Time, limit int) (int64, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("kafka.PruneOutbox: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	tag, err := tx.Exec(ctx, `DELETE FROM effectively_outbox WHERE id IN (
	SELECT id FROM effectively_outbox WHERE sent_at < $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)`, olderThan, limit)
	if err != nil {
		return 0, fmt.Errorf("kafka.PruneOutbox: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("kafka.PruneOutbox: %w", err)
	}
	return tag.RowsAffected(), nil
}
