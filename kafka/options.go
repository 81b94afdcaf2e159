package kafka

import (
	"io"
	"log/slog"
	"time"

	"effectively.dev/effects"
	"effectively.dev/internal/ratelog"
)

// SourceOption configures a [Source]; see [NewSource]. Options only
// record their value; NewSource validates them. A nil SourceOption is
// ignored.
type SourceOption interface{ applySource(*sourceConfig) }

// ShareOption configures a [ShareSource]; see [NewShareSource]. Options
// only record their value; NewShareSource validates them. A nil
// ShareOption is ignored.
type ShareOption interface{ applyShare(*shareConfig) }

// ProducerOption configures a [Producer]; see [NewProducer]. A nil
// ProducerOption is ignored.
type ProducerOption interface{ applyProducer(*producerConfig) }

// ConsumerOption configures both sources: it is a [SourceOption] and a
// [ShareOption].
type ConsumerOption interface {
	SourceOption
	ShareOption
}

// Option configures every constructor of this package that runs on its
// own or reports what it cannot return: it is a [SourceOption], a
// [ShareOption] and a [ProducerOption].
type Option interface {
	SourceOption
	ShareOption
	ProducerOption
}

// common is what an [Option] sets, in every config.
type common struct {
	observer  effects.Observer
	logger    *slog.Logger
	loggerSet bool
}

// check returns a *effects.ConfigError for an invalid common option.
func (c *common) check(op string) error {
	if c.loggerSet && c.logger == nil {
		return effects.ConfigErrorf(op, "WithLogger", "nil logger")
	}
	return nil
}

// reporter is where a component reports what it handles on its own.
func (c *common) reporter() ratelog.Reporter {
	return ratelog.Reporter{Observer: c.observer, Limiter: ratelog.Limiter{Logger: c.logger}}
}

// consumerCommon is what a [ConsumerOption] sets, in both sources'
// configs.
type consumerCommon struct {
	idHeader string
	maxPoll  int
}

// checkConsumer returns a *effects.ConfigError for an invalid option
// that both sources take.
func checkConsumer(op string, c *common, cc *consumerCommon) error {
	switch {
	case c.loggerSet && c.logger == nil:
		return effects.ConfigErrorf(op, "WithLogger", "nil logger")
	case cc.idHeader == "":
		return effects.ConfigErrorf(op, "WithIDHeader", "empty header name")
	case cc.maxPoll < 1:
		return effects.ConfigErrorf(op, "WithMaxPoll", "%d records; need at least 1", cc.maxPoll)
	}
	return nil
}

type allOpt func(*common)

func (f allOpt) applySource(c *sourceConfig)     { f(&c.common) }
func (f allOpt) applyShare(c *shareConfig)       { f(&c.common) }
func (f allOpt) applyProducer(c *producerConfig) { f(&c.common) }

type consumerOpt func(*consumerCommon)

func (f consumerOpt) applySource(c *sourceConfig) { f(&c.consumer) }
func (f consumerOpt) applyShare(c *shareConfig)   { f(&c.consumer) }

type sourceOpt func(*sourceConfig)

func (f sourceOpt) applySource(c *sourceConfig) { f(c) }

type shareOpt func(*shareConfig)

func (f shareOpt) applyShare(c *shareConfig) { f(c) }

type producerOpt func(*producerConfig)

func (f producerOpt) applyProducer(c *producerConfig) { f(c) }

// ReplayOption configures [Replay]. A nil ReplayOption is ignored.
type ReplayOption interface{ applyReplay(*replayConfig) }

// RedriveOption configures [Redrive]; see [Redrive]. A nil RedriveOption
// is ignored.
type RedriveOption interface{ applyRedrive(*redriveConfig) }

// ReadOption configures both readers of a topic's range: it is a
// [ReplayOption] and a [RedriveOption].
type ReadOption interface {
	ReplayOption
	RedriveOption
}

// IDOption configures where a delivery's id is read from: it is a
// [SourceOption], a [ShareOption] and a [RedriveOption].
type IDOption interface {
	ConsumerOption
	RedriveOption
}

// TransformOption configures [Transform]. A nil TransformOption is
// ignored.
type TransformOption interface{ applyTransform(*transformConfig) }

// DeadLetterOption configures [DeadLetterTopic]. A nil DeadLetterOption
// is ignored.
type DeadLetterOption interface{ applyDeadLetter(*deadLetterOpts) }

type replayOpt func(*replayConfig)

func (f replayOpt) applyReplay(c *replayConfig) { f(c) }

type redriveOpt func(*redriveConfig)

func (f redriveOpt) applyRedrive(c *redriveConfig) { f(c) }

// readOpt sets the same field in a replay's and a redrive's config.
type readOpt struct {
	replay  func(*replayConfig)
	redrive func(*redriveConfig)
}

func (o readOpt) applyReplay(c *replayConfig)   { o.replay(c) }
func (o readOpt) applyRedrive(c *redriveConfig) { o.redrive(c) }

type idOpt string

func (n idOpt) applySource(c *sourceConfig)   { c.consumer.idHeader = string(n) }
func (n idOpt) applyShare(c *shareConfig)     { c.consumer.idHeader = string(n) }
func (n idOpt) applyRedrive(c *redriveConfig) { c.idHeader = string(n) }

type transformOpt func(*transformConfig)

func (f transformOpt) applyTransform(c *transformConfig) { f(c) }

type deadLetterOpt func(*deadLetterOpts)

func (f deadLetterOpt) applyDeadLetter(c *deadLetterOpts) { f(c) }

// WithObserver reports what the component handles without returning it
// to o, as events whose Component is "kafka.Source", "kafka.ShareSource"
// or "journal":
//
//   - the sources: [effects.EventFailed] for each error they retry on
//     their own (a fetch error franz-go retries, a failed group commit,
//     acknowledgements or lock renewals the broker refused) and for the
//     configuration error a [Source]'s start-up check finds;
//   - a [Producer] with a journal: the journal's events (see
//     journal.WithObserver): a record the journal did not record, a lease
//     it could not release, a lease another attempt holds.
//
// When o is also an [effects.Propagator] (package effectively.dev/observe's
// Observer is), a Producer writes the trace context of the Apply's
// context into each record's headers (W3C traceparent and tracestate),
// so a consumer's delivery span continues the producer's trace; headers
// of the Message with the same names are kept. The trace headers are not
// part of the journal's fingerprint: a redelivery in another trace is
// replayed, not refused as a reused key.
//
// Without an observer (or with a nil o), the same failures are logged to
// the logger ([WithLogger]), rate-limited, and no trace headers are
// written. To silence them, pass an observer that does nothing.
func WithObserver(o effects.Observer) Option {
	return allOpt(func(c *common) { c.observer = o })
}

// WithLogger sets the logger the component writes its failures to when
// it has no observer ([WithObserver]); the default is slog.Default() at
// the time of each line. Lines are rate-limited (a burst of 10, then
// about one a second, with a count of those held back), at level Warn,
// and Error for a record a Producer's journal did not record. l must not
// be nil.
func WithLogger(l *slog.Logger) Option {
	return allOpt(func(c *common) { c.logger, c.loggerSet = l, true })
}

// WithIDHeader names the header Delivery.ID is read from, by a [Source]
// or a [ShareSource] (default [KeyHeader]). Records without it get
// "topic/partition/offset"; records with it empty get an empty ID,
// refused by [effects.NewKey] (see [Source]). Given to [Redrive], it is
// the header its sources read: a dead letter without it (its delivery id
// was the record's topic/partition/offset) gets it, set to its
// [HeaderDLQDeliveryID], so the redriven delivery has the same id, and
// the handler's effects the same keys. name must not be empty.
func WithIDHeader(name string) IDOption { return idOpt(name) }

// WithTimeRange bounds what [Replay] hands over, or [Redrive] moves, by
// record timestamp (of the dead letter, for Redrive): [from, to). A zero
// from or to leaves that side open (for Replay, to [WithOffsetRange]: so
// WithTimeRange(incident, time.Time{}) replays from the incident to the
// end). to must not be before a non-zero from.
func WithTimeRange(from, to time.Time) ReadOption {
	return readOpt{
		replay:  func(c *replayConfig) { c.from, c.to = from, to },
		redrive: func(c *redriveConfig) { c.from, c.to = from, to },
	}
}

// WithLimiter paces the reading with lim: [Replay] waits on it before
// each record joins a batch for the handler, [Redrive] before each dead
// letter it moves. rate.NewLimiter(limit, burst) hands over at most limit
// records a second, burst of them at once; one *rate.Limiter can be shared
// by several replays, or with live traffic. Without this option there is
// no limit. lim must not be nil.
func WithLimiter(lim Limiter) ReadOption {
	return readOpt{
		replay:  func(c *replayConfig) { c.limiter, c.limiterSet = lim, true },
		redrive: func(c *redriveConfig) { c.limiter, c.limSet = lim, true },
	}
}

// WithProgress sends a progress bar of the offsets read to w, redrawn in
// place at most ten times a second. By default, or when w is nil, the bar
// goes to standard error when it is a terminal, and nowhere otherwise;
// io.Discard turns it off.
func WithProgress(w io.Writer) ReadOption {
	return readOpt{
		replay:  func(c *replayConfig) { c.progress = w },
		redrive: func(c *redriveConfig) { c.progress = w },
	}
}

// WithMaxPoll bounds how many records one poll takes. For a [Source], one
// poll of its client (default 500). For a [ShareSource], one fetch of each
// member (kgo.ShareMaxRecords, strict; default 32), and a member polls only
// while fewer than n records wait to be handed out: a larger n takes more
// records per round trip, a smaller one leaves fewer records waiting behind
// a stuck one. n must be at least 1.
func WithMaxPoll(n int) ConsumerOption {
	return consumerOpt(func(c *consumerCommon) { c.maxPoll = n })
}
