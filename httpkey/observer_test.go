package httpkey_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/httpkey"
	"effectively.dev/httpkey/httpkeytest"
)

// refusingJournal records nothing: every Complete and MarkDone fails.
type refusingJournal struct{ *memjournal.Journal }

func (refusingJournal) Complete(context.Context, effects.Key, string) error {
	return errors.New("journal refuses the record")
}

func (refusingJournal) MarkDone(context.Context, effects.Key, []byte, string) error {
	return errors.New("journal refuses the record")
}

// With an observer, a response the journal did not record is an
// EventFailed with its key (Apply still reports the call applied), and
// nothing is logged.
func TestUnrecordedResponseIsAnObserverEvent(t *testing.T) {
	srv := httpkeytest.Start(t)
	var (
		logs bytes.Buffer
		mu   sync.Mutex
		evs  []effects.Event
	)
	obs := effects.ObserverFunc(func(_ context.Context, ev effects.Event) { mu.Lock(); evs = append(evs, ev); mu.Unlock() })
	e := newEffect(t, srv, httpkey.WithHorizon(time.Hour), httpkey.WithJournal(refusingJournal{memjournal.New(nil)},
		journal.WithObserver(obs), journal.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))))
	key := effects.MustKey("billing", "evt_obs", "charge")
	if res, err := e.Apply(ctx, key, pay(key)); err != nil || res.Status != effects.Applied {
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
