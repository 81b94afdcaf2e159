// Package effects is the core of effectively: the contract every adapter
// implements so that a side effect happens effectively once on top of a
// transport that delivers at least once.
//
// No broker can deliver a message exactly once end to end. What can be made
// once is the visible effect: do the side effect first, then ack, and make
// the side effect idempotent by putting its dedup record next to the effect,
// inside the same all-or-nothing unit, enforced by whoever owns the effect
// (a UNIQUE index in your database, Stripe's Idempotency-Key, S3's
// If-None-Match). This package holds the contract:
//
//   - [Key]: a deterministic idempotency key built from a message's identity
//     and a step name ([NewKey]), validated before any I/O.
//   - [Contract]: what an adapter promises ([EffectivelyOnce] or
//     [AtLeastOnce]), who enforces it, for how long, and where duplicates can
//     still happen. Package conformance holds every adapter to it.
//   - [Effect]: Contract plus Apply(ctx, key, input) returning a [Result]
//     that says [Applied] (done now) or [Replayed] (done earlier).
//   - One classification of errors ([ClassOf]): retryable ([ErrAmbiguous],
//     [ErrInFlight], [ErrTransient]), permanent ([ErrInvalidKey],
//     [ErrKeyReused], [ErrRefused], [ErrPoison], [ErrPanic]) and
//     configuration ([ErrInvalidConfig]), honoured by every adapter and by
//     the consumer.
//   - [Plan] and [Step]: the effects of different kinds that one event
//     causes, each a function of the event, run in order under keys derived
//     from the event's id ([Plan.Run]); the weakest step decides the plan's
//     contract ([Plan.Contract]), known at start-up, and [Plan.Check] probes
//     every step's configuration before the first delivery.
//   - [Source] and [Delivery]: what a broker hands out and takes acks for.
//   - [Observer] and [Event]: one event model for logs, metrics and traces.
//
// The shortest correct use: key a plan from the event's own id, and run it.
//
//	plan, err := effects.NewPlan("billing",
//		effects.EventStep("ledger", ledger), // postgres.New
//		effects.EventStep("charge", charge), // stripe.NewPaymentIntents
//	)
//	...
//	if err := effects.CheckID(ev.ID); err != nil { ... } // a poison id
//	_, err = plan.Run(ctx, ev.ID, ev)
//
// Around it: package effectively.dev/effects/consume runs a plan (or any
// handler) over a Source and acks only after it succeeded; package
// effectively.dev/effects/journal is the kit for adapters whose effect's
// owner cannot hold the key; package effectively.dev/conformance proves an
// adapter's contract under injected faults.
//
// The package has no dependencies beyond the standard library: adapters
// import it, it imports no adapter and no vendor SDK.
//
// When not to use it: if your side effect cannot carry a key that its owner
// enforces, no library can make it effectively once. Declare it AtLeastOnce,
// name its duplicate window, and design the effect so a duplicate does no
// harm.
package effects
