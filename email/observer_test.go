package email_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/wneessen/go-mail"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/email"
)

// With an observer, a send whose sent-record did not commit is an
// EventFailed with its key, and nothing is logged.
func TestUnrecordedSendIsAnObserverEvent(t *testing.T) {
	e := newEnv(t)
	var (
		logs bytes.Buffer
		mu   sync.Mutex
		evs  []effects.Event
	)
	obs := effects.ObserverFunc(func(_ context.Context, ev effects.Event) { mu.Lock(); evs = append(evs, ev); mu.Unlock() })
	s, err := email.New(e.srv.Addr(),
		email.WithMailOptions(mail.WithTLSPolicy(mail.NoTLS)),
		email.WithJournal(&failingComplete{Journal: e.journal}, journal.WithLease(testLease),
			journal.WithObserver(obs), journal.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))),
	)
	if err != nil {
		t.Fatal(err)
	}
	key := effects.MustKey("shop", "order-11", "receipt")
	if res, err := s.Apply(testCtx(t), key, receipt("order 11")); err != nil || res.Status != effects.Applied {
		t.Fatalf("got %+v, %v; want applied", res, err)
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
