// Package consume is the runtime that takes deliveries from an
// [effects.Source] (a Kafka partition source, a share group, a queue of
// your own), hands each to a [Handler] (typically one that runs an
// [effects.Plan] keyed by the event's own id), and acks it only after the
// handler returned nil: side effect first, then ack.
//
// The [Consumer] keeps per-Ordering order (a Kafka partition's records one
// at a time, in offset order, or in batches of contiguous in-order runs),
// retries failures in place with backoff under the same key, sends each
// failure where it belongs, and shuts down gracefully within a bounded
// grace. It never acks a delivery before its effects are done and never
// drops one its source still owns.
//
// Use it when handlers are idempotent under keys derived from the event
// (that is what package effects gives them). A handler that is not will
// repeat its effects on every retry and redelivery, as with any
// at-least-once consumer.
//
// # Where each failure goes
//
// A handler's error is classified by [effects.ClassOf]; the adapters of
// this module return only classified errors, an application's own may be
// unclassified.
//
//   - Retryable ([effects.ErrAmbiguous], [effects.ErrTransient], context
//     errors) and unclassified errors: retried in place, with the same
//     key, after a jittered exponential backoff, up to [WithMaxAttempts]
//     attempts; then dead-lettered. An unclassified error (a 503 from the
//     application's own downstream call) may heal, so it gets the budget,
//     which bounds its cost when it does not.
//   - In flight ([effects.ErrInFlight]: another attempt holds a key's
//     lease, after a crash or beside a concurrent duplicate): not a failed
//     attempt. The consumer waits, never past the rest of the lease the
//     error reports ([effects.RetryAfter]), and tries again; these waits
//     spend no attempt, up to [WithInFlightWait] in all, after which they
//     count like any retryable error, so an adapter that answers in flight
//     for ever cannot hold a delivery for ever.
//   - Permanent ([effects.ErrRefused]: a card decline, an SMTP 5xx;
//     [effects.ErrKeyReused], [effects.ErrInvalidKey], [effects.ErrPoison],
//     and a recovered panic, [effects.ErrPanic]): dead-lettered at the
//     first attempt. Retrying the same key gets the same answer.
//   - Configuration ([effects.ErrInvalidConfig], a *[effects.ConfigError]:
//     a rejected API key, a missing bucket, table or topic): Run stops and
//     returns it. The delivery is neither acked nor dead-lettered, and
//     nothing after it in its Ordering runs: every delivery would fail the
//     same way until an operator fixes the configuration and restarts, and
//     the redelivery then replays the steps that were done.
//   - A panic in a handler, a batch handler or a plan step (concurrent
//     steps included) is recovered as a *[effects.PanicError] that says
//     "panic" and carries the stack, and is permanent: dead-lettered, while
//     the process and the other Orderings go on.
//
// Dead-lettering hands the delivery to the hook of [WithDeadLetter] and
// acks it once the hook returned nil. [New] refuses a consumer that has
// neither a hook nor [WithoutDeadLetter]: a consumer may never drop a
// delivery, so without a hook the only place for poison is its own
// Ordering, stalled behind it, and that must be chosen, not found in
// production. With WithoutDeadLetter the consumer parks the delivery,
// unacked, retried every max backoff, its Ordering waiting behind it
// while the others go on; it says so once (a Warn line, or
// [effects.EventFailed]) and [Stats].Parked counts it, the number to
// alert on.
//
// Each attempt runs under a time limit ([WithAttemptTimeout], one minute
// by default), so a call stuck on a dead connection does not hold its
// Ordering until the kernel gives up; the retry resolves what the cut
// attempt left unknown.
//
// Failures are visible by default: without [WithObserver], each is one
// line on slog.Default(), rate-limited; a parked delivery is reported once,
// not at every round.
//
// # The shortest correct use
//
//	c, err := consume.New(src, func(ctx context.Context, d effects.Delivery) error {
//		var ev Payment
//		if err := json.Unmarshal(d.Body, &ev); err != nil {
//			return fmt.Errorf("%w: %w", effects.ErrPoison, err) // dead-lettered at once
//		}
//		if err := effects.CheckID(ev.ID); err != nil {
//			return err // poison too
//		}
//		_, err := plan.Run(ctx, ev.ID, ev) // keyed by the event's own id: a resent event replays
//		return err
//	}, consume.WithDeadLetter(deadLetter))
//	if err != nil {
//		return err
//	}
//	return c.Run(ctx) // nil after ctx is cancelled; an error after a configuration error
package consume
