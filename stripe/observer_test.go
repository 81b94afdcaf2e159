package stripe

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/stripe/stripetest"
)

// With an observer, an object Stripe created that the journal did not
// record is an EventFailed with its key, and nothing is logged: one
// mechanism, not two.
func TestUnrecordedObjectIsAnObserverEvent(t *testing.T) {
	srv := stripetest.Start(t)
	j := &failingComplete{Journal: memjournal.New(nil), fail: 1000}
	var (
		logs bytes.Buffer
		mu   sync.Mutex
		evs  []effects.Event
	)
	obs := effects.ObserverFunc(func(_ context.Context, ev effects.Event) { mu.Lock(); evs = append(evs, ev); mu.Unlock() })
	charges := newPI(t, newAPI(t, srv, nil), WithJournal(j, journal.WithObserver(obs), journal.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))))
	key := effects.MustKey("test", "evt_obs", "charge")
	if res, err := charges.Apply(context.Background(), key, order); err != nil || res.Status != effects.Applied {
		t.Fatalf("Apply = %+v, %v; want applied", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	failed := 0
	for _, ev := range evs {
		if ev.Kind == effects.EventFailed && ev.Key == key && ev.Err != nil {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("events %+v; want one EventFailed for %s", evs, key)
	}
	if logs.Len() != 0 {
		t.Errorf("logged %q with an observer set", logs.String())
	}
}
