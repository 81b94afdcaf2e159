package effects

import (
	"context"
	"errors"
	"time"
)

// EventKind is what happened to one apply, step or delivery.
type EventKind int

const (
	// EventApplied: an effect was done now.
	EventApplied EventKind = iota + 1
	// EventReplayed: an effect was found done; nothing changed.
	EventReplayed
	// EventKeyReused: a key came back with another payload.
	EventKeyReused
	// EventInFlight: another attempt held the key.
	EventInFlight
	// EventFailed: an apply or a handler failed (any other error), or a
	// component's own work failed and it goes on (a source's fetch or
	// commit it retries, a relay's batch, a journal write); Component
	// names the component then.
	EventFailed
	// EventRetried: a consumer is retrying a delivery after a failure.
	EventRetried
	// EventDeadLettered: a consumer gave up on a delivery and handed it to
	// the dead-letter hook, or an outbox relay parked a row (Component
	// "outbox.Relay"; Key is the message id).
	EventDeadLettered
	// EventPruned: a pruner deleted Count expired records in one
	// statement.
	EventPruned
)

// String names the kind, as used in metric attributes and log messages.
func (k EventKind) String() string {
	switch k {
	case EventApplied:
		return "applied"
	case EventReplayed:
		return "replayed"
	case EventKeyReused:
		return "key_reused"
	case EventInFlight:
		return "in_flight"
	case EventFailed:
		return "failed"
	case EventRetried:
		return "retried"
	case EventDeadLettered:
		return "dead_lettered"
	case EventPruned:
		return "pruned"
	}
	return "unknown"
}

// Event describes one observed outcome.
type Event struct {
	Kind EventKind
	// Effect names the effect (see [Observe]); Step names the plan step,
	// if any.
	Effect, Step string
	// Key is the idempotency key, if any; DeliveryID the message's id, for
	// consumer events.
	Key        Key
	DeliveryID string
	// Attempt counts a consumer's attempts at a delivery, from 1.
	Attempt int
	// Duration is how long the apply or the handler took.
	Duration time.Duration
	// Err is the failure, for failure kinds.
	Err error
	// Component names what reported the event when it is not an effect
	// or a plan step: "kafka.Source", "kafka.ShareSource",
	// "outbox.Relay", "journal" (a journaled adapter's protocol), and
	// "plan " followed by the plan's scope on a [Plan]'s run events.
	// Empty for effects and steps.
	Component string
	// Headers are the delivery's headers, on the start of a
	// [SpanDelivery]: a [Tracer] continues the trace they carry (a W3C
	// traceparent written by the producer).
	Headers map[string]string
	// Count is how many records the event concerns, for [EventPruned].
	Count int64
}

// Observer receives events from observed effects, plans, consumers,
// sources, journals and relays: the one event model every component of
// this module reports through. Implementations must be safe for
// concurrent use and fast: they run on the caller's goroutine. Package
// effectively.dev/observe provides one that logs with log/slog, counts
// with OpenTelemetry metrics and traces with OpenTelemetry spans.
type Observer interface {
	Observe(ctx context.Context, ev Event)
}

// Span names the unit of work a [Tracer] span covers.
type Span int

const (
	// SpanDelivery is one attempt of a consumer at one delivery.
	SpanDelivery Span = iota + 1
	// SpanPlan is one [Plan.Run].
	SpanPlan
	// SpanStep is one step of a plan run.
	SpanStep
	// SpanEffect is one Apply of an effect wrapped by [Observe].
	SpanEffect
)

// String returns "delivery", "plan", "step" or "effect".
func (s Span) String() string {
	switch s {
	case SpanDelivery:
		return "delivery"
	case SpanPlan:
		return "plan"
	case SpanStep:
		return "step"
	case SpanEffect:
		return "effect"
	}
	return "unknown"
}

// Tracer is implemented by an [Observer] that also traces; package
// effectively.dev/observe's does, with OpenTelemetry. Before a unit of
// work runs, the consumer (each delivery attempt), a plan (each run and
// each step) and [Observe] (each Apply) call Start with what is known of
// it: ev has no Kind yet, and carries the names, the key, the delivery id
// and attempt, and for a delivery its headers. Start returns the context
// the work runs under (carrying the span, so that spans nest: delivery,
// plan, step, effect) and a function that ends the span with the
// outcome, which the caller calls exactly once, after it reported the
// outcome with Observe. Start must be cheap and must not block.
type Tracer interface {
	Start(ctx context.Context, span Span, ev Event) (context.Context, func(outcome Event))
}

// startSpan starts a span of kind span through o when o is a [Tracer],
// and returns ctx unchanged and an end that does nothing otherwise.
func startSpan(ctx context.Context, o Observer, span Span, ev Event) (context.Context, func(outcome Event)) {
	if t, ok := o.(Tracer); ok {
		return t.Start(ctx, span, ev)
	}
	return ctx, noEnd
}

func noEnd(Event) {}

// Propagator is implemented by an [Observer] that carries trace context
// across a broker; package effectively.dev/observe's does, with
// OpenTelemetry's W3C TraceContext. Inject calls set with each header (for
// W3C: traceparent and, when there is one, tracestate) that carries the
// trace of the span in ctx; with no span in ctx it calls nothing. Producers
// (kafka.Producer, outbox.Enqueue) call it to write the headers a consumer's
// [SpanDelivery] span continues, so one trace runs through the broker.
// Inject must be cheap and must not block.
type Propagator interface {
	Inject(ctx context.Context, set func(key, value string))
}

// ObserverFunc adapts a function to an Observer.
type ObserverFunc func(ctx context.Context, ev Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, ev Event) { f(ctx, ev) }

// Observe wraps eff so that every Apply reports an Event named name to o,
// inside a [SpanEffect] span when o is a [Tracer]. The wrapper keeps eff's
// contract and its Check. With a nil o it returns eff itself: observing
// costs nothing when not configured.
func Observe[In any](name string, eff Effect[In], o Observer) Effect[In] {
	if o == nil {
		return eff
	}
	return &observed[In]{name: name, eff: eff, o: o}
}

type observed[In any] struct {
	name string
	eff  Effect[In]
	o    Observer
}

func (e *observed[In]) Contract() Contract { return e.eff.Contract() }

func (e *observed[In]) Apply(ctx context.Context, key Key, in In) (Result, error) {
	ctx, end := startSpan(ctx, e.o, SpanEffect, Event{Effect: e.name, Key: key})
	start := time.Now()
	res, err := e.eff.Apply(ctx, key, in)
	ev := Event{Kind: resultKind(res, err), Effect: e.name, Key: key, Duration: time.Since(start), Err: err}
	e.o.Observe(ctx, ev)
	end(ev)
	return res, err
}

// Check runs the wrapped effect's Check when it has one.
func (e *observed[In]) Check(ctx context.Context) error {
	if c, ok := e.eff.(Checker); ok {
		return c.Check(ctx)
	}
	return nil
}

// resultKind classifies an Apply's outcome.
func resultKind(res Result, err error) EventKind {
	switch {
	case err == nil && res.Status == Replayed:
		return EventReplayed
	case err == nil:
		return EventApplied
	case errors.Is(err, ErrKeyReused):
		return EventKeyReused
	case errors.Is(err, ErrInFlight):
		return EventInFlight
	}
	return EventFailed
}
