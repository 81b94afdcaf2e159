package consume_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/httpkey"
	"effectively.dev/httpkey/httpkeytest"
)

// A provider that rate-limits with 429 and Retry-After: 1 second: the
// consumer waits at least that long between attempts, whatever its own
// backoff (10 ms here), so two 429s in a row cost two attempts over two
// seconds, not three attempts in a few milliseconds, and the charge goes
// through within an attempt budget of 3 instead of being dead-lettered.
func TestConsumerWaitsOutRetryAfter(t *testing.T) {
	srv := httpkeytest.Start(t)
	srv.FailNext(2, http.StatusTooManyRequests) // answered with Retry-After: 1
	charge, err := httpkey.New(http.DefaultClient, func(ctx context.Context, amount int) (*http.Request, error) {
		body, _ := json.Marshal(map[string]int{"amount": amount})
		return http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/charges", bytes.NewReader(body))
	}, httpkey.IETF, httpkey.WithHorizon(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	src := newMemSource(delivery("evt-429", "p0"))
	var (
		mu    sync.Mutex
		times []time.Time
		errs  []error
	)
	h := func(ctx context.Context, d effects.Delivery) error {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		_, err := charge.Apply(ctx, effects.Key(d.ID), 2000)
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
		return err
	}
	dead := 0
	c := newConsumer(t, src, h, consume.WithBackoff(10*time.Millisecond, 20*time.Millisecond), consume.WithMaxAttempts(3),
		consume.WithDeadLetter(func(context.Context, effects.Delivery, error) error { dead++; return nil }))
	stop := start(t, c)
	waitFor(t, 20*time.Second, "the ack", func() bool { return src.ackCount("evt-429") == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(times) != 3 || dead != 0 || errs[2] != nil {
		t.Fatalf("%d attempts (errors %v), %d dead letters; want 3 attempts, the last applied", len(times), errs, dead)
	}
	for i := range 2 {
		wait, ok := effects.RetryAfter(errs[i])
		if !ok || wait != time.Second {
			t.Fatalf("attempt %d: %v, want a 429 with RetryAfter 1s", i+1, errs[i])
		}
		if gap := times[i+1].Sub(times[i]); gap < wait {
			t.Errorf("attempt %d came %v after a Retry-After of %v", i+2, gap, wait)
		}
	}
	if srv.Total() != 1 {
		t.Errorf("%d charges, want 1", srv.Total())
	}
}
