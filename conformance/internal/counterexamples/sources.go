package counterexamples

import (
	"context"
	"fmt"
	"maps"
	"sync/atomic"

	"effectively.dev/effects"
)

// AckOnNext wraps any [effects.Source] so that it acks every delivery as
// it hands it out, and makes Ack a no-op: the auto-commit consumer, which
// loses every message whose handler fails or whose process dies before
// the side effect. Caught by unacked-after-close, unacked-after-crash,
// out-of-order-acks, never-acked and revocation.
type AckOnNext struct{ effects.Source }

// Next hands out the next delivery, already acked.
func (s AckOnNext) Next(ctx context.Context) (effects.Delivery, error) {
	d, err := s.Source.Next(ctx)
	if err != nil {
		return d, err
	}
	if err := s.Source.Ack(ctx, d); err != nil {
		return effects.Delivery{}, fmt.Errorf("ack on next: %w", err)
	}
	return d, nil
}

// Ack does nothing: the delivery was acked when it was handed out.
func (s AckOnNext) Ack(context.Context, effects.Delivery) error { return nil }

// AttemptAlwaysOne wraps any [effects.Source] so that every delivery
// claims to be the first attempt: a Consumer's WithMaxAttempts then never
// trips for a message that keeps coming back across processes. Caught by
// unacked-after-close and unacked-after-crash.
type AttemptAlwaysOne struct{ effects.Source }

// Next hands out the next delivery as attempt 1.
func (s AttemptAlwaysOne) Next(ctx context.Context) (effects.Delivery, error) {
	d, err := s.Source.Next(ctx)
	d.Attempt = 1
	return d, err
}

// ReleaseAcks wraps any [effects.Source] with a Release that acks the
// delivery instead of handing it back: every retry a Consumer hands to
// the broker is lost. Caught by released.
type ReleaseAcks struct{ effects.Source }

// Release acks d.
func (s ReleaseAcks) Release(ctx context.Context, d effects.Delivery) error {
	return s.Source.Ack(ctx, d)
}

// StampedRedelivery wraps any [effects.Source] so that every delivery
// carries a header stamped when it is handed out (a "delivered-at", a
// per-delivery trace id in the message itself): a redelivery is then
// another message to anything that fingerprints the body and headers
// (key reuse) or dedups on them. Caught by unacked-after-close and
// unacked-after-crash.
type StampedRedelivery struct {
	effects.Source
	n *atomic.Int64
}

// NewStampedRedelivery wraps s.
func NewStampedRedelivery(s effects.Source) StampedRedelivery {
	return StampedRedelivery{Source: s, n: new(atomic.Int64)}
}

// Next hands out the next delivery with a header of its own.
func (s StampedRedelivery) Next(ctx context.Context) (effects.Delivery, error) {
	d, err := s.Source.Next(ctx)
	if err != nil {
		return d, err
	}
	h := make(map[string]string, len(d.Headers)+1)
	maps.Copy(h, d.Headers)
	h["delivered-at"] = fmt.Sprint(s.n.Add(1))
	d.Headers = h
	return d, nil
}
