package retry_test

import (
	"context"
	"fmt"
	"time"

	"effectively.dev/effects/retry"
)

// A Backoff's pauses grow from Min to Max, each drawn between half and all
// of its ceiling; Sleep waits for one unless the context ends first.
func ExampleBackoff() {
	b := retry.Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	for attempt := 1; attempt <= 5; attempt++ {
		d := b.Delay(attempt)
		fmt.Println(attempt, d >= 50*time.Millisecond && d <= time.Second)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	fmt.Println(retry.Sleep(ctx, b.Delay(1)))
	// Output:
	// 1 true
	// 2 true
	// 3 true
	// 4 true
	// 5 true
	// context canceled
}

// Detached keeps work going after its caller gave up, bounded by its own
// timeout: here a cleanup that must run although the request was
// cancelled.
func ExampleDetached() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the caller is gone

	cleanup, done := retry.Detached(ctx, time.Second)
	defer done()
	fmt.Println(ctx.Err(), cleanup.Err())
	_, hasDeadline := cleanup.Deadline()
	fmt.Println(hasDeadline)
	// Output:
	// context canceled <nil>
	// true
}
