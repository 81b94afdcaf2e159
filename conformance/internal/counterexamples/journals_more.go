package counterexamples

import (
	"context"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
)

// InstanceClock judges a lease by the clock of the instance that reads
// it, not by one clock all instances share: an instance whose clock runs
// Skew ahead sees a live lease expired and takes it over, so two
// attempts do the effect at once. With Skew 0 it is the honest journal.
// Caught by clock-skew.
type InstanceClock struct {
	*memjournal.Journal
	// Skew is how far this instance's clock runs ahead of true time.
	Skew time.Duration
}

// Begin takes over a lease that has expired by this instance's clock.
func (j InstanceClock) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (journal.Record, error) {
	now := time.Now()
	if r := j.Get(key); r.Fingerprint != nil && !r.Done && r.LeaseUntil.After(now) && !r.LeaseUntil.After(now.Add(j.Skew)) {
		if err := j.Journal.Release(ctx, key, r.Attempt); err != nil {
			return journal.Record{}, err
		}
	}
	return j.Journal.Begin(ctx, key, fp, lease)
}
