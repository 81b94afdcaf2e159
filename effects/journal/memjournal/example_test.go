package memjournal_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal/memjournal"
)

// A journal records that a key's effect was begun and completed; a second
// Begin of a completed key says so, and the same key with another payload
// is refused.
func Example() {
	ctx := context.Background()
	j := memjournal.New(time.Now)
	key := effects.MustKey("billing", "evt_1")

	rec, err := j.Begin(ctx, key, []byte("amount=100"), time.Minute)
	fmt.Println(rec.Done, rec.Attempt, err)
	// ... the effect runs here, then its ref is recorded:
	if err := j.Complete(ctx, key, "pi_1"); err != nil {
		fmt.Println(err)
	}

	rec, err = j.Begin(ctx, key, []byte("amount=100"), time.Minute)
	fmt.Println(rec.Done, rec.Ref, err)

	_, err = j.Begin(ctx, key, []byte("amount=999"), time.Minute)
	fmt.Println(errors.Is(err, effects.ErrKeyReused))
	// Output:
	// false 1 <nil>
	// true pi_1 <nil>
	// true
}
