package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
)

// KeyHeader is the record header that carries a record's identity for
// downstream dedup: the effect key for records of a [Producer], the
// message id for records relayed from the outbox. [Source] reads a
// delivery's ID from it.
const KeyHeader = "effectively-key"

// Message is the input of a [Producer]: one record's payload.
type Message struct {
	// Key is the record key. Nil means the effect key, so that every
	// attempt for one key goes to the same partition (franz-go's default
	// partitioner hashes the record key).
	Key []byte
	// Value is the record value.
	Value []byte
	// Headers are extra record headers. A header named [KeyHeader] is
	// replaced by the effect key.
	Headers []kgo.RecordHeader
}

// Producer is an [effects.Effect] that produces one record per key to one
// topic with franz-go's idempotent producer.
//
// Every record carries the effect key in the [KeyHeader] header (and as
// its record key unless [Message.Key] is set), and [effects.Result.Ref] is
// "partition/offset".
//
// Kafka's idempotence dedups only the client's own retries within one
// producer session and partition: a lost produce reply retried by franz-go
// does not duplicate, but a second Apply with the same key, or a restarted
// process, produces a second record. So a Producer without a journal is
// AtLeastOnce with the window [effects.AnyRedelivery]. With a journal
// ([WithJournal]) it claims the key before producing and records the
// partition/offset after the broker's ack, so a redelivery is replayed
// without producing; its window narrows to [effects.AfterUnknownOutcome]:
// after the broker's ack, before the journal records it. Consumers of the
// topic dedup on the header.
//
// A Producer does not own its client: close the client yourself after the
// last Apply returned.
type Producer struct {
	client   *kgo.Client
	topic    string
	journal  effects.Journal
	lease    time.Duration
	finish   time.Duration
	contract effects.Contract
}

var _ effects.Effect[Message] = (*Producer)(nil)

// ProducerOption configures a [Producer].
type ProducerOption func(*Producer)

// WithJournal makes the producer record each success in j (for example
// postgres.NewJournal) and replay recorded keys without producing again.
// It costs two journal calls per new key (Begin before the produce,
// Complete after the ack) and one per replay, and it makes the producer
// detect a key reused with a different message ([effects.ErrKeyReused]):
// the journal stores a fingerprint of topic, record key, value and headers.
func WithJournal(j effects.Journal) ProducerOption {
	return func(p *Producer) { p.journal = j }
}

// WithLease sets how long one attempt holds a key in the journal (default
// 30 s). While the lease runs, other attempts with the key get
// [effects.ErrInFlight]; after it expires, a key whose attempt ended with
// an unknown outcome is produced again. Keep it longer than a produce
// takes, or a slow attempt and a retry both produce. Without a journal it
// does nothing.
func WithLease(d time.Duration) ProducerOption {
	return func(p *Producer) { p.lease = d }
}

// WithJournalTimeout bounds how long the producer keeps trying to record a
// produced record in the journal, or to release a key after a failure
// (default 10 s). These writes run even when the Apply context is done:
// the record is already in Kafka, and recording it is what prevents a
// duplicate.
func WithJournalTimeout(d time.Duration) ProducerOption {
	return func(p *Producer) { p.finish = d }
}

// ErrNotIdempotent is returned by [NewProducer] for a client that is not
// an idempotent, acks=all, non-transactional producer.
var ErrNotIdempotent = errors.New("kafka: client is not an idempotent acks=all producer")

// NewProducer returns a producer of records to topic through client.
//
// client must keep franz-go's defaults for producing: idempotent writes
// (no kgo.DisableIdempotentWrite) and kgo.RequiredAcks(kgo.AllISRAcks()),
// without a kgo.TransactionalID (use [Transform] for transactions).
// NewProducer checks and returns [ErrNotIdempotent] otherwise: with acks=1
// an acked record can be lost in a leader failover, and without
// idempotence every internal retry of a lost reply duplicates.
func NewProducer(client *kgo.Client, topic string, opts ...ProducerOption) (*Producer, error) {
	if client == nil {
		return nil, errors.New("kafka.NewProducer: nil client")
	}
	if topic == "" {
		return nil, errors.New("kafka.NewProducer: empty topic")
	}
	if err := checkIdempotent(client); err != nil {
		return nil, fmt.Errorf("kafka.NewProducer: %w", err)
	}
	p := &Producer{client: client, topic: topic, lease: 30 * time.Second, finish: 10 * time.Second}
	for _, o := range opts {
		o(p)
	}
	if p.lease <= 0 || p.finish <= 0 {
		return nil, errors.New("kafka.NewProducer: lease and journal timeout must be positive")
	}
	p.contract = producerContract(p.journal != nil)
	return p, nil
}

func checkIdempotent(cl *kgo.Client) error {
	if v, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); v {
		return fmt.Errorf("%w: kgo.DisableIdempotentWrite is set", ErrNotIdempotent)
	}
	if acks, ok := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); !ok || acks != kgo.AllISRAcks() {
		return fmt.Errorf("%w: set kgo.RequiredAcks(kgo.AllISRAcks()) (the default)", ErrNotIdempotent)
	}
	if vs := cl.OptValues(kgo.TransactionalID); len(vs) == 2 && vs[1] == true {
		return fmt.Errorf("%w: the client is transactional; records outside a transaction fail (use Transform)", ErrNotIdempotent)
	}
	return nil
}

func producerContract(journaled bool) effects.Contract {
	if journaled {
		return effects.Contract{
			Guarantee: effects.AtLeastOnce,
			Enforcer:  "journal: key claimed before the produce, partition/offset recorded after the broker's ack; Kafka's idempotent producer dedups retries within a session",
			DuplicateWindow: effects.Window{
				Trigger: effects.AfterUnknownOutcome,
				Between: "after the broker's ack, before the journal records it (a crash, a lost journal write, or an attempt abandoned while its record was in flight, retried once the lease expired)",
			},
			DetectsKeyReuse: true,
		}
	}
	return effects.Contract{
		Guarantee: effects.AtLeastOnce,
		Enforcer:  "kafka idempotent producer (acks=all): dedups only retries within one producer session and partition",
		DuplicateWindow: effects.Window{
			Trigger: effects.AnyRedelivery,
			Between: "a restarted producer session, or any redelivery, produces again: Kafka dedups only retries within one producer session and partition",
		},
	}
}

// Contract declares AtLeastOnce: with a journal the window is
// [effects.AfterUnknownOutcome] and key reuse is detected; without one it
// is [effects.AnyRedelivery].
func (p *Producer) Contract() effects.Contract { return p.contract }

// Topic returns the topic the producer writes to.
func (p *Producer) Topic() string { return p.topic }

// Apply produces m under key, or, with a journal, replays the record
// produced earlier for key (Status Replayed, the first Ref).
//
// It validates key before any I/O. Errors are *effects.Error values:
// [effects.ErrAmbiguous] when the record may have been written (the
// context ended while the record was in flight, the broker answered with a
// timeout, the client closed, or the journal could not record a produced
// record); [effects.ErrTransient] for a retryable broker error that wrote
// nothing; the journal's [effects.ErrInFlight] and [effects.ErrKeyReused]
// as they are. Other broker errors (an unknown topic, a record too large,
// an authorization failure) are permanent and wrap the kerr error.
//
// When ctx ends while the record is in flight, Apply returns at once with
// ErrAmbiguous; franz-go keeps the record until the broker answers, and if
// it was written the journal still records it, so the retry replays it.
func (p *Producer) Apply(ctx context.Context, key effects.Key, m Message) (effects.Result, error) {
	const op = "kafka.Producer.Apply"
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	rec := p.record(key, m)
	if p.journal == nil {
		return p.produce(ctx, key, rec, nil)
	}
	r, err := p.journal.Begin(ctx, key, fingerprint(rec), p.lease)
	if err != nil {
		return effects.Result{}, journalErr(op, key, err)
	}
	if r.Done {
		return effects.Result{Status: effects.Replayed, Ref: r.Ref}, nil
	}
	if err := ctx.Err(); err != nil {
		p.release(ctx, key, r.Attempt)
		return effects.Result{}, effects.Transient(op, key, err)
	}
	return p.produce(ctx, key, rec, &journalHook{p: p, ctx: ctx, attempt: r.Attempt})
}

// journalHook records the outcome of a produce that holds a journal lease.
type journalHook struct {
	p       *Producer
	ctx     context.Context
	attempt int // the journal attempt holding the lease, for Release
}

// produce produces rec and waits for its outcome or for ctx. With a hook,
// a success is recorded in the journal (also when it arrives after Apply
// gave up waiting), and a failure that wrote nothing releases the lease.
func (p *Producer) produce(ctx context.Context, key effects.Key, rec *kgo.Record, j *journalHook) (effects.Result, error) {
	const op = "kafka.Producer.Apply"
	w := &waiter{done: make(chan struct{})}
	p.client.Produce(ctx, rec, func(r *kgo.Record, err error) {
		if w.deliver(r, err) {
			return
		}
		// Apply stopped waiting: record a late success so the retry
		// replays it instead of producing again. The promise runs on
		// franz-go's promise goroutine; this blocks it for at most the
		// journal timeout, and only on this rare path.
		if j != nil && err == nil {
			_ = p.complete(j.ctx, key, ref(r))
		}
	})
	r, err, ok := w.wait(ctx)
	if !ok {
		// The record is still in the client: it may be written yet.
		return effects.Result{}, effects.Ambiguous(op, key, fmt.Errorf("context done while the record was in flight: %w", ctx.Err()))
	}
	if err != nil {
		cerr := classify(op, key, err)
		if j != nil && !errors.Is(cerr, effects.ErrAmbiguous) {
			p.release(j.ctx, key, j.attempt)
		}
		return effects.Result{}, cerr
	}
	res := effects.Result{Status: effects.Applied, Ref: ref(r)}
	if j != nil {
		if err := p.complete(j.ctx, key, res.Ref); err != nil {
			return effects.Result{}, effects.Ambiguous(op, key, fmt.Errorf("record written at %s/%s but the journal did not record it (a retry after the lease produces again): %w", p.topic, res.Ref, err))
		}
	}
	return res, nil
}

// complete records ref for key, retrying for up to the journal timeout even
// if ctx is done.
func (p *Producer) complete(ctx context.Context, key effects.Key, ref string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.finish)
	defer cancel()
	backoff := 10 * time.Millisecond
	for {
		err := p.journal.Complete(ctx, key, ref)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// release gives up the lease after a failure that wrote nothing. If it
// fails, the lease simply expires.
func (p *Producer) release(ctx context.Context, key effects.Key, attempt int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.finish)
	defer cancel()
	_ = p.journal.Release(ctx, key, attempt)
}

func (p *Producer) record(key effects.Key, m Message) *kgo.Record {
	rec := &kgo.Record{Topic: p.topic, Key: m.Key, Value: m.Value}
	if rec.Key == nil {
		rec.Key = []byte(key)
	}
	rec.Headers = make([]kgo.RecordHeader, 0, len(m.Headers)+1)
	for _, h := range m.Headers {
		if h.Key != KeyHeader {
			rec.Headers = append(rec.Headers, h)
		}
	}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: KeyHeader, Value: []byte(key)})
	return rec
}

// fingerprint identifies a record's payload: topic, key, value and headers.
func fingerprint(r *kgo.Record) []byte {
	fields := [][]byte{[]byte(r.Topic), r.Key, r.Value}
	for _, h := range r.Headers {
		fields = append(fields, []byte(h.Key), h.Value)
	}
	return effects.Fingerprint(fields...)
}

func ref(r *kgo.Record) string {
	return strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10)
}

// journalErr passes the journal's classified errors through and marks an
// unclassified one transient: nothing was produced yet.
func journalErr(op string, key effects.Key, err error) error {
	for _, kind := range []error{effects.ErrInvalidKey, effects.ErrKeyReused, effects.ErrInFlight, effects.ErrAmbiguous, effects.ErrTransient} {
		if errors.Is(err, kind) {
			return err
		}
	}
	return effects.Transient(op, key, fmt.Errorf("journal: %w", err))
}

// waiter hands a produce outcome from the promise to Apply, or tells the
// promise that Apply stopped waiting.
type waiter struct {
	mu        sync.Mutex
	done      chan struct{}
	rec       *kgo.Record
	err       error
	abandoned bool
}

// deliver stores the outcome and reports whether Apply will read it.
func (w *waiter) deliver(r *kgo.Record, err error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.abandoned {
		return false
	}
	w.rec, w.err = r, err
	close(w.done)
	return true
}

// wait returns the outcome, or ok=false if ctx ended first.
func (w *waiter) wait(ctx context.Context) (*kgo.Record, error, bool) {
	select {
	case <-w.done:
		return w.rec, w.err, true
	case <-ctx.Done():
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.done:
		return w.rec, w.err, true
	default:
		w.abandoned = true
		return nil, nil, false
	}
}
