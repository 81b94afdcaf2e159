// Package consume is the runtime that takes deliveries from an
// [effects.Source], hands each to a [Handler] (typically one that runs an
// effects.Plan keyed by the delivery's event id), and acks it only after
// the handler returned nil: side effect first, then ack.
//
// The [Consumer] keeps per-Ordering order (a Kafka partition's records one
// at a time, in offset order), retries failures with backoff under the
// same key, hands deliveries it gives up on to a dead-letter hook, and
// shuts down gracefully. It never acks a delivery before its effects are
// done and never drops one its source still owns.
//
// The shortest correct use:
//
//	c, err := consume.New(src, func(ctx context.Context, d effects.Delivery) error {
//		ev, err := decode(d.Body) // a body that cannot decode: effects.ErrPoison
//		if err != nil {
//			return err
//		}
//		_, err = plan.Run(ctx, ev.ID, ev)
//		return err
//	}, consume.WithDeadLetter(deadLetter))
//	...
//	err = c.Run(ctx)
package consume
