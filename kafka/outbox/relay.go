package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
	"effectively.dev/internal/ratelog"
	"effectively.dev/kafka/internal/produce"
	"effectively.dev/postgres"
)

// Defaults of a [Relay], used when the matching option is not given.
const (
	// defaultBatchSize is how many rows one batch claims.
	defaultBatchSize = 100
	// defaultPollInterval is how long Run waits after a batch that claimed
	// fewer rows than the batch size, and after an error.
	defaultPollInterval = 200 * time.Millisecond
	// defaultProduceTimeout bounds how long a batch waits for the broker's
	// acks.
	defaultProduceTimeout = 10 * time.Second
	// defaultMaxAttempts is how many counted failed attempts park a row.
	defaultMaxAttempts = 10
)

// maxRetryDelay caps how long a row that failed waits before it can be
// claimed again.
const maxRetryDelay = time.Minute

// pingTimeout bounds the metadata request that tells a failed row from an
// unreachable cluster.
const pingTimeout = 2 * time.Second

// Relay publishes outbox rows to Kafka, at least once.
//
// Each batch takes three steps, and no database transaction is open
// across the produce:
//
//  1. Claim, in one short transaction: up to the batch size of rows that
//     are neither sent, parked nor claimed, in id order (FOR UPDATE SKIP
//     LOCKED), get a claim that lasts twice the produce timeout
//     ([WithProduceTimeout]): long enough to produce and mark them.
//  2. Produce them with the idempotent producer, outside any transaction,
//     waiting for the acks at most the produce timeout (never for the
//     client's linger).
//  3. Mark, in a second short transaction: the acked rows sent (sent_at,
//     and ref = "partition/offset"; or delete them, [WithDeleteSent]); the
//     others failed, with their error, their claim released and a pause
//     before they can be claimed again that grows with their attempts (up
//     to a minute), so that rows behind them are claimed first.
//
// Relays running at once claim disjoint rows; a relay that dies holds its
// claims until they expire, and then other relays take the rows.
//
// Parking: a row the broker refuses for good is parked at once: too large
// (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE), an invalid or corrupt record
// (INVALID_RECORD, CORRUPT_MESSAGE), a topic the client may not write
// (TOPIC_AUTHORIZATION_FAILED), a topic that does not exist once franz-go
// gave up waiting for it (UNKNOWN_TOPIC_OR_PARTITION after
// kgo.UnknownTopicRetries metadata loads), an invalid topic name or a
// broker policy violation. When several rows of a batch are refused, each
// is produced again alone before it is parked, because a broker refuses a
// whole record batch for one bad record. A row whose failed attempts
// reach [WithMaxAttempts] is parked too. A failed attempt counts when the
// broker or the client gave up on the record, or when the produce timed
// out while the cluster answered a metadata request right after; an
// attempt that timed out while the cluster was unreachable is an outage,
// not the row's fault, and does not count. (With franz-go's defaults a
// record is retried inside the client until the produce timeout, so a
// partition whose leaders are all down while the rest of the cluster
// answers counts against its rows: keep [WithMaxAttempts] times the
// produce timeout above the partition outages you want to ride out
// without parking.) A parked row keeps its error, attempt count and class
// ("permanent" or "retryable"), is never claimed again, is counted in
// [Relay.Stats] and reported as a *[ParkedError] (logged by default); see
// [ParkedFilter.List], [ParkedFilter.Retry] and [ParkedFilter.Drop].
//
// Order. By default a relay publishes in id order, but a row that fails is
// retried after the rows behind it, and a parked row is skipped: later
// rows of its record key are published without it (a poison row never
// holds back the rows behind it). With [WithKeyOrder] rows of one topic
// and record key are published one at a time in id order: a row is
// claimed only after every earlier row of its key was acked, and a parked
// row holds back the later rows of its key until it is retried and sent,
// or dropped. Either way a row is published before a later row of its key
// only if it was marked sent first, duplicates aside.
//
// The duplicate window: a crash, or a lost COMMIT, after the broker's ack
// and before the rows are marked sent leaves them unsent, and they are
// published again once their claim expires; so does a produce that
// outlasts its claim. Consumers dedup on the
// effectively.dev/kafka.KeyHeader header, which holds the message id.
//
// A Relay is safe for concurrent use.
type Relay struct {
	db          postgres.DB
	cl          *kgo.Client
	sync        *produce.Syncer
	batch       int
	interval    time.Duration
	timeout     time.Duration
	maxAttempts int
	keyOrder    bool
	deleteSent  bool
	rep         ratelog.Reporter

	batches, sent, failed, parked, repeated atomic.Int64

	// afterProduce, if set, runs after the produce and before the rows
	// are marked sent; tests use it to crash in the duplicate window.
	afterProduce func(ctx context.Context) error
}

type relayConfig struct {
	batch       int
	interval    time.Duration
	timeout     time.Duration
	maxAttempts int
	keyOrder    bool
	deleteSent  bool
	observer    effects.Observer
	logger      *slog.Logger
	loggerSet   bool
}

// WithBatchSize sets how many rows one batch claims (default 100). n must
// be at least 1.
func WithBatchSize(n int) RelayOption {
	return relayOpt(func(c *relayConfig) { c.batch = n })
}

// WithPollInterval sets how long [Relay.Run] waits after a batch that
// claimed fewer rows than the batch size, and after an error (default
// 200 ms). d must be positive.
func WithPollInterval(d time.Duration) RelayOption {
	return relayOpt(func(c *relayConfig) { c.interval = d })
}

// WithProduceTimeout bounds how long a batch waits for the broker's acks
// (default 10 s); rows not acked by then failed this
// attempt. A claim lasts twice as long, so a relay that dies holds its
// rows that long before another relay takes them. d must be positive.
func WithProduceTimeout(d time.Duration) RelayOption {
	return relayOpt(func(c *relayConfig) { c.timeout = d })
}

// WithMaxAttempts parks a row after n counted failed attempts (default
// 10; see [Relay] for which attempts count). 0 parks
// only the rows the broker refuses for good. n must not be negative.
func WithMaxAttempts(n int) RelayOption {
	return relayOpt(func(c *relayConfig) { c.maxAttempts = n })
}

// WithKeyOrder publishes the rows of one topic and record key one at a
// time, in id order: a row is claimed only when every earlier row of its
// key was acked, and a parked row holds back the later rows of its key
// until it is retried and sent, or dropped. Use it when consumers apply a
// key's events in order and a missing one would be worse than a late one.
// The cost: a key's rows go out one per batch, and a poison row stops its
// key. It needs an index that [Migrate] creates when given this option
// (without it each claim scans every unsent row).
func WithKeyOrder() RelayOption {
	return relayOpt(func(c *relayConfig) { c.keyOrder = true })
}

// WithDeleteSent makes the relay delete the rows it published, in the
// marking transaction, instead of marking them sent: the outbox keeps only
// unsent and parked rows and needs no [Prune], and a published row costs
// a delete (a small WAL record) instead of a new row version. What it
// gives up: no record of a published row (sent_at, ref) stays, so an ID
// enqueued again after its row was deleted is published again, and with
// another payload it is published rather than refused with
// [effects.ErrKeyReused], which needs the row. Use it where each message
// is enqueued once, by an effect that dedups on its own key
// ([EnqueueStatement] in a postgres.NewPipelined effect, [Enqueue] in a
// postgres.New write). The duplicate window is the same.
func WithDeleteSent() RelayOption {
	return relayOpt(func(c *relayConfig) { c.deleteSent = true })
}

// NewRelay returns a relay of the outbox in db to Kafka through client,
// which must be an idempotent acks=all producer as for
// effectively.dev/kafka.NewProducer (an error wrapping
// effectively.dev/kafka.ErrNotIdempotent otherwise). A nil db or client,
// or an invalid option, is a *[effects.ConfigError]. Nothing is sent
// before the first batch.
func NewRelay(db postgres.DB, client *kgo.Client, opts ...RelayOption) (*Relay, error) {
	const ctor = "outbox.NewRelay"
	switch {
	case db == nil:
		return nil, effects.ConfigErrorf(ctor, "db", "nil")
	case client == nil:
		return nil, effects.ConfigErrorf(ctor, "client", "nil")
	}
	if err := produce.CheckClient(client); err != nil {
		return nil, fmt.Errorf("%s: %w", ctor, err)
	}
	cfg := relayConfig{batch: defaultBatchSize, interval: defaultPollInterval,
		timeout: defaultProduceTimeout, maxAttempts: defaultMaxAttempts}
	for _, o := range opts {
		if o != nil {
			o.applyRelay(&cfg)
		}
	}
	switch {
	case cfg.batch < 1:
		return nil, effects.ConfigErrorf(ctor, "WithBatchSize", "%d rows; need at least 1", cfg.batch)
	case cfg.interval <= 0:
		return nil, effects.ConfigErrorf(ctor, "WithPollInterval", "interval %v is not positive", cfg.interval)
	case cfg.timeout <= 0:
		return nil, effects.ConfigErrorf(ctor, "WithProduceTimeout", "timeout %v is not positive", cfg.timeout)
	case cfg.maxAttempts < 0:
		return nil, effects.ConfigErrorf(ctor, "WithMaxAttempts", "%d attempts; need 0 (park only refused rows) or more", cfg.maxAttempts)
	case cfg.loggerSet && cfg.logger == nil:
		return nil, effects.ConfigErrorf(ctor, "WithLogger", "nil logger")
	}
	return &Relay{db: db, cl: client, sync: produce.NewSyncer(client), batch: cfg.batch, interval: cfg.interval,
		timeout: cfg.timeout, maxAttempts: cfg.maxAttempts, keyOrder: cfg.keyOrder,
		deleteSent: cfg.deleteSent,
		rep:        ratelog.Reporter{Observer: cfg.observer, Limiter: ratelog.Limiter{Logger: cfg.logger}}}, nil
}

// RelayStats counts what a [Relay] did, over all its batches.
type RelayStats struct {
	// Batches counts batches that claimed at least one row.
	Batches int64
	// Sent counts rows marked sent (or deleted, [WithDeleteSent]) after
	// the broker's ack.
	Sent int64
	// Failed counts failed attempts of rows that stayed pending.
	Failed int64
	// Parked counts rows this relay parked.
	Parked int64
	// Repeated counts rows the broker acked to this relay that were
	// already marked sent (or deleted) when it marked them: another relay
	// published them too, after this one's claim expired (a produce that
	// outlasted its claim). Each is a duplicate in the declared window.
	Repeated int64
}

// Stats returns the relay's counters.
func (r *Relay) Stats() RelayStats {
	return RelayStats{Batches: r.batches.Load(), Sent: r.sent.Load(), Failed: r.failed.Load(), Parked: r.parked.Load(),
		Repeated: r.repeated.Load()}
}

// ParkedError reports a row the relay parked: it will not be published
// until [ParkedFilter.Retry] returns it to the relay. It unwraps to the
// produce error.
type ParkedError struct {
	// ID is the row's id; MessageID and Topic are its message's.
	ID        int64
	MessageID effects.Key
	Topic     string
	// Attempts is the row's counted attempts, this one included.
	Attempts int
	// Class is [effects.Permanent] for a row the broker refused for
	// good, [effects.Retryable] for one that reached the attempt
	// limit.
	Class effects.Class
	// Err is the last produce error.
	Err error
}

// Error says which row was parked, why, and what to do.
func (e *ParkedError) Error() string {
	return fmt.Sprintf("outbox: row %d (message %q, topic %q) parked after %d attempts (%s): %v; it is not published until retried (outbox.ParkedFilter.Retry, or effectively outbox retry)",
		e.ID, string(e.MessageID), e.Topic, e.Attempts, e.Class, e.Err)
}

// Unwrap returns the produce error.
func (e *ParkedError) Unwrap() error { return e.Err }

// row is one claimed row.
type row struct {
	id       int64
	msgID    string
	rec      *kgo.Record
	attempts int // counted attempts before this one
}

// outcome is what one produce did to one row.
type outcome struct {
	ref string // acked: "partition/offset"
	err error  // failed
}

// batchResult is what one batch did.
type batchResult struct {
	claimed, sent int
	parked        []*ParkedError
	err           error // failures of the batch, joined; its rows stay pending
	config        error // the client is misconfigured: Run stops
}

// RelayBatch runs one batch (claim, produce, mark) and returns how many
// rows it marked sent. Its error joins what went wrong: the rows that
// failed (they stay pending and are retried), each row it parked (a
// *[ParkedError]), and a configuration error (a *[effects.ConfigError]
// and the broker's error: the client may not produce at all). The rows
// marked sent are committed whatever the error.
func (r *Relay) RelayBatch(ctx context.Context) (int, error) {
	res := r.relayBatch(ctx)
	errs := []error{res.err, res.config}
	for _, p := range res.parked {
		errs = append(errs, p)
	}
	return res.sent, errors.Join(errs...)
}

func (r *Relay) relayBatch(ctx context.Context) batchResult {
	const op = "outbox.Relay"
	var res batchResult
	token := rand.Int64()
	rows, err := r.claim(ctx, token)
	if err != nil {
		res.err = fmt.Errorf("%s: claiming rows: %w", op, err)
		return res
	}
	res.claimed = len(rows)
	if len(rows) == 0 {
		return res
	}
	r.batches.Add(1)
	pctx, cancel := context.WithTimeout(ctx, r.timeout)
	outs := r.produce(pctx, rows)
	timedOut := pctx.Err() != nil
	cancel()
	if r.afterProduce != nil {
		if err := r.afterProduce(ctx); err != nil {
			res.err = err
			return res
		}
	}
	// The acked records are in Kafka: record that even if ctx is done,
	// or they are published again.
	mctx, mcancel := retry.Detached(ctx, 10*time.Second) // a journal's default record timeout
	defer mcancel()
	var (
		sent   []int64
		refs   []string
		failed failures
		errs   []error
	)
	reachable := -1 // unknown until a timed-out row asks
	for i, rw := range rows {
		o := outs[i]
		if o.err == nil {
			sent = append(sent, rw.id)
			refs = append(refs, o.ref)
			continue
		}
		k := classify(o.err)
		counted := true
		switch k {
		case kindConfig:
			counted = false
			if res.config == nil {
				res.config = fmt.Errorf("%w: %w", &effects.ConfigError{Op: op, Option: "client",
					Reason: "the broker refuses this client's produce requests (credentials, ACLs or a closed client): fix it and restart the relay"}, o.err)
			}
		case kindRetryable:
			if timedOut && isContext(o.err) {
				if reachable < 0 {
					reachable = r.reachable(ctx)
				}
				counted = reachable == 1
			}
		}
		failed.add(r, rw, o.err, counted, k == kindRefused)
		if k != kindRefused {
			errs = append(errs, fmt.Errorf("row %d (message %q): %w", rw.id, rw.msgID, o.err))
		}
	}
	parked, err := r.mark(mctx, token, sent, refs, &failed)
	if err != nil {
		res.err = fmt.Errorf("%s: %w", op, err)
		return res
	}
	res.sent, res.parked = len(sent), parked
	r.parked.Add(int64(len(parked)))
	r.failed.Add(int64(len(failed.ids) - len(parked)))
	if len(errs) > 0 {
		res.err = fmt.Errorf("%s: %d of %d rows failed and stay pending: %w", op, len(errs), len(rows), errors.Join(errs...))
	}
	return res
}

// claim claims up to a batch of rows with token, in one short
// transaction, and returns them in id order.
func (r *Relay) claim(ctx context.Context, token int64) ([]row, error) {
	q := sqlClaim
	if r.keyOrder {
		q = sqlClaimKeyOrder
	}
	lease := 2 * r.timeout
	var out []row
	err := inTx(ctx, r.db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q, r.batch, lease.Microseconds(), token)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				rw         row
				topic      string
				key, value []byte
				hk         []string
				hv         [][]byte
			)
			if err := rows.Scan(&rw.id, &rw.msgID, &topic, &key, &value, &hk, &hv, &rw.attempts); err != nil {
				return err
			}
			rw.rec = produce.Record(effects.Key(rw.msgID), topic, key, value, joinHeaders(hk, hv))
			out = append(out, rw)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b row) int { return int(min(max(a.id-b.id, -1), 1)) })
	return out, nil
}

// produce produces the rows' records and returns each row's outcome. When
// the broker refuses several rows for good, each of them is produced again
// alone: a broker refuses a whole record batch for one record in it (too
// large, invalid), and the others must not be parked with it.
func (r *Relay) produce(ctx context.Context, rows []row) []outcome {
	outs := r.produceAll(ctx, rows)
	var refused []int
	for i, o := range outs {
		if o.err != nil && classify(o.err) == kindRefused {
			refused = append(refused, i)
		}
	}
	if len(refused) < 2 {
		return outs
	}
	for _, i := range refused {
		rw := rows[i]
		alone := rw
		alone.rec = fresh(rw.rec)
		outs[i] = r.produceAll(ctx, []row{alone})[0]
	}
	return outs
}

// produceAll produces the rows' records and waits for every outcome, in
// the rows' order.
func (r *Relay) produceAll(ctx context.Context, rows []row) []outcome {
	recs := make([]*kgo.Record, len(rows))
	at := make(map[*kgo.Record]int, len(rows))
	for i, rw := range rows {
		recs[i] = rw.rec
		at[rw.rec] = i
	}
	outs := make([]outcome, len(rows))
	// Wait for every record's outcome (franz-go does not abandon an
	// idempotent record that was sent), but not for the linger. Results
	// come in completion order.
	for _, res := range r.sync.Produce(ctx, recs...) {
		i := at[res.Record]
		if res.Err != nil {
			outs[i].err = res.Err
		} else {
			outs[i].ref = produce.Ref(res.Record)
		}
	}
	return outs
}

// fresh copies a record's payload into a new record, for a second
// produce.
func fresh(r *kgo.Record) *kgo.Record {
	return &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers}
}

// reachable asks the cluster for metadata: 1 if it answers, 0 if not.
func (r *Relay) reachable(ctx context.Context) int {
	if ctx.Err() != nil {
		return 0 // shutting down: not the row's fault
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if r.cl.Ping(pctx) != nil {
		return 0
	}
	return 1
}

// failures are the failed rows of a batch, as the arrays sqlMarkFailed
// takes, and what parking them would report.
type failures struct {
	ids     []int64
	msgs    []string
	counted []bool
	park    []bool
	class   []string
	pause   []int64 // microseconds
	parked  map[int64]*ParkedError
}

// add records rw's failed attempt: parked when refused, or when a counted
// attempt reaches the limit; otherwise held back for a pause that grows
// with its attempts.
func (f *failures) add(r *Relay, rw row, err error, counted, refused bool) {
	attempts := rw.attempts
	if counted {
		attempts++
	}
	class := effects.Unclassified
	switch {
	case refused:
		class = effects.Permanent
	case counted && r.maxAttempts > 0 && attempts >= r.maxAttempts:
		class = effects.Retryable
	}
	park := class != effects.Unclassified
	f.ids = append(f.ids, rw.id)
	f.msgs = append(f.msgs, err.Error())
	f.counted = append(f.counted, counted)
	f.park = append(f.park, park)
	f.class = append(f.class, class.String())
	f.pause = append(f.pause, r.retryDelay(attempts).Microseconds())
	if park {
		if f.parked == nil {
			f.parked = map[int64]*ParkedError{}
		}
		f.parked[rw.id] = &ParkedError{ID: rw.id, MessageID: effects.Key(rw.msgID), Topic: rw.rec.Topic,
			Attempts: attempts, Class: class, Err: err}
	}
}

// mark records the batch's outcomes in one short transaction: the acked
// rows sent (or deleted), the failed ones with their error, released with
// a pause before their next claim, or parked. It returns the rows it
// parked.
func (r *Relay) mark(ctx context.Context, token int64, sent []int64, refs []string, f *failures) ([]*ParkedError, error) {
	var (
		parked   []*ParkedError
		repeated int64
	)
	err := inTx(ctx, r.db, func(tx pgx.Tx) error {
		if len(sent) > 0 {
			var (
				tag pgconn.CommandTag
				err error
			)
			if r.deleteSent {
				tag, err = tx.Exec(ctx, sqlDeleteSent, sent)
			} else {
				tag, err = tx.Exec(ctx, sqlMarkSent, sent, refs)
			}
			if err != nil {
				return fmt.Errorf("marking %d rows sent (they will be published again): %w", len(sent), err)
			}
			repeated = int64(len(sent)) - tag.RowsAffected()
		}
		if len(f.ids) == 0 {
			return nil
		}
		rows, err := tx.Query(ctx, sqlMarkFailed, f.ids, token, f.msgs, f.counted, f.park, f.class, f.pause)
		if err != nil {
			return fmt.Errorf("recording %d failed rows: %w", len(f.ids), err)
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return err
			}
			if p := f.parked[id]; p != nil {
				parked = append(parked, p)
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("recording %d failed rows: %w", len(f.ids), err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.repeated.Add(repeated)
	r.sent.Add(int64(len(sent)) - repeated)
	slices.SortFunc(parked, func(a, b *ParkedError) int { return int(min(max(a.ID-b.ID, -1), 1)) })
	return parked, nil
}

// retryDelay is how long a row that failed attempts times waits before it
// can be claimed again: the poll interval, doubling per attempt, up to a
// minute, jittered.
func (r *Relay) retryDelay(attempts int) time.Duration {
	return retry.Backoff{Min: r.interval, Max: max(r.interval, maxRetryDelay)}.Delay(attempts + 1)
}

// Run relays batches until ctx is done, then returns nil. It runs the next
// batch at once after one that claimed a full batch, and waits the poll
// interval after a smaller batch or an error. It reports each parked row
// and each failed batch to the observer ([WithObserver]), or by default
// logs them (rate-limited, [WithLogger]), and goes on; a configuration error (the broker refuses
// the client itself) is reported and returned: fix it and run again.
func (r *Relay) Run(ctx context.Context) error {
	for {
		res := r.relayBatch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		r.report(ctx, res)
		if res.config != nil {
			return res.config
		}
		if res.err == nil && res.claimed == r.batch {
			continue
		}
		if retry.Sleep(ctx, r.interval) != nil {
			return nil
		}
	}
}

// report hands a batch's parked rows and errors to the observer, or logs
// them.
func (r *Relay) report(ctx context.Context, res batchResult) {
	const component = "outbox.Relay"
	for _, p := range res.parked {
		r.rep.Report(ctx, effects.Event{Kind: effects.EventDeadLettered, Component: component, Key: p.MessageID,
			Attempt: p.Attempts, Err: p},
			slog.LevelWarn, "outbox: row parked; it is not published until retried",
			slog.Int64("row", p.ID), slog.String("topic", p.Topic),
			slog.Int("attempts", p.Attempts), slog.String("class", p.Class.String()))
	}
	for _, err := range []error{res.err, res.config} {
		if err != nil {
			r.rep.Report(ctx, effects.Event{Kind: effects.EventFailed, Component: component, Err: err},
				slog.LevelWarn, "outbox: relay batch failed")
		}
	}
}

// kind is what the relay does with a failed row.
type kind int

const (
	kindRetryable kind = iota // retry later; counts unless an outage
	kindRefused               // refused for good: park
	kindConfig                // the client may not produce: stop Run
)

// classify tells a produce error's kind.
func classify(err error) kind {
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge),
		errors.Is(err, kerr.InvalidRecord), errors.Is(err, kerr.CorruptMessage),
		errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.UnknownTopicOrPartition),
		errors.Is(err, kerr.UnknownTopicID), errors.Is(err, kerr.InvalidTopicException),
		errors.Is(err, kerr.PolicyViolation):
		return kindRefused
	case errors.Is(err, kerr.ClusterAuthorizationFailed), errors.Is(err, kerr.SaslAuthenticationFailed),
		errors.Is(err, kerr.IllegalSaslState), errors.Is(err, kerr.UnsupportedSaslMechanism),
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed), errors.Is(err, kgo.ErrClientClosed):
		return kindConfig
	}
	return kindRetryable
}

func isContext(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}
