// Package effects is the core of effectively: the contract every adapter
// implements so that a side effect happens effectively once on top of a
// transport that delivers at least once.
//
// No broker can deliver a message exactly once end to end. What can be made
// once is the visible effect: do the side effect first, then ack, and make
// the side effect idempotent by putting its dedup record next to the effect,
// inside the same all-or-nothing unit, enforced by whoever owns the effect
// (a UNIQUE index in your database, Stripe's Idempotency-Key, S3's
// If-None-Match). This package holds what every adapter would otherwise
// repeat:
//
//   - [Key]: a deterministic idempotency key built from a message's identity
//     and a step name ([NewKey]), validated before any I/O.
//   - [Contract]: what an adapter promises ([EffectivelyOnce] or
//     [AtLeastOnce]), who enforces it, for how long, and where duplicates can
//     still happen. The conformance suite holds every adapter to it.
//   - [Effect]: Contract plus Apply(ctx, key, input) returning a [Result]
//     that says [Applied] (done now) or [Replayed] (done earlier).
//   - Errors callers branch on with errors.Is: [ErrInvalidKey],
//     [ErrKeyReused], [ErrInFlight], [ErrAmbiguous], and [Retryable].
//   - [Journal]: the sent-record interface that best-effort adapters (email,
//     a Kafka producer, Stripe past its 24 h) use; package postgres
//     implements it, with its extensions [DoneJournal] (records without a
//     lease, for owners that dedup on the key) and [BatchJournal] (several
//     records in one transaction). [Journaled] runs the journaled-effect
//     protocol over it, once for every adapter.
//   - [Plan] and [Step]: a reusable definition of the effects of different
//     kinds that one event causes, each step a function of the event, run
//     in order under keys derived from the event's id ([Plan.Run]); the
//     weakest step decides the plan's contract ([Plan.Contract]), known at
//     start-up; a run's journal records commit together over a
//     [BatchJournal], and a step's transaction may take a later step's
//     lease ahead of it ([HoldLease]), sparing that step its Begin.
//   - [Consumer]: takes deliveries from a [Source], runs a [Handler], and
//     acks only after it succeeded (side effect first, then ack), with
//     per-ordering order, retries, dead letters and graceful shutdown.
//   - [Observer]: events for logs and metrics ([Observe] wraps an effect);
//     package effectively.dev/observe implements it with log/slog and
//     OpenTelemetry.
//
// The package has no dependencies beyond the standard library: adapters
// import it, it imports no adapter and no vendor SDK.
//
// When not to use it: if your side effect cannot carry a key that its owner
// enforces, no library can make it effectively once. Declare it AtLeastOnce,
// name its duplicate window, and design the effect so a duplicate does no
// harm.
package effects
