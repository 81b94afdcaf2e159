package observe_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/observe"
)

// sliceSource hands out its deliveries once, then blocks until ctx is done.
type sliceSource struct {
	mu    sync.Mutex
	queue []effects.Delivery
	acked chan string
}

func (s *sliceSource) Next(ctx context.Context) (effects.Delivery, error) {
	s.mu.Lock()
	if len(s.queue) > 0 {
		d := s.queue[0]
		s.queue = s.queue[1:]
		s.mu.Unlock()
		return d, nil
	}
	s.mu.Unlock()
	<-ctx.Done()
	return effects.Delivery{}, ctx.Err()
}

func (s *sliceSource) Ack(_ context.Context, d effects.Delivery) error {
	s.acked <- d.ID
	return nil
}

// TestConsumerEvents wires one Observer into a real consume.Consumer and the
// effect its handler applies: a good delivery is applied and acked, a
// poison one is retried and dead-lettered, and both show in the metrics and
// the logs with the delivery's id and attempt.
func TestConsumerEvents(t *testing.T) {
	mf := newMeterFixture(t)
	rec := &recorder{level: slog.LevelInfo}
	obs, err := observe.New(observe.WithLogger(slog.New(rec)), observe.WithMeterProvider(mf.provider))
	if err != nil {
		t.Fatal(err)
	}
	ledger := effects.Observe("ledger", effects.Effect[string](newScriptedEffect()), obs)
	src := &sliceSource{
		queue: []effects.Delivery{{ID: "ok-1"}, {ID: "poison"}},
		acked: make(chan string, 2),
	}
	deadLettered := make(chan string, 1)
	handler := func(ctx context.Context, d effects.Delivery) error {
		if d.ID == "poison" {
			return errors.New("cannot parse the body")
		}
		_, err := ledger.Apply(ctx, effects.Key("billing:"+d.ID+":ledger"), "x")
		return err
	}
	c, err := consume.New(src, handler,
		consume.WithObserver(obs),
		consume.WithMaxAttempts(3),
		consume.WithBackoff(time.Millisecond, 2*time.Millisecond),
		consume.WithDeadLetter(func(_ context.Context, d effects.Delivery, _ error) error {
			deadLettered <- d.ID
			return nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	wait := func(ch chan string, want string) {
		t.Helper()
		select {
		case got := <-ch:
			if got != want {
				t.Errorf("got %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out waiting for %q", want)
		}
	}
	wait(deadLettered, "poison")
	for range 2 { // ok-1, and the dead-lettered delivery, which is acked too
		select {
		case <-src.acked:
		case <-time.After(10 * time.Second):
			t.Fatal("timed out waiting for acks")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}

	want := map[string]int64{
		"effect=ledger,outcome=applied": 1,
		"outcome=retried":               2,
		"outcome=dead_lettered":         1,
	}
	if got := mf.collect(t).counts; !maps.Equal(got, want) {
		t.Errorf("counts %v, want %v", got, want)
	}
	var got []string
	for _, r := range rec.records() { // Info and above: the consumer's events
		got = append(got, r.level.String()+" "+r.attrs["outcome"]+" "+r.attrs["delivery_id"]+" attempt="+r.attrs["attempt"])
	}
	wantLogs := []string{
		"INFO retried poison attempt=1",
		"INFO retried poison attempt=2",
		"ERROR dead_lettered poison attempt=3",
	}
	if !slices.Equal(got, wantLogs) {
		t.Errorf("log records\n got %q\nwant %q", got, wantLogs)
	}
}
