package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/kafka/internal/produce"
)

// Headers a dead-letter record carries besides the delivery's own (see
// [DeadLetterTopic]). They all start with [DeadLetterHeaderPrefix], which
// [Redrive] strips.
const (
	// DeadLetterHeaderPrefix starts the name of every header
	// [DeadLetterTopic] adds.
	DeadLetterHeaderPrefix = "effectively-dlq-"
	// HeaderDLQError is the last attempt's error text, cut to
	// [MaxDeadLetterErrorBytes].
	HeaderDLQError = DeadLetterHeaderPrefix + "error"
	// HeaderDLQClass is the error's class: "poison" (it matches
	// [effects.ErrPoison]), else [effects.ClassOf]'s name: "permanent",
	// "retryable" or "unclassified" (the consumer gave up after its
	// attempts), "configuration".
	HeaderDLQClass = DeadLetterHeaderPrefix + "class"
	// HeaderDLQAttempts is how many times the delivery was tried before
	// it was dead-lettered ([effects.Delivery].Attempt as the dead-letter
	// hook sees it: the consumer's attempts, including a share group's
	// earlier deliveries), in decimal; absent when the count is unknown
	// (a hook called with Attempt 0).
	HeaderDLQAttempts = DeadLetterHeaderPrefix + "attempts"
	// HeaderDLQTopic, HeaderDLQPartition and HeaderDLQOffset are the
	// record's place in its source topic (decimal partition and offset);
	// absent for a delivery that [Record] does not know.
	HeaderDLQTopic     = DeadLetterHeaderPrefix + "topic"
	HeaderDLQPartition = DeadLetterHeaderPrefix + "partition"
	HeaderDLQOffset    = DeadLetterHeaderPrefix + "offset"
	// HeaderDLQDeliveryID is [effects.Delivery].ID, from which the
	// handler derived its effects' keys.
	HeaderDLQDeliveryID = DeadLetterHeaderPrefix + "delivery-id"
	// HeaderDLQTime is when the delivery was dead-lettered, RFC 3339 with
	// nanoseconds, UTC.
	HeaderDLQTime = DeadLetterHeaderPrefix + "time"
)

// MaxDeadLetterErrorBytes is the most bytes of error text
// [HeaderDLQError] holds; a longer text is cut and ends in "…".
const MaxDeadLetterErrorBytes = 4 << 10

// DeadLetterHook is the function [DeadLetterTopic] returns: the type that
// effectively.dev/effects/consume.WithDeadLetter takes.
type DeadLetterHook = func(ctx context.Context, d effects.Delivery, err error) error

// DeadLetterTopic returns a dead-letter hook (for
// effectively.dev/effects/consume.WithDeadLetter) that produces each
// delivery it takes to topic through client, which must be an idempotent
// acks=all producer as for [NewProducer].
//
// The dead-letter record keeps the delivery's body and headers (for a
// delivery of a [Source] or a [ShareSource], the original record's key and
// headers, as they were), and adds the headers [HeaderDLQError],
// [HeaderDLQClass], [HeaderDLQAttempts], [HeaderDLQTopic],
// [HeaderDLQPartition], [HeaderDLQOffset], [HeaderDLQDeliveryID] and
// [HeaderDLQTime].
//
// The hook returns only once the broker acked the record (or ctx is done,
// or the produce failed): the consumer acks the original delivery only
// after a nil return, so a dead-lettered delivery is stored before its
// ack. A crash between the two dead-letters it again after the
// redelivery: dead letters are at least once, and [Redrive] moves each
// delivery id of a dead-letter topic once per run. A topic that does not
// exist, or that client may not write, is an error that matches
// [effects.ErrInvalidConfig] (a consumer stops on it); any other failure
// is returned as it is, and the consumer keeps the delivery and calls the
// hook again later.
//
// A nil client, an empty topic, or a client that is not an idempotent
// producer is an error, returned at once.
func DeadLetterTopic(client *kgo.Client, topic string) (DeadLetterHook, error) {
	const op = "kafka.DeadLetterTopic"
	switch {
	case client == nil:
		return nil, &effects.ConfigError{Op: op, Option: "client", Reason: "nil"}
	case topic == "":
		return nil, &effects.ConfigError{Op: op, Option: "topic", Reason: "empty"}
	}
	if err := produce.CheckClient(client); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	sync := produce.NewSyncer(client)
	return func(ctx context.Context, d effects.Delivery, cause error) error {
		rec := DeadLetterRecord(topic, d, cause, time.Now())
		res := sync.Produce(ctx, rec)
		if len(res) == 0 {
			return fmt.Errorf("%s: delivery %q: no produce result", op, d.ID)
		}
		if err := res[0].Err; err != nil {
			if deadLetterConfig(err) {
				return fmt.Errorf("%s: delivery %q to topic %q: %w: %w", op, d.ID, topic,
					&effects.ConfigError{Op: op, Option: "topic", Reason: "the broker refuses records for it (missing, or not writable by this client)"}, err)
			}
			return fmt.Errorf("%s: delivery %q to topic %q: %w", op, d.ID, topic, err)
		}
		return nil
	}, nil
}

func deadLetterConfig(err error) bool {
	return errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.TopicAuthorizationFailed) ||
		errors.Is(err, kerr.InvalidTopicException) || errors.Is(err, kerr.ClusterAuthorizationFailed)
}

// DeadLetterRecord builds the record [DeadLetterTopic] produces to topic
// for d, which failed with cause, dead-lettered at now. It is exported for
// hooks that produce through something else (a transaction, an outbox).
func DeadLetterRecord(topic string, d effects.Delivery, cause error, now time.Time) *kgo.Record {
	rec := &kgo.Record{Topic: topic, Value: d.Body}
	src, ok := Record(d)
	if ok {
		rec.Key = src.Key
		rec.Headers = make([]kgo.RecordHeader, 0, len(src.Headers)+8)
		for _, h := range src.Headers {
			if !strings.HasPrefix(h.Key, DeadLetterHeaderPrefix) {
				rec.Headers = append(rec.Headers, h)
			}
		}
	} else {
		names := make([]string, 0, len(d.Headers))
		for k := range d.Headers {
			if !strings.HasPrefix(k, DeadLetterHeaderPrefix) {
				names = append(names, k)
			}
		}
		slices.Sort(names)
		rec.Headers = make([]kgo.RecordHeader, 0, len(names)+8)
		for _, k := range names {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(d.Headers[k])})
		}
	}
	add := func(k, v string) { rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	text := "<nil>"
	if cause != nil {
		text = cause.Error()
	}
	if len(text) > MaxDeadLetterErrorBytes {
		text = strings.ToValidUTF8(text[:MaxDeadLetterErrorBytes-len("…")], "") + "…"
	}
	add(HeaderDLQError, text)
	add(HeaderDLQClass, DeadLetterClass(cause))
	if d.Attempt > 0 {
		add(HeaderDLQAttempts, strconv.Itoa(d.Attempt))
	}
	if ok {
		add(HeaderDLQTopic, src.Topic)
		add(HeaderDLQPartition, strconv.FormatInt(int64(src.Partition), 10))
		add(HeaderDLQOffset, strconv.FormatInt(src.Offset, 10))
	}
	add(HeaderDLQDeliveryID, d.ID)
	add(HeaderDLQTime, now.UTC().Format(time.RFC3339Nano))
	return rec
}

// DeadLetterClass is the [HeaderDLQClass] value for err: "poison" when it
// matches [effects.ErrPoison], otherwise the name of [effects.ClassOf].
func DeadLetterClass(err error) string {
	if errors.Is(err, effects.ErrPoison) {
		return "poison"
	}
	return effects.ClassOf(err).String()
}
