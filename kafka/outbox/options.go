package outbox

import (
	"log/slog"

	"effectively.dev/effects"
)

// The options of this package follow franz-go's kgo.Opt, as those of
// package effectively.dev/kafka do: one option type per constructor, as
// a small interface, and an option both accept ([WithObserver]) satisfies
// both, so a misplaced option fails at compile time.

// RelayOption configures a [Relay]; see [NewRelay]. A nil RelayOption is
// ignored.
type RelayOption interface{ applyRelay(*relayConfig) }

// EnqueueOption configures [Enqueue] and [EnqueueStatement]. A nil
// EnqueueOption is ignored.
type EnqueueOption interface{ applyEnqueue(*enqueueConfig) }

// Option configures both a [Relay] and [Enqueue]: it is a [RelayOption]
// and an [EnqueueOption].
type Option interface {
	RelayOption
	EnqueueOption
}

type relayOpt func(*relayConfig)

func (f relayOpt) applyRelay(c *relayConfig) { f(c) }

type enqueueOpt func(*enqueueConfig)

func (f enqueueOpt) applyEnqueue(c *enqueueConfig) { f(c) }

type observerOpt struct{ o effects.Observer }

func (o observerOpt) applyRelay(c *relayConfig)     { c.observer = o.o }
func (o observerOpt) applyEnqueue(c *enqueueConfig) { c.observer = o.o }

// WithObserver reports to o, and takes trace context from o.
//
// Given to [NewRelay], it reports what [Relay.Run] handles on its own, as
// events with Component "outbox.Relay": [effects.EventDeadLettered] for
// each row it parks (Key is the message id, Attempt the row's attempts,
// Err the *[ParkedError]), and [effects.EventFailed] for each failed
// batch (retried) and for the configuration error that stops Run.
// Without an observer (or with a nil o) they are logged ([WithLogger]),
// rate-limited: never dropped.
//
// Given to [Enqueue], when o is an [effects.Propagator] (package
// effectively.dev/observe's Observer is), it stores with the row the
// headers that carry the trace of Enqueue's context (W3C traceparent and
// tracestate), and the relay publishes them, so a consumer's delivery
// span continues the trace that enqueued the message. Headers of the
// Message with the same names are kept. They are not part of the
// fingerprint: the same message enqueued again in another trace is a
// duplicate, not a reused id. [EnqueueStatement] has no context and
// writes no trace headers.
func WithObserver(o effects.Observer) Option { return observerOpt{o} }

// WithLogger sets the logger a [Relay] writes parked rows and failed
// batches to when it has no observer ([WithObserver]); the default is
// slog.Default() at the time of each line. Lines are at level Warn and
// rate-limited (a burst of 10, then about one a second, with a count of
// those held back). l must not be nil.
func WithLogger(l *slog.Logger) RelayOption {
	return relayOpt(func(c *relayConfig) { c.logger, c.loggerSet = l, true })
}
