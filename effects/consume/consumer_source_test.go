package consume_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
)

// releasingSource is a memSource that is also an effects.Releaser: a
// released delivery comes back from Next with its Attempt raised, as a
// share group redelivers it with its delivery count.
type releasingSource struct {
	*memSource
	refuse   func(d effects.Delivery) error // nil: every release succeeds
	released atomic.Int64
}

func (s *releasingSource) Release(_ context.Context, d effects.Delivery) error {
	if s.refuse != nil {
		if err := s.refuse(d); err != nil {
			return err
		}
	}
	s.released.Add(1)
	d.Attempt = max(d.Attempt, 1) + 1
	s.ch <- d
	return nil
}

// ownedSource is a memSource that is also an effects.OwnershipChecker:
// the deliveries whose Ordering is in revoked are no longer its own.
type ownedSource struct {
	*memSource
	mu      sync.Mutex
	revoked map[string]bool
}

func (s *ownedSource) Owns(d effects.Delivery) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.revoked[d.Ordering]
}

func (s *ownedSource) revoke(ordering string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.revoked[ordering] = true
}

// TestConsumerCountsTheSourcesAttempts: a delivery on its source's third
// attempt, with a budget of 3, is dead-lettered after one more failure.
func TestConsumerCountsTheSourcesAttempts(t *testing.T) {
	d := delivery("a", "")
	d.Attempt = 3
	src := newMemSource(d)
	var attempts atomic.Int64
	var dead atomic.Int64
	obs := &events{}
	c := newConsumer(t, src, func(ctx context.Context, d effects.Delivery) error {
		attempts.Add(1)
		return errors.New("downstream 503")
	}, consume.WithMaxAttempts(3), consume.WithBackoff(time.Millisecond, time.Millisecond),
		consume.WithObserver(obs),
		consume.WithDeadLetter(func(ctx context.Context, d effects.Delivery, err error) error {
			dead.Add(1)
			return nil
		}))
	stop := start(t, c)
	waitFor(t, 10*time.Second, "the dead letter", func() bool { return dead.Load() == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := attempts.Load(); got != 1 {
		t.Errorf("handler ran %d times; want 1 (attempts 1 and 2 happened before, elsewhere)", got)
	}
	if dl := obs.of(effects.EventDeadLettered); len(dl) != 1 || dl[0].Attempt != 3 {
		t.Errorf("dead-letter events %+v; want one at attempt 3", dl)
	}
	if src.ackCount("a") != 1 {
		t.Errorf("acks of a = %d; want 1 (after the hook took it)", src.ackCount("a"))
	}
}

// TestConsumerReleasesRetriesToAReleaser: with a Releaser source, a failed
// attempt goes back to the source (and comes back with its attempt
// counted there); a release that fails is retried in place, reported as a
// failure unless the source declined by design (ErrNotReleased).
func TestConsumerReleasesRetriesToAReleaser(t *testing.T) {
	for _, tc := range []struct {
		name       string
		refusal    error // nil: released
		wantFailed int64
	}{
		{"released", nil, 0},
		{"declined", fmt.Errorf("last allowed delivery: %w", effects.ErrNotReleased), 0},
		{"release failed", errors.New("broker unreachable"), 2},
	} {
		refuse := tc.refusal != nil
		t.Run(tc.name, func(t *testing.T) {
			src := &releasingSource{memSource: newMemSource(delivery("a", ""))}
			if refuse {
				src.refuse = func(effects.Delivery) error { return tc.refusal }
			}
			var mu sync.Mutex
			var seen []int // the Attempt of every delivery handed to the handler
			c := newConsumer(t, src, func(ctx context.Context, d effects.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				seen = append(seen, d.Attempt)
				if len(seen) < 3 {
					return errors.New("not yet")
				}
				return nil
			}, consume.WithBackoff(time.Millisecond, time.Millisecond), consume.WithObserver(&events{}), consume.WithoutDeadLetter())
			stop := start(t, c)
			waitFor(t, 10*time.Second, "the ack", func() bool { return src.ackCount("a") == 1 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			st := c.Stats()
			if st.Failed != tc.wantFailed {
				t.Errorf("Failed = %d, want %d", st.Failed, tc.wantFailed)
			}
			mu.Lock()
			defer mu.Unlock()
			if refuse {
				if src.released.Load() != 0 || st.Released != 0 {
					t.Errorf("released %d (stats %d); want 0: the source refused", src.released.Load(), st.Released)
				}
				if want := []int{0, 0, 0}; !equalInts(seen, want) {
					t.Errorf("attempts seen %v; want %v (in place, the same delivery)", seen, want)
				}
			} else {
				if src.released.Load() != 2 || st.Released != 2 || st.Retried != 2 {
					t.Errorf("released %d, stats %+v; want 2 releases, 2 retries", src.released.Load(), st)
				}
				if want := []int{0, 2, 3}; !equalInts(seen, want) {
					t.Errorf("attempts seen %v; want %v (redelivered by the source)", seen, want)
				}
			}
			src.checkNoDoubleAcks(t)
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestConsumerDropsDeliveriesTheSourceNoLongerOwns: after a revocation,
// the deliveries of the revoked Ordering still queued are dropped without
// running the handler or acking; the other Ordering goes on.
func TestConsumerDropsDeliveriesTheSourceNoLongerOwns(t *testing.T) {
	for _, batch := range []bool{false, true} {
		name := "handler"
		if batch {
			name = "batch"
		}
		t.Run(name, func(t *testing.T) {
			var ds []effects.Delivery
			for i := range 20 {
				ds = append(ds, delivery("p0-"+string(rune('a'+i)), "p0"))
			}
			ds = append(ds, delivery("p1-a", "p1"))
			src := &ownedSource{memSource: newMemSource(ds...), revoked: map[string]bool{}}
			release := make(chan struct{})
			var ran sync.Map
			handle := func(d effects.Delivery) error {
				ran.Store(d.ID, true)
				if d.ID == "p0-a" {
					<-release // p0's head runs while p0 is revoked
					src.revoke("p0")
				}
				return nil
			}
			opts := []consume.Option{consume.WithoutDeadLetter()}
			var h consume.Handler
			if batch {
				opts = append(opts, consume.WithBatch(1, 0, func(ctx context.Context, ds []effects.Delivery) []error {
					errs := make([]error, len(ds))
					for i, d := range ds {
						errs[i] = handle(d)
					}
					return errs
				}))
			} else {
				h = func(ctx context.Context, d effects.Delivery) error { return handle(d) }
			}
			c := newConsumer(t, src, h, opts...)
			stop := start(t, c)
			waitFor(t, 10*time.Second, "p1's ack", func() bool { return src.ackCount("p1-a") == 1 })
			close(release)
			waitFor(t, 10*time.Second, "the drops", func() bool { return c.Stats().Dropped == 19 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			for _, d := range ds[1:20] {
				if _, ok := ran.Load(d.ID); ok {
					t.Errorf("%s ran after its Ordering was revoked", d.ID)
				}
				if n := src.ackCount(d.ID); n != 0 {
					t.Errorf("%s acked %d times after its Ordering was revoked", d.ID, n)
				}
			}
			if st := c.Stats(); st.Dropped != 19 || st.Failed != 0 {
				t.Errorf("stats %+v; want 19 dropped, 0 failed", st)
			}
		})
	}
}

// TestConsumerBatchSkipsDeliveriesNotOwned: a batch that holds deliveries
// the source no longer owns hands the handler only the owned ones, and
// their results go to the right deliveries: the one the handler failed is
// the one dead-lettered, the others are acked, the unowned are dropped.
func TestConsumerBatchSkipsDeliveriesNotOwned(t *testing.T) {
	ds := []effects.Delivery{delivery("p0-a", "p0"), delivery("p1-a", "p1"), delivery("p0-b", "p0"), delivery("x-a", ""), delivery("p1-b", "p1")}
	src := &ownedSource{memSource: newMemSource(ds...), revoked: map[string]bool{"p0": true}}
	var mu sync.Mutex
	var batches [][]string
	var dead []string
	c := newConsumer(t, src, nil,
		// The batch waits until the consumer holds all five (then nothing
		// more can arrive), so one batch holds owned and unowned ones.
		consume.WithBatch(10, time.Hour, func(ctx context.Context, ds []effects.Delivery) []error {
			mu.Lock()
			defer mu.Unlock()
			var ids []string
			errs := make([]error, len(ds))
			for i, d := range ds {
				ids = append(ids, d.ID)
				if d.ID == "x-a" {
					errs[i] = fmt.Errorf("%w: bad body", effects.ErrPoison)
				}
			}
			batches = append(batches, ids)
			return errs
		}),
		consume.WithConcurrency(1), consume.WithMaxPending(len(ds)),
		consume.WithObserver(&events{}),
		consume.WithDeadLetter(func(ctx context.Context, d effects.Delivery, err error) error {
			mu.Lock()
			defer mu.Unlock()
			dead = append(dead, d.ID)
			return nil
		}))
	stop := start(t, c)
	waitFor(t, 10*time.Second, "three acks and two drops", func() bool {
		st := c.Stats()
		return st.Acked == 3 && st.Dropped == 2
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(batches) == 1 {
		slices.Sort(batches[0])
	}
	if fmt.Sprint(batches) != "[[p1-a p1-b x-a]]" {
		t.Errorf("batches %v; want one batch of p1-a, x-a, p1-b (p0 is not owned)", batches)
	}
	if fmt.Sprint(dead) != "[x-a]" {
		t.Errorf("dead-lettered %v; want [x-a]: the failed result must go to its own delivery", dead)
	}
	for _, id := range []string{"p1-a", "p1-b"} {
		if src.ackCount(id) != 1 {
			t.Errorf("%s acked %d times, want 1", id, src.ackCount(id))
		}
	}
	for _, id := range []string{"p0-a", "p0-b"} {
		if src.ackCount(id) != 0 {
			t.Errorf("%s acked although not owned", id)
		}
	}
}
