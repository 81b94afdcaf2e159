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
	// EventFailed: an apply or a handler failed (any other error).
	EventFailed
	// EventRetried: a consumer is retrying a delivery after a failure.
	EventRetried
	// EventDeadLettered: a consumer gave up on a delivery and handed it to
	// the dead-letter hook.
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
	// Count is how many records the event concerns, for [EventPruned].
	Count int64
}

// Observer receives events from observed effects, plans and consumers.
// Implementations must be safe for concurrent use and fast: they run on the
// caller's goroutine. Package effectively.dev/observe provides one that
// logs with log/slog and counts with OpenTelemetry metrics.
type Observer interface {
	Observe(ctx context.Context, ev Event)
}

// ObserverFunc adapts a function to an Observer.
type ObserverFunc func(ctx context.Context, ev Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, ev Event) { f(ctx, ev) }

// Observe wraps eff so that every Apply reports an Event named name to o.
// With a nil o it returns eff itself: observing costs nothing when not
// configured.
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
	start := time.Now()
	res, err := e.eff.Apply(ctx, key, in)
	e.o.Observe(ctx, Event{Kind: resultKind(res, err), Effect: e.name, Key: key, Duration: time.Since(start), Err: err})
	return res, err
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
