package kafka

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/internal/ratelog"
	"effectively.dev/kafka/internal/produce"
)

// Headers a dead-letter record carries besides the delivery's own (see
// [DeadLetterTopic]). They all start with [DeadLetterHeaderPrefix], which
// [Redrive] strips.
const (
	// DeadLetterHeaderPrefix starts the name of every header
	// [DeadLetterTopic] adds.
	DeadLetterHeaderPrefix = "effectively-dlq-"
	// HeaderDLQError is the last attempt's error text, cut to 4 KiB
	// (ending in "…" when cut).
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
	// handler derived its effects' keys, when none of the record's own
	// headers carries it (a delivery keyed on its topic/partition/offset,
	// or one that did not come from Kafka). When a header of the record
	// carries the id (the source's [WithIDHeader]), the dead letter keeps
	// that header as it was and names it in [HeaderDLQIDHeader] instead:
	// the id is stored once. [ParseDeadLetter] reads it either way.
	HeaderDLQDeliveryID = DeadLetterHeaderPrefix + "delivery-id"
	// HeaderDLQIDHeader names the record's header that carries the
	// delivery id (see [HeaderDLQDeliveryID]); [Redrive] writes the id back
	// under that name.
	HeaderDLQIDHeader = DeadLetterHeaderPrefix + "id-header"
	// HeaderDLQCut is present only on a dead letter that was cut to fit
	// the dead-letter topic's size limit (see [DeadLetterTopic]): a
	// comma-separated list of what was cut, from "key", "body",
	// "delivery-id", "error", "header:NAME" (a header's value) and
	// "headers-dropped" (headers left out entirely). [Redrive] does not
	// move a cut dead letter: it is for inspection.
	HeaderDLQCut = DeadLetterHeaderPrefix + "cut"
	// HeaderDLQOriginalSize is the size in bytes of the original record
	// (key, body, header names and values) of a cut dead letter, in
	// decimal.
	HeaderDLQOriginalSize = DeadLetterHeaderPrefix + "original-size"
	// HeaderDLQBodySHA256 is the hex SHA-256 of the original body of a cut
	// dead letter, so that the full body can be matched against the
	// source topic or a producer's log.
	HeaderDLQBodySHA256 = DeadLetterHeaderPrefix + "body-sha256"
	// HeaderDLQTime is when the delivery was dead-lettered, RFC 3339 with
	// nanoseconds, UTC.
	HeaderDLQTime = DeadLetterHeaderPrefix + "time"
)

// maxDeadLetterErrorBytes is the most bytes of error text
// [HeaderDLQError] holds; a longer text is cut and ends in "…".
const maxDeadLetterErrorBytes = 4 << 10

// Size limits of a dead letter that would not fit its topic whole (see
// [DeadLetterTopic]).
const (
	// maxCutHeaderBytes is the most bytes a header value (the delivery id
	// included) or the record key keeps in a cut dead letter; a longer
	// value is cut and ends in "…".
	maxCutHeaderBytes = 256
	// minDeadLetterMaxBytes is the smallest size limit
	// [WithMaxBytes] accepts: room for the dead-letter headers
	// of a cut dead letter.
	minDeadLetterMaxBytes = 2 << 10
	// defaultDeadLetterMaxBytes is the size limit [DeadLetterTopic] uses
	// when it cannot read the topic's max.message.bytes (the client may
	// not describe configs): Kafka's default, 1,048,588 bytes.
	defaultDeadLetterMaxBytes = 1048588
)

// deadLetterOverhead is what a record's framing and its batch's header
// take beyond the key, value and headers, with room to spare.
const deadLetterOverhead = 256

type deadLetterOpts struct {
	maxBytes    int
	maxBytesSet bool
}

// WithMaxBytes sets the size limit of the dead-letter topic's records
// instead of reading the topic's max.message.bytes: a dead letter larger
// than n bytes is cut to fit (see [DeadLetterTopic]). n must be at least
// 2048 (room for the dead-letter headers of a cut dead letter).
func WithMaxBytes(n int) DeadLetterOption {
	return deadLetterOpt(func(c *deadLetterOpts) { c.maxBytes, c.maxBytesSet = n, true })
}

// DeadLetterTopic returns a dead-letter hook (for
// effectively.dev/effects/consume.WithDeadLetter) that produces each
// delivery it takes to topic through client, which must be an idempotent
// acks=all producer as for [NewProducer].
//
// The dead-letter record keeps the delivery's body and headers (for a
// delivery of a [Source] or a [ShareSource], the original record's key and
// headers, as they were), and adds the headers [HeaderDLQError],
// [HeaderDLQClass], [HeaderDLQAttempts], [HeaderDLQTopic],
// [HeaderDLQPartition], [HeaderDLQOffset], [HeaderDLQDeliveryID] or
// [HeaderDLQIDHeader], and [HeaderDLQTime].
//
// A dead letter always fits its topic. The size limit is the topic's
// max.message.bytes, read once with a DescribeConfigs request and cached
// (Kafka's default, 1,048,588 bytes, when the client may not read it), or
// [WithMaxBytes]; it is never above the client's
// kgo.ProducerBatchMaxBytes. A record that would not fit is cut: every
// header value and the key to 256 bytes, the body to what room
// is left, and it carries [HeaderDLQCut] (what was cut),
// [HeaderDLQOriginalSize] and [HeaderDLQBodySHA256]. If the broker still
// refuses it as too large (MESSAGE_TOO_LARGE: the limit changed), the hook
// reads the limit again and cuts it to half the size, and so on down to
// 2048 bytes; so a delivery's own size never parks its
// partition.
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
// A nil client, an empty topic, a client that is not an idempotent
// producer, or an invalid option is an error, returned at once.
func DeadLetterTopic(client *kgo.Client, topic string, opts ...DeadLetterOption) (func(ctx context.Context, d effects.Delivery, err error) error, error) {
	const op = "kafka.DeadLetterTopic"
	var cfg deadLetterOpts
	for _, o := range opts {
		if o != nil {
			o.applyDeadLetter(&cfg)
		}
	}
	switch {
	case client == nil:
		return nil, &effects.ConfigError{Op: op, Option: "client", Reason: "nil"}
	case topic == "":
		return nil, &effects.ConfigError{Op: op, Option: "topic", Reason: "empty"}
	case cfg.maxBytesSet && cfg.maxBytes < minDeadLetterMaxBytes:
		return nil, &effects.ConfigError{Op: op, Option: "WithMaxBytes",
			Reason: fmt.Sprintf("%d bytes; need at least %d", cfg.maxBytes, minDeadLetterMaxBytes)}
	}
	if err := produce.CheckClient(client); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	dl := &deadLetterer{client: client, topic: topic, sync: produce.NewSyncer(client), clientMax: clientMaxBytes(client)}
	if cfg.maxBytesSet {
		dl.fixed = cfg.maxBytes
	}
	return dl.hook, nil
}

// deadLetterer is the state behind a [DeadLetterTopic] hook.
type deadLetterer struct {
	client    *kgo.Client
	topic     string
	sync      *produce.Syncer
	fixed     int // WithMaxBytes; 0: read the topic's
	clientMax int // the client's ProducerBatchMaxBytes

	mu     sync.Mutex
	cached int // the topic's max.message.bytes, once read
}

func (dl *deadLetterer) hook(ctx context.Context, d effects.Delivery, cause error) error {
	const op = "kafka.DeadLetterTopic"
	id := ratelog.Bound(d.ID)
	rec := DeadLetterRecord(dl.topic, d, cause, time.Now())
	limit := dl.limit(ctx, false)
	for {
		orig := rec
		if recordBytes(rec) > limit-deadLetterOverhead {
			rec = cutDeadLetter(orig, limit-deadLetterOverhead)
		}
		res := dl.sync.Produce(ctx, rec)
		if len(res) == 0 {
			return fmt.Errorf("%s: delivery %q: no produce result", op, id)
		}
		err := res[0].Err
		switch {
		case err == nil:
			return nil
		case deadLetterRefused(err):
			return fmt.Errorf("%s: delivery %q to topic %q: %w: %w", op, id, dl.topic,
				&effects.ConfigError{Op: op, Option: "topic", Reason: "the broker refuses records for it (missing, or not writable by this client)"}, err)
		case tooLarge(err) && limit > minDeadLetterMaxBytes:
			// The limit changed, or the estimate was short: read it again,
			// and never try the same size twice.
			limit = max(minDeadLetterMaxBytes, min(dl.limit(ctx, true), recordBytes(rec)/2))
			rec = orig
			continue
		}
		return fmt.Errorf("%s: delivery %q to topic %q: %w", op, id, dl.topic, err)
	}
}

// limit returns the size limit of the topic's records: the fixed one, or
// the topic's max.message.bytes (read once, again when fresh), capped by
// the client's own.
func (dl *deadLetterer) limit(ctx context.Context, fresh bool) int {
	if dl.fixed > 0 {
		return min(dl.fixed, dl.clientMax)
	}
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if dl.cached == 0 || fresh {
		if n, err := topicMaxBytes(ctx, dl.client, dl.topic); err == nil {
			dl.cached = n
		} else if dl.cached == 0 {
			return min(defaultDeadLetterMaxBytes, dl.clientMax) // not cached: asked again next time
		}
	}
	return min(dl.cached, dl.clientMax)
}

// topicMaxBytes reads topic's max.message.bytes.
func topicMaxBytes(ctx context.Context, client *kgo.Client, topic string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rcs, err := kadm.NewClient(client).DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return 0, err
	}
	rc, err := rcs.On(topic, nil)
	if err != nil {
		return 0, err
	}
	if rc.Err != nil {
		return 0, rc.Err
	}
	for _, c := range rc.Configs {
		if c.Key == "max.message.bytes" && c.Value != nil {
			n, err := strconv.Atoi(*c.Value)
			if err != nil || n < 1 {
				return 0, fmt.Errorf("max.message.bytes %q", *c.Value)
			}
			return max(n, minDeadLetterMaxBytes), nil
		}
	}
	return 0, errors.New("no max.message.bytes in the topic's configs")
}

// clientMaxBytes is client's kgo.ProducerBatchMaxBytes.
func clientMaxBytes(client *kgo.Client) int {
	if vs := client.OptValues(kgo.ProducerBatchMaxBytes); len(vs) > 0 {
		if n, ok := vs[0].(int32); ok && n > 0 {
			return int(n)
		}
	}
	return 1000012 // franz-go's default
}

func tooLarge(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)
}

// recordBytes is the bytes of r's key, value and headers, with a few bytes
// of framing per header.
func recordBytes(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 8
	}
	return n
}

// cutDeadLetter returns a copy of the dead letter rec cut to budget bytes
// (as recordBytes counts them): key and header values bounded, headers
// dropped from the end if they still do not fit, then the body cut to
// what is left; marked with HeaderDLQCut, HeaderDLQOriginalSize and
// HeaderDLQBodySHA256.
func cutDeadLetter(rec *kgo.Record, budget int) *kgo.Record {
	var cut []string
	out := &kgo.Record{Topic: rec.Topic, Key: rec.Key}
	if len(out.Key) > maxCutHeaderBytes {
		out.Key = []byte(cutText(string(out.Key), maxCutHeaderBytes))
		cut = append(cut, "key")
	}
	var own, dlq []kgo.RecordHeader // the record's own headers, and ours
	for _, h := range rec.Headers {
		limit := maxCutHeaderBytes
		if h.Key == HeaderDLQError {
			limit = 1 << 10
		}
		if len(h.Key) > maxCutHeaderBytes {
			h.Key = cutText(h.Key, maxCutHeaderBytes)
		}
		if len(h.Value) > limit {
			h.Value = []byte(cutText(string(h.Value), limit))
			switch h.Key {
			case HeaderDLQDeliveryID:
				cut = append(cut, "delivery-id")
			case HeaderDLQError:
				cut = append(cut, "error")
			default:
				cut = append(cut, "header:"+cutText(h.Key, 64))
			}
		}
		if strings.HasPrefix(h.Key, DeadLetterHeaderPrefix) {
			dlq = append(dlq, h)
		} else {
			own = append(own, h)
		}
	}
	sum := sha256.Sum256(rec.Value)
	marks := []kgo.RecordHeader{
		{Key: HeaderDLQOriginalSize, Value: []byte(strconv.Itoa(recordBytes(rec)))},
		{Key: HeaderDLQBodySHA256, Value: []byte(hex.EncodeToString(sum[:]))},
	}
	const cutRoom = 512 // the HeaderDLQCut header's value, at most
	fixed := len(out.Key) + recordBytes(&kgo.Record{Headers: append(dlq, marks...)}) + len(HeaderDLQCut) + 8 + cutRoom
	room := budget - fixed
	kept := own[:0:0]
	for _, h := range own {
		n := len(h.Key) + len(h.Value) + 8
		if n > room {
			cut = append(cut, "headers-dropped")
			break
		}
		kept = append(kept, h)
		room -= n
	}
	out.Value = rec.Value
	if len(out.Value) > max(room, 0) {
		out.Value = rec.Value[:max(room, 0)]
		cut = append(cut, "body")
	}
	mark := cutText(strings.Join(cut, ","), cutRoom)
	out.Headers = slices.Concat(kept, dlq, marks, []kgo.RecordHeader{{Key: HeaderDLQCut, Value: []byte(mark)}})
	return out
}

// cutText cuts s to at most n bytes of valid UTF-8 ending in "…".
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n-len("…")], "") + "…"
}

func deadLetterRefused(err error) bool {
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
	idHeader := ""
	for _, h := range rec.Headers {
		if d.ID != "" && string(h.Value) == d.ID {
			idHeader = h.Key
			break
		}
	}
	add := func(k, v string) { rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	text := "<nil>"
	if cause != nil {
		text = cause.Error()
	}
	add(HeaderDLQError, cutText(text, maxDeadLetterErrorBytes))
	add(HeaderDLQClass, ratelog.Class(cause))
	if d.Attempt > 0 {
		add(HeaderDLQAttempts, strconv.Itoa(d.Attempt))
	}
	if ok {
		add(HeaderDLQTopic, src.Topic)
		add(HeaderDLQPartition, strconv.FormatInt(int64(src.Partition), 10))
		add(HeaderDLQOffset, strconv.FormatInt(src.Offset, 10))
	}
	if idHeader != "" {
		add(HeaderDLQIDHeader, idHeader)
	} else {
		add(HeaderDLQDeliveryID, d.ID)
	}
	add(HeaderDLQTime, now.UTC().Format(time.RFC3339Nano))
	return rec
}

// DeadLetter is what a dead-letter record written by [DeadLetterTopic]
// (or built by [DeadLetterRecord]) says about the delivery it holds: its
// headers, parsed by [ParseDeadLetter].
type DeadLetter struct {
	// ID is the delivery id: [HeaderDLQDeliveryID], or the value of the
	// header [HeaderDLQIDHeader] names; "" when the record has neither.
	ID string
	// Class is [HeaderDLQClass]: "poison", "permanent", "retryable",
	// "unclassified" or "configuration".
	Class string
	// Error is the last attempt's error text ([HeaderDLQError]).
	Error string
	// Attempts is [HeaderDLQAttempts]; 0 when the count is unknown.
	Attempts int
	// Topic, Partition and Offset are where the delivery's record was
	// ([HeaderDLQTopic], [HeaderDLQPartition], [HeaderDLQOffset]); Topic
	// is "" for a delivery that did not come from Kafka.
	Topic     string
	Partition int32
	Offset    int64
	// Time is when the delivery was dead-lettered: [HeaderDLQTime], else
	// the record's timestamp.
	Time time.Time
	// Cut says the dead letter was cut to fit its topic ([HeaderDLQCut]):
	// its key, body, headers or id are not whole.
	Cut bool
}

// ParseDeadLetter reads the dead-letter headers of r. It reports false,
// with what it could read, for a record without [HeaderDLQClass]: not a
// dead letter of [DeadLetterTopic].
func ParseDeadLetter(r *kgo.Record) (DeadLetter, bool) {
	get := func(name string) string { v, _ := headerValue(r, name); return v }
	d := DeadLetter{Time: r.Timestamp, Error: get(HeaderDLQError), Topic: get(HeaderDLQTopic)}
	class, ok := headerValue(r, HeaderDLQClass)
	d.Class = class
	d.Attempts, _ = strconv.Atoi(get(HeaderDLQAttempts))
	p, _ := strconv.ParseInt(get(HeaderDLQPartition), 10, 32)
	d.Partition = int32(p)
	d.Offset, _ = strconv.ParseInt(get(HeaderDLQOffset), 10, 64)
	if t, err := time.Parse(time.RFC3339Nano, get(HeaderDLQTime)); err == nil {
		d.Time = t
	}
	_, d.Cut = headerValue(r, HeaderDLQCut)
	if id, has := headerValue(r, HeaderDLQDeliveryID); has {
		d.ID = id
	} else if name, has := headerValue(r, HeaderDLQIDHeader); has {
		d.ID = get(name)
	}
	return d, ok
}
