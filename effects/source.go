package effects

import (
	"context"
	"errors"
)

// Delivery is one message handed out by a [Source]: the unit a consumer
// handles and then acks.
type Delivery struct {
	// ID is the message's identity, stable across redeliveries (a webhook's
	// event id, a Kafka record's key header or topic/partition/offset). Keys
	// for the message's effects are derived from it with NewKey. A source
	// hands out an empty ID for a message whose id is present but empty
	// (never a substitute that would change on a resend): NewKey refuses it
	// with ErrInvalidKey, so a Consumer dead-letters the delivery.
	ID string
	// Ordering groups deliveries that must be handled in order (a Kafka
	// topic and partition); empty means no ordering constraint.
	Ordering string
	// Body is the message's payload.
	Body []byte
	// Headers are the message's headers or attributes.
	Headers map[string]string
	// Attempt is the delivery attempt the source knows this to be, from 1
	// (a Kafka share group's delivery count), or 0 when the source does not
	// know. A consumer ([effectively.dev/effects/consume.Consumer]) counts
	// its attempts from it, so its attempt limit holds across processes
	// and redeliveries.
	Attempt int

	// Token is the source's own handle for Ack (e.g. a Kafka record); a
	// consumer passes it back untouched.
	Token any
}

// Source hands out deliveries and takes acks. Side effect first, then ack:
// a consumer calls Ack only after the handler's effects committed, so an
// unacked delivery (a crash, a shutdown, an error) is delivered again.
//
// Implementations must be safe for one goroutine calling Next while others
// call Ack.
type Source interface {
	// Next blocks until a delivery is available or ctx is done.
	Next(ctx context.Context) (Delivery, error)
	// Ack records that d was handled. A source with ordered positions (Kafka
	// offsets) commits a position only once every earlier delivery with the
	// same Ordering was acked, so acking out of order never skips a message.
	Ack(ctx context.Context, d Delivery) error
}

// Releaser is implemented by a source that can hand an unacked delivery
// back to the broker for redelivery, to this consumer or another (a Kafka
// share group's Release). A consumer ([effectively.dev/effects/consume.Consumer])
// releases a delivery whose attempt failed and is to be retried, after the backoff, instead of retrying it in
// place, so the retry may run on a healthier member and the attempt counts
// in the broker's delivery count. If Release fails, the consumer keeps the
// delivery and retries it in place; a source may refuse to release (for
// example a delivery on its broker's last allowed attempt, which the broker
// would otherwise archive without the dead-letter hook seeing it).
type Releaser interface {
	// Release hands d back unacked. After a nil return the consumer forgets d.
	Release(ctx context.Context, d Delivery) error
}

// OwnershipChecker is implemented by a source whose deliveries can stop
// being this consumer's to handle before they are acked: a Kafka partition
// revoked in a rebalance, an acquisition lock that expired. A consumer
// ([effectively.dev/effects/consume.Consumer]) asks before each attempt (and each retry) and drops a delivery the source
// has stopped owning, without handling, acking or dead-lettering it: the new
// owner handles it, and running it here would only duplicate that work
// (safely, since handlers are idempotent, but at a cost).
type OwnershipChecker interface {
	// Owns reports whether d may still be handled and acked here. It must
	// be cheap and must not block: it runs before every attempt.
	Owns(d Delivery) bool
}

// ErrNotReleased is what a [Releaser] wraps when it declines, by design,
// to release a delivery (a Kafka share group's record on its last allowed
// delivery, which the broker would archive unseen). The consumer then
// retries the delivery in place without reporting a failure.
var ErrNotReleased = errors.New("delivery not released: retried in place")
