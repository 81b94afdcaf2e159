// Package retry holds the small pieces every adapter's retry loop needs:
// a capped, jittered exponential [Backoff], a context-aware [Sleep], and
// [Detached] for the work that must finish after the caller gave up.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is a capped exponential backoff with "equal jitter": the ceiling
// starts at Min and doubles per attempt up to Max, and each pause is drawn
// at random between half and all of the ceiling, so callers that failed
// together do not retry in lockstep. The zero Backoff pauses 0.
type Backoff struct {
	Min, Max time.Duration
}

// Delay returns the pause after failed attempt number attempt (from 1).
// attempt 0 or less means the ceiling is Max.
func (b Backoff) Delay(attempt int) time.Duration {
	ceiling := b.Max
	if attempt > 0 {
		ceiling = b.Min
		for i := 1; i < attempt && ceiling < b.Max; i++ {
			ceiling *= 2
		}
		ceiling = min(ceiling, b.Max)
	}
	if ceiling <= 0 {
		return 0
	}
	return ceiling/2 + rand.N(ceiling/2+1)
}

// Sleep pauses for d or until ctx is done, whichever comes first, and
// returns ctx's error in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Detached returns a context that keeps ctx's values but not its
// cancellation, bounded by timeout: for the work that must still run after
// the caller gave up (a rollback that returns a connection to its pool, a
// journal record of an effect the owner already confirmed).
func Detached(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), timeout)
}
