package kafka

import (
	"context"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/kafka/internal/produce"
)

// KeyHeader is the record header that carries a record's identity for
// downstream dedup: the effect key for records of a [Producer], the
// message id for records relayed from the outbox (package
// effectively.dev/kafka/outbox). [Source] reads a delivery's ID from it.
const KeyHeader = produce.KeyHeader

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
// An Apply never waits for the client's linger (kgo.ProducerLinger,
// 10 ms by default): it waits for its own record only, as ProduceSync
// does, so a default client costs one produce round trip per Apply.
//
// A Producer does not own its client: close the client yourself after the
// last Apply returned.
type Producer struct {
	client   *kgo.Client
	sync     *produce.Syncer
	topic    string
	j        *journal.Journaled
	observer effects.Observer // for trace headers
	contract effects.Contract
}

var _ effects.Effect[Message] = (*Producer)(nil)

type producerConfig struct {
	common
	journal journal.Journal
	jopts   []journal.Option
}

// WithJournal makes the producer record each success in j (for example
// postgres.NewJournal) and replay recorded keys without producing again;
// opts set the journal's lease, record timeout, observer and logger
// ([journal.WithLease], [journal.WithRecordTimeout], ...). It costs two
// journal calls per new key (Begin before the produce, Complete after the
// ack) and one per replay, and it makes the producer detect a key reused
// with a different message ([effects.ErrKeyReused]): the journal stores a
// fingerprint of topic, record key, value and headers. An Apply stops
// waiting for its record at nine tenths of the lease
// ([effects.ErrAmbiguous]; a record acked later is still recorded). The
// journal runs [journal.Journaled]'s protocol and policy.
func WithJournal(j journal.Journal, opts ...journal.Option) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.journal, c.jopts = j, opts })
}

// ErrNotIdempotent is returned by [NewProducer] for a client that is not
// an idempotent, acks=all, non-transactional producer.
var ErrNotIdempotent = produce.ErrNotIdempotent

// NewProducer returns a producer of records to topic through client.
//
// client must keep franz-go's defaults for producing: idempotent writes
// (no kgo.DisableIdempotentWrite) and kgo.RequiredAcks(kgo.AllISRAcks()),
// without a kgo.TransactionalID (use [Transform] for transactions).
// NewProducer checks and returns [ErrNotIdempotent] otherwise: with acks=1
// an acked record can be lost in a leader failover, and without
// idempotence every internal retry of a lost reply duplicates. A nil
// client, an empty topic or an invalid option is a *[effects.ConfigError].
func NewProducer(client *kgo.Client, topic string, opts ...ProducerOption) (*Producer, error) {
	const ctor = "kafka.NewProducer"
	if client == nil {
		return nil, effects.ConfigErrorf(ctor, "client", "nil")
	}
	if topic == "" {
		return nil, effects.ConfigErrorf(ctor, "topic", "empty")
	}
	if err := produce.CheckClient(client); err != nil {
		return nil, fmt.Errorf("%s: %w", ctor, err)
	}
	var cfg producerConfig
	for _, o := range opts {
		if o != nil {
			o.applyProducer(&cfg)
		}
	}
	if err := cfg.common.check(ctor); err != nil {
		return nil, err
	}
	jopts := []journal.Option{journal.WithObserver(cfg.observer)}
	if cfg.logger != nil {
		jopts = append(jopts, journal.WithLogger(cfg.logger))
	}
	jopts = append(append(jopts, cfg.jopts...), journal.WithNotApplied(notApplied))
	j, err := journal.NewJournaled("kafka.Producer.Apply", cfg.journal, jopts...)
	if err != nil {
		return nil, err
	}
	return &Producer{
		client:   client,
		sync:     produce.NewSyncer(client),
		topic:    topic,
		j:        j,
		observer: cfg.observer,
		contract: producerContract(cfg.journal != nil),
	}, nil
}

func producerContract(journaled bool) effects.Contract {
	if journaled {
		return effects.Contract{
			Guarantee: effects.AtLeastOnce,
			Enforcer:  "journal: key claimed before the produce, partition/offset recorded after the broker's ack; Kafka's idempotent producer dedups retries within a session",
			DuplicateWindow: effects.Window{
				Trigger: effects.AfterUnknownOutcome,
				Between: "after the broker's ack, before the journal records it (a crash, a journal write that did not commit, or an attempt abandoned while its record was in flight, retried once the lease expired)",
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
// It validates key before any I/O. Every error is in one class of
// [effects.ClassOf] and wraps the kerr or kgo error underneath:
// [effects.ErrAmbiguous] when the record may have been written (the
// context ended while the record was in flight, the broker answered with a
// timeout, the client closed); [effects.ErrTransient] for a retryable
// broker error that wrote nothing, or a journal failure before the
// produce; the journal's [effects.ErrInFlight] and [effects.ErrKeyReused];
// a configuration error (errors.Is [effects.ErrInvalidConfig], a
// *[effects.ConfigError] naming the topic or the credentials) for a topic
// the cluster does not have, once franz-go gave up waiting for it
// (kgo.UnknownTopicRetries), and for a refused authorization or
// authentication; [effects.ErrRefused] for the broker's other refusals
// (MESSAGE_TOO_LARGE, INVALID_RECORD, a policy violation), which the same
// record gets again. A record the broker acked but the journal could not
// record is still Applied: the failure is reported ([WithObserver]) or
// logged ([WithLogger]).
//
// When ctx ends while the record is in flight, Apply returns at once with
// ErrAmbiguous; franz-go keeps the record until the broker answers, and if
// it was written the journal still records it, so the retry replays it.
func (p *Producer) Apply(ctx context.Context, key effects.Key, m Message) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	rec := produce.Record(key, p.topic, m.Key, m.Value, m.Headers)
	var fp []byte
	if p.j.Journal() != nil {
		fp = produce.Fingerprint(rec)
	}
	// After the fingerprint: a redelivery runs in another trace.
	rec.Headers = produce.TraceHeaders(ctx, p.observer, rec.Headers)
	return p.j.Apply(ctx, key, fp, func(ctx context.Context, a *journal.Attempt) (effects.Result, error) {
		return p.produce(ctx, key, rec, a)
	})
}

// notApplied is this adapter's part of the journal's classification:
// franz-go fails an idempotent record only when it is safe for its
// sequence numbers, so every failure classify does not call ambiguous
// (a retryable broker error, an unknown topic, a record too large) wrote
// nothing.
func notApplied(err error) bool { return err != nil }

// produce produces rec and waits for its outcome or for ctx, never for the
// client's linger. A success that arrives after Apply gave up waiting is
// recorded by a.Late.
func (p *Producer) produce(ctx context.Context, key effects.Key, rec *kgo.Record, a *journal.Attempt) (effects.Result, error) {
	const op = "kafka.Producer.Apply"
	w := &waiter{done: make(chan struct{})}
	go func() {
		res := p.sync.Produce(ctx, rec)[0]
		if !w.deliver(res.Record, res.Err) && res.Err == nil {
			// Apply stopped waiting: record the late success so the retry
			// replays it instead of producing again.
			a.Late(produce.Ref(res.Record))
		}
	}()
	r, err, ok := w.wait(ctx)
	if !ok {
		// The record is still in the client: it may be written yet.
		return effects.Result{}, effects.Ambiguous(op, key, fmt.Errorf("context done while the record was in flight: %w", ctx.Err()))
	}
	if err != nil {
		return effects.Result{}, classify(op, p.topic, key, err)
	}
	return effects.Result{Status: effects.Applied, Ref: produce.Ref(r)}, nil
}

// waiter hands a produce outcome to Apply, or tells the producing
// goroutine that Apply stopped waiting.
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
