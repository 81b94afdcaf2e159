package effects

import "context"

// Delivery is one message handed out by a [Source]: the unit a consumer
// handles and then acks.
type Delivery struct {
	// ID is the message's identity, stable across redeliveries (a webhook's
	// event id, a Kafka record's key header or topic/partition/offset). Keys
	// for the message's effects are derived from it with NewKey.
	ID string
	// Ordering groups deliveries that must be handled in order (a Kafka
	// topic and partition); empty means no ordering constraint.
	Ordering string
	// Body is the message's payload.
	Body []byte
	// Headers are the message's headers or attributes.
	Headers map[string]string

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
