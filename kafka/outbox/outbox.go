// Package outbox is the transactional outbox for Kafka: the application
// writes a record into an outbox table inside its own business
// transaction ([Enqueue]), so the record is published if and only if the
// transaction commits, and relays ([Relay]) publish the rows at least
// once, with the row's message id in the effectively.dev/kafka.KeyHeader
// header for downstream dedup.
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
	"effectively.dev/effects/journal"
	"effectively.dev/effects/retry"
	"effectively.dev/kafka/internal/produce"
	"effectively.dev/postgres"
)

// Schema is the SQL that [Migrate] runs: the effectively_outbox table, a
// unique index on message_id and a partial index on unsent rows. It is
// exported for projects that manage their schema with their own migration
// tool: copy it into a migration instead of calling Migrate.
//
//go:embed outbox.sql
var Schema string

// lockID is the pg_advisory_xact_lock key that serializes Migrate calls;
// it spells "effoutbx" in ASCII.
const lockID int64 = 0x6566666f75746278

// Defaults of a [Relay], used when the matching option is not given.
const (
	// DefaultBatchSize is how many rows one batch takes.
	DefaultBatchSize = 100
	// DefaultPollInterval is how long Run waits after a batch that found
	// fewer rows than the batch size, and after an error.
	DefaultPollInterval = 200 * time.Millisecond
)

// TxBeginner starts transactions: *pgxpool.Pool, *pgx.Conn and pgx.Tx
// (which opens a savepoint) all satisfy it.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate creates the outbox table and its indexes ([Schema]) if they do
// not exist, in the connection's current schema. It is idempotent and safe
// to run concurrently.
func Migrate(ctx context.Context, db TxBeginner) error {
	if db == nil {
		return &effects.ConfigError{Op: "outbox.Migrate", Option: "db", Reason: "nil"}
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("outbox.Migrate: begin: %w", err)
	}
	defer rollback(ctx, tx)
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockID); err != nil {
		return fmt.Errorf("outbox.Migrate: lock: %w", err)
	}
	// Without arguments pgx uses the simple protocol: one round trip for
	// all statements.
	if _, err := tx.Exec(ctx, Schema); err != nil {
		return fmt.Errorf("outbox.Migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("outbox.Migrate: commit: %w", err)
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

// Enqueue writes m into the outbox inside tx, the application's business
// transaction: the record is published if and only if tx commits. It
// reports whether m was inserted; enqueueing an ID that is already in the
// outbox with the same payload does nothing and returns false (so a
// redelivered business handler does not publish twice), and with another
// payload returns [effects.ErrKeyReused]. If another open transaction is
// inserting the same ID, Enqueue waits for it.
//
// The table must exist ([Migrate]). The relay publishes rows in id order,
// at least once.
func Enqueue(ctx context.Context, tx pgx.Tx, m Message) (bool, error) {
	const op = "outbox.Enqueue"
	st, fp, err := insert(op, m, " ON CONFLICT (message_id) DO NOTHING RETURNING id")
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
	if err := tx.QueryRow(ctx, `SELECT fingerprint FROM effectively_outbox WHERE message_id = $1`, string(m.ID)).Scan(&stored); err != nil {
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
// for an invalid ID or an empty topic.
func EnqueueStatement(m Message) (postgres.Statement, error) {
	st, _, err := insert("outbox.EnqueueStatement", m, "")
	return st, err
}

// insert validates m and returns the INSERT of its row (followed by
// suffix) and its fingerprint.
func insert(op string, m Message, suffix string) (postgres.Statement, []byte, error) {
	if err := m.ID.Validate(); err != nil {
		return postgres.Statement{}, nil, err
	}
	if m.Topic == "" {
		return postgres.Statement{}, nil, fmt.Errorf("%s key %q: empty topic", op, string(m.ID))
	}
	rec := produce.Record(m.ID, m.Topic, m.Key, m.Value, m.Headers)
	fp := produce.Fingerprint(rec)
	hk, hv := splitHeaders(m.Headers)
	return postgres.Statement{SQL: `INSERT INTO effectively_outbox
	(message_id, fingerprint, topic, key, value, header_keys, header_values)
VALUES ($1, $2, $3, $4, $5, $6, $7)` + suffix, Args: []any{string(m.ID), fp, m.Topic, rec.Key, m.Value, hk, hv}}, fp, nil
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

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// Relay publishes outbox rows to Kafka, at least once.
//
// Each batch is one database transaction: select up to the batch size of
// unsent rows in id order with FOR UPDATE SKIP LOCKED, produce them with
// the idempotent producer, and mark the acked ones sent (sent_at, and ref
// = "partition/offset"; or delete them, [WithDeleteSent]) before
// committing. Relays running at once take
// disjoint batches, so they neither lose nor duplicate rows; rows whose
// produce failed stay unsent (attempts and last_error say why) and are
// retried by the next batch. A batch waits for its records only, never for
// the client's linger.
//
// The duplicate window: a crash, or a lost COMMIT, after the broker's ack
// and before the rows are marked sent leaves them unsent, and the next
// batch publishes them again. Consumers dedup on the
// effectively.dev/kafka.KeyHeader header, which holds the message id.
//
// Ordering: one relay publishes in id order. Several relays (or a retry
// after a failure) can publish rows out of id order, also for one record
// key; if consumers need per-key order, run one relay.
//
// Each batch holds its rows locked for the duration of a produce; keep
// batches small enough for that to be short.
type Relay struct {
	db       TxBeginner
	sync     *produce.Syncer
	batch    int
	interval time.Duration
	onErr    func(error)

	deleteSent bool // WithDeleteSent

	// afterProduce, if set, runs after the produce and before the rows
	// are marked sent; tests use it to crash in the duplicate window.
	afterProduce func(ctx context.Context) error
}

// RelayOption configures a [Relay]; see [NewRelay]. A nil RelayOption is
// ignored.
type RelayOption func(*relayConfig)

type relayConfig struct {
	batch      int
	interval   time.Duration
	onErr      func(error)
	deleteSent bool
}

// WithBatchSize sets how many rows one batch takes (default
// [DefaultBatchSize]). n must be at least 1.
func WithBatchSize(n int) RelayOption { return func(c *relayConfig) { c.batch = n } }

// WithPollInterval sets how long [Relay.Run] waits after a batch that
// found fewer rows than the batch size, and after an error (default
// [DefaultPollInterval]). d must be positive.
func WithPollInterval(d time.Duration) RelayOption { return func(c *relayConfig) { c.interval = d } }

// WithDeleteSent makes the relay delete the rows it published, in the
// batch's transaction, instead of marking them sent: the outbox keeps only
// unsent rows and needs no [Prune], and a published row costs a delete (a
// small WAL record) instead of a new row version with two index entries.
// What it gives up: no record of a published row (sent_at, ref) stays, so
// an ID enqueued again after its row was deleted is published again, and
// with another payload it is published rather than refused with
// [effects.ErrKeyReused], which needs the row. Use
// it where each message is enqueued once, by an effect that dedups on its
// own key ([EnqueueStatement] in a postgres.NewPipelined effect, [Enqueue]
// in a postgres.New write). The duplicate window is the same.
func WithDeleteSent() RelayOption { return func(c *relayConfig) { c.deleteSent = true } }

// WithErrorHandler receives the errors that [Relay.Run] retries; by
// default they are dropped.
func WithErrorHandler(f func(error)) RelayOption { return func(c *relayConfig) { c.onErr = f } }

// NewRelay returns a relay of the outbox in db to Kafka through client,
// which must be an idempotent acks=all producer as for
// effectively.dev/kafka.NewProducer (an error wrapping
// effectively.dev/kafka.ErrNotIdempotent otherwise). A nil db or client,
// or an invalid option, is a *[effects.ConfigError].
func NewRelay(db TxBeginner, client *kgo.Client, opts ...RelayOption) (*Relay, error) {
	const ctor = "outbox.NewRelay"
	bad := func(option, format string, args ...any) error {
		return &effects.ConfigError{Op: ctor, Option: option, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case db == nil:
		return nil, bad("db", "nil")
	case client == nil:
		return nil, bad("client", "nil")
	}
	if err := produce.CheckClient(client); err != nil {
		return nil, fmt.Errorf("%s: %w", ctor, err)
	}
	cfg := relayConfig{batch: DefaultBatchSize, interval: DefaultPollInterval}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	switch {
	case cfg.batch < 1:
		return nil, bad("WithBatchSize", "%d rows; need at least 1", cfg.batch)
	case cfg.interval <= 0:
		return nil, bad("WithPollInterval", "interval %v is not positive", cfg.interval)
	}
	return &Relay{db: db, sync: produce.NewSyncer(client), batch: cfg.batch, interval: cfg.interval, onErr: cfg.onErr, deleteSent: cfg.deleteSent}, nil
}

type row struct {
	id  int64
	rec *kgo.Record
}

// RelayBatch publishes one batch and returns how many rows it marked sent.
// An error says which rows failed; the rows marked sent are committed
// anyway.
func (r *Relay) RelayBatch(ctx context.Context) (int, error) {
	const op = "outbox.Relay"
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("%s: begin: %w", op, err)
	}
	defer rollback(ctx, tx)
	rows, err := tx.Query(ctx, `SELECT id, message_id, topic, key, value, header_keys, header_values
FROM effectively_outbox
WHERE sent_at IS NULL
ORDER BY id
LIMIT $1
FOR UPDATE SKIP LOCKED`, r.batch)
	if err != nil {
		return 0, fmt.Errorf("%s: selecting unsent rows: %w", op, err)
	}
	var batch []row
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
		batch = append(batch, row{id: id, rec: produce.Record(effects.Key(msgID), topic, key, value, hs)})
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
	// Wait for every record's outcome (franz-go does not abandon an
	// idempotent record that was sent), but not for the linger.
	results := r.sync.Produce(ctx, recs...)
	if r.afterProduce != nil {
		if err := r.afterProduce(ctx); err != nil {
			return 0, err
		}
	}
	// The records are in Kafka: record that even if ctx is done, or they
	// are published again.
	mctx, cancel := retry.Detached(ctx, journal.DefaultRecordTimeout)
	defer cancel()
	var (
		sentIDs  []int64
		sentRefs []string
		failIDs  []int64
		failMsgs []string
		errs     []error
	)
	for i, res := range results {
		// results are in completion order; map them back by record.
		id := rowID(batch, res.Record, i)
		if res.Err != nil {
			failIDs = append(failIDs, id)
			failMsgs = append(failMsgs, res.Err.Error())
			errs = append(errs, fmt.Errorf("row %d: %w", id, res.Err))
			continue
		}
		sentIDs = append(sentIDs, id)
		sentRefs = append(sentRefs, produce.Ref(res.Record))
	}
	if len(sentIDs) > 0 {
		var err error
		if r.deleteSent {
			_, err = tx.Exec(mctx, `DELETE FROM effectively_outbox WHERE id = ANY($1::bigint[])`, sentIDs)
		} else {
			_, err = tx.Exec(mctx, `UPDATE effectively_outbox AS o
SET sent_at = now(), ref = u.ref, attempts = o.attempts + 1, last_error = NULL
FROM unnest($1::bigint[], $2::text[]) AS u(id, ref)
WHERE o.id = u.id`, sentIDs, sentRefs)
		}
		if err != nil {
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

// rowID finds the outbox row of a produced record: results come in
// completion order, which need not be the batch's order.
func rowID(batch []row, rec *kgo.Record, i int) int64 {
	if i < len(batch) && batch[i].rec == rec {
		return batch[i].id
	}
	for _, b := range batch {
		if b.rec == rec {
			return b.id
		}
	}
	panic("outbox.Relay: produced record not in the batch")
}

// Run relays batches until ctx is done, then returns nil. It runs the next
// batch at once after a full one, and waits the poll interval after a
// partial batch or an error (errors go to [WithErrorHandler] and are
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
		if retry.Sleep(ctx, r.interval) != nil {
			return nil
		}
	}
}

// Prune deletes rows sent before olderThan, at most limit per call, and
// returns how many it deleted. A pruned message id can be enqueued again,
// so keep rows longer than a business event can be redelivered. limit must
// be at least 1.
func Prune(ctx context.Context, db TxBeginner, olderThan time.Time, limit int) (int64, error) {
	const op = "outbox.Prune"
	switch {
	case db == nil:
		return 0, &effects.ConfigError{Op: op, Option: "db", Reason: "nil"}
	case limit < 1:
		return 0, &effects.ConfigError{Op: op, Option: "limit", Reason: fmt.Sprintf("%d rows; need at least 1", limit)}
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	defer rollback(ctx, tx)
	tag, err := tx.Exec(ctx, `DELETE FROM effectively_outbox WHERE id IN (
	SELECT id FROM effectively_outbox WHERE sent_at < $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)`, olderThan, limit)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	return tag.RowsAffected(), nil
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
