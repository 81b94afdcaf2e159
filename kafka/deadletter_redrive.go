package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"effectively.dev/effects"
	"effectively.dev/kafka/internal/produce"
)

// RedriveOption configures [Redrive]: which dead letters move, where, and
// how fast. Options only record their value; Redrive validates them before
// any I/O and ignores nil options.
type RedriveOption func(*redriveConfig)

type redriveConfig struct {
	from, to time.Time
	classes  []string
	ids      map[string]bool
	limit    int
	topic    string
	idHeader string
	dry      bool
	dryRun   io.Writer
	rate     rate.Limit
	burst    int
	progress io.Writer
	limitSet bool
	idsSet   bool
}

// WithRedriveTimeRange moves only dead letters written in [from, to) (the
// dead-letter record's timestamp); a zero time leaves that side open.
func WithRedriveTimeRange(from, to time.Time) RedriveOption {
	return func(c *redriveConfig) { c.from, c.to = from, to }
}

// WithRedriveClasses moves only dead letters whose [HeaderDLQClass] is one
// of classes ("poison", "permanent", "retryable", "unclassified").
func WithRedriveClasses(classes ...string) RedriveOption {
	return func(c *redriveConfig) { c.classes = classes }
}

// WithRedriveIDs moves only dead letters whose [HeaderDLQDeliveryID] is
// one of ids.
func WithRedriveIDs(ids ...string) RedriveOption {
	return func(c *redriveConfig) {
		c.idsSet = true
		c.ids = make(map[string]bool, len(ids))
		for _, id := range ids {
			c.ids[id] = true
		}
	}
}

// WithRedriveLimit stops after n dead letters moved (or, dry, selected).
// n must be at least 1.
func WithRedriveLimit(n int) RedriveOption {
	return func(c *redriveConfig) { c.limit, c.limitSet = n, true }
}

// WithRedriveTopic produces every moved record to topic instead of its
// [HeaderDLQTopic]: for dead letters of deliveries that did not come from
// Kafka, or to move them somewhere else.
func WithRedriveTopic(topic string) RedriveOption {
	return func(c *redriveConfig) { c.topic = topic }
}

// WithRedriveIDHeader names the header the source reads Delivery.ID from
// (default [KeyHeader]; see [WithIDHeader]). A dead letter without that
// header (its delivery id was the record's topic/partition/offset) gets it,
// set to its [HeaderDLQDeliveryID], so the redriven delivery has the same
// id, and the handler's effects the same keys. name must not be empty.
func WithRedriveIDHeader(name string) RedriveOption {
	return func(c *redriveConfig) { c.idHeader = name }
}

// WithRedriveDryRun moves nothing: Redrive writes one line per selected
// dead letter to w (where it is, its delivery id, class, destination and
// error; nothing for a nil w) and counts it in RedriveStats.Moved.
func WithRedriveDryRun(w io.Writer) RedriveOption {
	return func(c *redriveConfig) {
		c.dry, c.dryRun = true, w
		if w == nil {
			c.dryRun = io.Discard
		}
	}
}

// WithRedriveRate moves at most limit records a second, in bursts of up
// to burst (0: 1); default no limit. limit must not be negative.
func WithRedriveRate(limit rate.Limit, burst int) RedriveOption {
	return func(c *redriveConfig) { c.rate, c.burst = limit, burst }
}

// WithRedriveProgress draws a progress bar of the dead-letter topic's
// offsets read to w; by default to standard error when it is a terminal,
// and nowhere otherwise; io.Discard turns it off.
func WithRedriveProgress(w io.Writer) RedriveOption {
	return func(c *redriveConfig) { c.progress = w }
}

// RedriveStats says what [Redrive] did.
type RedriveStats struct {
	// Read is how many dead letters it read; Moved how many it produced to
	// their source topic (or would have, dry); Skipped how many the
	// selection left out; Repeated how many were skipped as a delivery id
	// already moved in this run (a dead letter written twice).
	Read, Moved, Skipped, Repeated int
}

// errRedriveDone stops the replay once the limit is reached.
var errRedriveDone = errors.New("redrive limit reached")

// Redrive reads the dead-letter topic dlq (written by [DeadLetterTopic])
// and produces the selected dead letters back to their source topic
// ([HeaderDLQTopic]), through client, an idempotent producer as for
// [NewProducer] (any client for [WithRedriveDryRun]). Each moved record
// has the dead letter's key, body and headers, without the headers
// [DeadLetterTopic] added (those starting with [DeadLetterHeaderPrefix]),
// and keeps the delivery id header ([WithRedriveIDHeader]): a consumer of
// the source topic gets a delivery with the same ID, so the effects its
// handler completed before the delivery was dead-lettered replay, and only
// the rest apply. Deploy the fix first: a delivery that fails again is
// dead-lettered again.
//
// It reads the topic from its start to its end when Redrive starts (see
// [Replay]), waits for each record's ack before the next, and moves each
// delivery id once per run (dead letters with an empty id each time). It is at least once, like the dead letters:
// a Redrive that fails or is run twice moves records again, and the
// consumers' effects dedup them. The dead letters stay in dlq.
//
// A dead letter without [HeaderDLQTopic] and no [WithRedriveTopic] is an
// error that stops the run (with the stats up to it), as is a failed
// produce.
func Redrive(ctx context.Context, client *kgo.Client, dlq string, opts ...RedriveOption) (RedriveStats, error) {
	const op = "kafka.Redrive"
	var stats RedriveStats
	cfg := redriveConfig{idHeader: KeyHeader}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	bad := func(option, format string, args ...any) (RedriveStats, error) {
		return stats, &effects.ConfigError{Op: op, Option: option, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case client == nil:
		return bad("client", "nil")
	case dlq == "":
		return bad("dlq", "empty topic")
	case cfg.limitSet && cfg.limit < 1:
		return bad("WithRedriveLimit", "%d records; need at least 1", cfg.limit)
	case cfg.idHeader == "":
		return bad("WithRedriveIDHeader", "empty name")
	case cfg.rate < 0:
		return bad("WithRedriveRate", "negative limit %v; 0 means no limit", cfg.rate)
	case cfg.burst < 0:
		return bad("WithRedriveRate", "negative burst %d", cfg.burst)
	case cfg.idsSet && len(cfg.ids) == 0:
		return bad("WithRedriveIDs", "no ids; leave the option out to move every id")
	}
	if !cfg.dry {
		if err := produce.CheckClient(client); err != nil {
			return stats, fmt.Errorf("%s: %w", op, err)
		}
	}
	lim := newLimiter(cfg.rate, cfg.burst)
	sync := produce.NewSyncer(client)
	seen := map[string]bool{}
	_, err := Replay(ctx, client, dlq, func(ctx context.Context, dl *kgo.Record) error {
		stats.Read++
		id, _ := headerValue(dl, HeaderDLQDeliveryID)
		class, _ := headerValue(dl, HeaderDLQClass)
		if !cfg.selects(dl, id, class) {
			stats.Skipped++
			return nil
		}
		if id != "" && seen[id] { // an empty id (refused by effects.NewKey) names no delivery
			stats.Repeated++
			return nil
		}
		rec, err := cfg.redriven(dl, id)
		if err != nil {
			return err
		}
		if cfg.dry {
			reason, _ := headerValue(dl, HeaderDLQError)
			fmt.Fprintf(cfg.dryRun, "%s/%d/%d delivery %q class %s -> %s: %s\n",
				dl.Topic, dl.Partition, dl.Offset, id, class, rec.Topic, reason)
		} else {
			if err := lim.Wait(ctx); err != nil {
				return err
			}
			if err := sync.Produce(ctx, rec).FirstErr(); err != nil {
				return fmt.Errorf("producing dead letter %d/%d (delivery %q) to %s: %w", dl.Partition, dl.Offset, id, rec.Topic, err)
			}
		}
		seen[id] = true
		stats.Moved++
		if cfg.limitSet && stats.Moved >= cfg.limit {
			return errRedriveDone
		}
		return nil
	}, WithReplayTimeRange(cfg.from, cfg.to), WithReplayProgress(cfg.progress))
	if err != nil && !errors.Is(err, errRedriveDone) {
		return stats, fmt.Errorf("%s %s: %w", op, dlq, err)
	}
	return stats, nil
}

// selects reports whether the selection takes dead letter dl.
func (c *redriveConfig) selects(dl *kgo.Record, id, class string) bool {
	if len(c.classes) > 0 && !slices.Contains(c.classes, class) {
		return false
	}
	if c.idsSet && !c.ids[id] {
		return false
	}
	return true
}

// redriven builds the record that moves dl back to its source topic.
func (c *redriveConfig) redriven(dl *kgo.Record, id string) (*kgo.Record, error) {
	topic := c.topic
	if topic == "" {
		topic, _ = headerValue(dl, HeaderDLQTopic)
	}
	if topic == "" {
		return nil, fmt.Errorf("dead letter %d/%d (delivery %q) has no %s header; name the topic with WithRedriveTopic",
			dl.Partition, dl.Offset, id, HeaderDLQTopic)
	}
	rec := &kgo.Record{Topic: topic, Key: dl.Key, Value: dl.Value}
	hasID := false
	for _, h := range dl.Headers {
		if strings.HasPrefix(h.Key, DeadLetterHeaderPrefix) {
			continue
		}
		hasID = hasID || h.Key == c.idHeader
		rec.Headers = append(rec.Headers, h)
	}
	if !hasID && id != "" {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: c.idHeader, Value: []byte(id)})
	}
	return rec, nil
}

// headerValue returns the value of r's first header named name, and
// whether it has one.
func headerValue(r *kgo.Record, name string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}
