package counterexamples

import (
	"context"
	"fmt"

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
