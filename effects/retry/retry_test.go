package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"effectively.dev/effects/retry"
)

func TestBackoffDelayStaysWithinTheJitteredCeiling(t *testing.T) {
	b := retry.Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	for _, tc := range []struct {
		attempt int
		ceiling time.Duration
	}{
		{1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {3, 400 * time.Millisecond},
		{4, 800 * time.Millisecond}, {5, time.Second}, {60, time.Second}, {0, time.Second},
	} {
		for range 200 {
			d := b.Delay(tc.attempt)
			if d < tc.ceiling/2 || d > tc.ceiling {
				t.Fatalf("Delay(%d) = %v, want in [%v, %v]", tc.attempt, d, tc.ceiling/2, tc.ceiling)
			}
		}
	}
	if d := (retry.Backoff{}).Delay(3); d != 0 {
		t.Errorf("zero Backoff Delay = %v, want 0", d)
	}
}

func TestSleepReturnsEarlyWhenTheContextEnds(t *testing.T) {
	if err := retry.Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("Sleep = %v, want nil", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := retry.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep on a cancelled context = %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Sleep on a cancelled context took %v", took)
	}
}

func TestDetachedKeepsValuesButNotCancellation(t *testing.T) {
	type k struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), k{}, "v"))
	cancel()
	ctx, stop := retry.Detached(parent, time.Hour)
	defer stop()
	if ctx.Err() != nil {
		t.Fatalf("detached context is done: %v", ctx.Err())
	}
	if ctx.Value(k{}) != "v" {
		t.Error("detached context lost the parent's values")
	}
	if _, ok := ctx.Deadline(); !ok {
		t.Error("detached context has no deadline")
	}
}
