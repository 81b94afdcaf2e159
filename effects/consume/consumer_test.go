package consume_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/postgres/pgtest"
)

// TestMain stops the shared PostgreSQL cluster after the tests and, with
// goleak (pgtest.Main), fails the run if any goroutine outlived them: a
// consumer's worker or retry timer, a kgo client, a pgx pool.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// memSource is an in-memory effects.Source: Next hands out what was put in
// (blocking when empty), Ack records acks and counts repeated ones.
type memSource struct {
	ch      chan effects.Delivery
	nextErr chan error // an error put here is returned by the next Next

	mu      sync.Mutex
	acks    map[string]int
	acked   []string // IDs in ack order
	ackErr  func(d effects.Delivery) error
	doubles []string
}

func newMemSource(ds ...effects.Delivery) *memSource {
	s := &memSource{ch: make(chan effects.Delivery, 1000), nextErr: make(chan error, 1), acks: map[string]int{}}
	for _, d := range ds {
		s.ch <- d
	}
	return s
}

func (s *memSource) Next(ctx context.Context) (effects.Delivery, error) {
	select {
	case err := <-s.nextErr:
		return effects.Delivery{}, err
	default:
	}
	select {
	case d := <-s.ch:
		return d, nil
	case err := <-s.nextErr:
		return effects.Delivery{}, err
	case <-ctx.Done():
		return effects.Delivery{}, ctx.Err()
	}
}

func (s *memSource) Ack(_ context.Context, d effects.Delivery) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ackErr != nil {
		if err := s.ackErr(d); err != nil {
			return err
		}
	}
	s.acks[d.ID]++
	if s.acks[d.ID] > 1 {
		s.doubles = append(s.doubles, d.ID)
	}
	s.acked = append(s.acked, d.ID)
	return nil
}

func (s *memSource) ackCount(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acks[id]
}

func (s *memSource) totalAcks() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.acked)
}

// checkNoDoubleAcks fails t if any delivery was acked twice.
func (s *memSource) checkNoDoubleAcks(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.doubles) > 0 {
		t.Errorf("deliveries acked more than once: %v", s.doubles)
	}
}

func delivery(id, ordering string) effects.Delivery {
	return effects.Delivery{ID: id, Ordering: ordering, Body: []byte(id)}
}

// events is an Observer that keeps what it sees.
type events struct {
	mu  sync.Mutex
	evs []effects.Event
}

func (e *events) Observe(_ context.Context, ev effects.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

// of returns the events of kind, in order.
func (e *events) of(kind effects.EventKind) []effects.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []effects.Event
	for _, ev := range e.evs {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

// start runs c until the returned stop function is called; stop cancels
// Run's context and returns Run's error. A Run that outlives the test is
// stopped at cleanup.
func start(t *testing.T, c *consume.Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				err = errors.New("Run did not return within 30 s of the cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// waitFor polls cond until it holds, or fails t after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func newConsumer(t *testing.T, src effects.Source, h consume.Handler, opts ...consume.Option) *consume.Consumer {
	t.Helper()
	c, err := consume.New(src, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewValidates(t *testing.T) {
	src := newMemSource()
	h := func(context.Context, effects.Delivery) error { return nil }
	bh := func(_ context.Context, ds []effects.Delivery) []error { return make([]error, len(ds)) }
	hook := func(context.Context, effects.Delivery, error) error { return nil }
	cases := []struct {
		name   string
		src    effects.Source
		h      consume.Handler
		opts   []consume.Option // WithoutDeadLetter is added unless bare
		bare   bool
		option string // "" = valid
	}{
		{"defaults", src, h, nil, false, ""},
		{"nil option ignored", src, h, []consume.Option{nil}, false, ""},
		{"retry forever", src, h, []consume.Option{consume.WithMaxAttempts(0)}, false, ""},
		{"zero grace", src, h, []consume.Option{consume.WithShutdownGrace(0)}, false, ""},
		{"equal backoffs", src, h, []consume.Option{consume.WithBackoff(time.Second, time.Second)}, false, ""},
		{"batch", src, nil, []consume.Option{consume.WithBatch(10, 0, bh)}, false, ""},
		{"a dead-letter hook", src, h, []consume.Option{consume.WithDeadLetter(hook)}, true, ""},
		{"no attempt time limit", src, h, []consume.Option{consume.WithAttemptTimeout(0)}, false, ""},
		{"no waiting for leases", src, h, []consume.Option{consume.WithInFlightWait(0)}, false, ""},
		{"nil source", nil, h, nil, false, "source"},
		{"nil handler", src, nil, nil, false, "handler"},
		{"handler and batch", src, h, []consume.Option{consume.WithBatch(10, 0, bh)}, false, "handler"},
		{"nil batch handler", src, nil, []consume.Option{consume.WithBatch(10, 0, nil)}, false, "WithBatch"},
		{"batch size 0", src, nil, []consume.Option{consume.WithBatch(0, 0, bh)}, false, "WithBatch"},
		{"negative linger", src, nil, []consume.Option{consume.WithBatch(1, -1, bh)}, false, "WithBatch"},
		{"no workers", src, h, []consume.Option{consume.WithConcurrency(0)}, false, "WithConcurrency"},
		{"negative attempts", src, h, []consume.Option{consume.WithMaxAttempts(-1)}, false, "WithMaxAttempts"},
		{"zero min backoff", src, h, []consume.Option{consume.WithBackoff(0, time.Second)}, false, "WithBackoff"},
		{"max below min", src, h, []consume.Option{consume.WithBackoff(time.Second, time.Millisecond)}, false, "WithBackoff"},
		{"nil logger", src, h, []consume.Option{consume.WithLogger(nil)}, false, "WithLogger"},
		{"negative grace", src, h, []consume.Option{consume.WithShutdownGrace(-time.Second)}, false, "WithShutdownGrace"},
		{"no pending", src, h, []consume.Option{consume.WithMaxPending(0)}, false, "WithMaxPending"},
		{"one pending", src, h, []consume.Option{consume.WithMaxPending(1)}, false, ""},
		{"negative attempt time limit", src, h, []consume.Option{consume.WithAttemptTimeout(-time.Second)}, false, "WithAttemptTimeout"},
		{"negative lease wait", src, h, []consume.Option{consume.WithInFlightWait(-time.Second)}, false, "WithInFlightWait"},
		{"no dead-letter decision", src, h, nil, true, "WithDeadLetter"},
		{"nil dead-letter hook", src, h, []consume.Option{consume.WithDeadLetter(nil)}, true, "WithDeadLetter"},
		{"hook and no hook", src, h, []consume.Option{consume.WithDeadLetter(hook), consume.WithoutDeadLetter()}, true, "WithoutDeadLetter"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			if !tc.bare {
				opts = append([]consume.Option{consume.WithoutDeadLetter()}, opts...)
			}
			c, err := consume.New(tc.src, tc.h, opts...)
			if tc.option == "" {
				if err != nil || c == nil {
					t.Fatalf("New = %v, %v; want a consumer", c, err)
				}
				return
			}
			var ce *effects.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, effects.ErrInvalidConfig) || c != nil {
				t.Fatalf("New = %v, %v; want a *ConfigError wrapping ErrInvalidConfig", c, err)
			}
			if ce.Option != tc.option {
				t.Errorf("ConfigError.Option = %q, want %q (%v)", ce.Option, tc.option, err)
			}
		})
	}
}

// TestConsumerRetriesWithBackoffThenSucceeds: a handler that fails twice is
// retried in place after growing, jittered pauses, then acked once.
func TestConsumerRetriesWithBackoffThenSucceeds(t *testing.T) {
	src := newMemSource(delivery("evt-1", "p0"))
	obs := &events{}
	var mu sync.Mutex
	var times []time.Time
	transient := effects.Transient("test.Apply", "k", errors.New("connection refused"))
	h := func(_ context.Context, d effects.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		times = append(times, time.Now())
		if len(times) <= 2 {
			return transient
		}
		return nil
	}
	const minB = 40 * time.Millisecond
	c := newConsumer(t, src, h, consume.WithBackoff(minB, time.Second), consume.WithObserver(obs), consume.WithoutDeadLetter())
	stop := start(t, c)
	waitFor(t, 10*time.Second, "the ack", func() bool { return src.ackCount("evt-1") == 1 })
	if err := stop(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(times) != 3 {
		t.Fatalf("%d attempts, want 3", len(times))
	}
	// Pause after attempt n is in [ceiling/2, ceiling], ceiling = min·2^(n-1).
	for n, lowest := range []time.Duration{minB / 2, minB} {
		if gap := times[n+1].Sub(times[n]); gap < lowest {
			t.Errorf("pause after attempt %d: %v, want at least %v", n+1, gap, lowest)
		}
	}
	want := consume.Stats{Delivered: 1, Acked: 1, Retried: 2}
	if got := c.Stats(); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
	retried := obs.of(effects.EventRetried)
	if len(retried) != 2 || retried[0].Attempt != 1 || retried[1].Attempt != 2 ||
		retried[0].DeliveryID != "evt-1" || !errors.Is(retried[0].Err, effects.ErrTransient) {
		t.Errorf("EventRetried = %+v, want attempts 1 and 2 of evt-1 with the handler's error", retried)
	}
	src.checkNoDoubleAcks(t)
}

// TestConsumerDeadLettersAfterMaxAttempts: a delivery that keeps failing
// goes to the dead-letter hook once, after the last attempt, with the last
// error, and is then acked.
func TestConsumerDeadLettersAfterMaxAttempts(t *testing.T) {
	src := newMemSource(delivery("evt-bad", "p0"), delivery("evt-next", "p0"))
	obs := &events{}
	var attempts atomic.Int64
	h := func(_ context.Context, d effects.Delivery) error {
		if d.ID == "evt-bad" {
			return fmt.Errorf("attempt %d: upstream said no", attempts.Add(1))
		}
		return nil
	}
	var hookMu sync.Mutex
	var hooked []string
	var hookErr error
	hook := func(_ context.Context, d effects.Delivery, err error) error {
		hookMu.Lock()
		defer hookMu.Unlock()
		hooked = append(hooked, d.ID)
		hookErr = err
		return nil
	}
	c := newConsumer(t, src, h, consume.WithMaxAttempts(3), consume.WithBackoff(time.Millisecond, 5*time.Millisecond),
		consume.WithDeadLetter(hook), consume.WithObserver(obs))
	stop := start(t, c)
	waitFor(t, 10*time.Second, "both acks", func() bool { return src.totalAcks() == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := attempts.Load(); n != 3 {
		t.Errorf("%d attempts, want 3", n)
	}
	if !slices.Equal(hooked, []string{"evt-bad"}) || hookErr == nil || hookErr.Error() != "attempt 3: upstream said no" {
		t.Errorf("hook calls %v with %v, want one for evt-bad with the third attempt's error", hooked, hookErr)
	}
	// Same Ordering: evt-next waited for evt-bad to be dead-lettered.
	if want := []string{"evt-bad", "evt-next"}; !slices.Equal(src.acked, want) {
		t.Errorf("ack order %v, want %v", src.acked, want)
	}
	want := consume.Stats{Delivered: 2, Acked: 2, Retried: 2, DeadLettered: 1}
	if got := c.Stats(); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
	if dl := obs.of(effects.EventDeadLettered); len(dl) != 1 || dl[0].Attempt != 3 || dl[0].DeliveryID != "evt-bad" {
		t.Errorf("EventDeadLettered = %+v, want one at attempt 3", dl)
	}
	src.checkNoDoubleAcks(t)
}

// TestConsumerWithoutHookNeverDrops: with WithoutDeadLetter, a delivery
// past its attempts is parked: it stays unacked and keeps being retried at
// the maximum backoff, reported as EventFailed; the deliveries behind it in
// its Ordering wait, other Orderings go on.
func TestConsumerWithoutHookNeverDrops(t *testing.T) {
	src := newMemSource(delivery("a-1", "a"), delivery("a-2", "a"), delivery("b-1", "b"), delivery("u-1", ""))
	obs := &events{}
	var attempts, behind atomic.Int64
	h := func(_ context.Context, d effects.Delivery) error {
		switch d.ID {
		case "a-1":
			attempts.Add(1)
			return errors.New("the database is down")
		case "a-2":
			behind.Add(1)
		}
		return nil
	}
	c := newConsumer(t, src, h, consume.WithMaxAttempts(2), consume.WithBackoff(time.Millisecond, 10*time.Millisecond),
		consume.WithObserver(obs), consume.WithoutDeadLetter())
	stop := start(t, c)
	waitFor(t, 10*time.Second, "six attempts", func() bool { return attempts.Load() >= 6 })
	waitFor(t, 10*time.Second, "the other Orderings", func() bool { return src.totalAcks() == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if src.ackCount("a-1") != 0 || src.ackCount("a-2") != 0 || behind.Load() != 0 {
		t.Errorf("a-1 acked %d, a-2 acked %d and handled %d times; want all 0", src.ackCount("a-1"), src.ackCount("a-2"), behind.Load())
	}
	if src.ackCount("b-1") != 1 || src.ackCount("u-1") != 1 {
		t.Errorf("b-1, u-1 acked %d, %d times; want 1 each", src.ackCount("b-1"), src.ackCount("u-1"))
	}
	failed := obs.of(effects.EventFailed)
	if len(failed) < 4 || failed[0].Attempt != 2 || failed[1].Attempt != 3 {
		t.Fatalf("EventFailed = %+v, want one per attempt from the second on", failed)
	}
	if st := c.Stats(); st.Retried != 1 || st.Failed != int64(len(failed)) || st.DeadLettered != 0 || st.Acked != 2 || st.Parked != 0 {
		t.Errorf("Stats = %+v, want Retried 1, Failed %d, Acked 2, Parked 0 after Run", st, len(failed))
	}
}

// TestConsumerHookFailureKeepsDelivery: a failing dead-letter hook does not
// ack; the consumer tries again (handler, then hook) and acks once the hook
// takes the delivery.
func TestConsumerHookFailureKeepsDelivery(t *testing.T) {
	src := newMemSource(delivery("evt", "p"))
	var attempts, hookCalls atomic.Int64
	h := func(context.Context, effects.Delivery) error { attempts.Add(1); return errors.New("nope") }
	hook := func(context.Context, effects.Delivery, error) error {
		if hookCalls.Add(1) == 1 {
			return errors.New("dead-letter topic unreachable")
		}
		return nil
	}
	obs := &events{}
	c := newConsumer(t, src, h, consume.WithMaxAttempts(1), consume.WithBackoff(time.Millisecond, 5*time.Millisecond),
		consume.WithDeadLetter(hook), consume.WithObserver(obs))
	stop := start(t, c)
	waitFor(t, 10*time.Second, "the ack", func() bool { return src.totalAcks() == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if attempts.Load() != 2 || hookCalls.Load() != 2 {
		t.Errorf("%d attempts, %d hook calls; want 2 and 2", attempts.Load(), hookCalls.Load())
	}
	want := consume.Stats{Delivered: 1, Acked: 1, DeadLettered: 1, Failed: 1}
	if got := c.Stats(); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
	if f := obs.of(effects.EventFailed); len(f) != 1 || f[0].Err == nil || !errorsContain(f[0].Err, "dead-letter topic unreachable") {
		t.Errorf("EventFailed = %+v, want one naming the hook's failure", f)
	}
	src.checkNoDoubleAcks(t)
}

func errorsContain(err error, s string) bool {
	return err != nil && strings.Contains(err.Error(), s)
}

// TestConsumerAckFailureIsReported: an Ack that fails is counted and
// observed, not retried, and the consumer goes on.
func TestConsumerAckFailureIsReported(t *testing.T) {
	src := newMemSource(delivery("evt-1", ""), delivery("evt-2", ""))
	src.ackErr = func(d effects.Delivery) error {
		if d.ID == "evt-1" {
			return errors.New("commit refused")
		}
		return nil
	}
	var handled atomic.Int64
	obs := &events{}
	c := newConsumer(t, src, func(context.Context, effects.Delivery) error { handled.Add(1); return nil }, consume.WithObserver(obs), consume.WithoutDeadLetter())
	stop := start(t, c)
	waitFor(t, 10*time.Second, "evt-2's ack", func() bool { return src.totalAcks() == 1 && handled.Load() == 2 })
	waitFor(t, 10*time.Second, "the failed ack", func() bool { return c.Stats().Failed == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if f := obs.of(effects.EventFailed); len(f) != 1 || f[0].DeliveryID != "evt-1" || !errorsContain(f[0].Err, "commit refused") {
		t.Errorf("EventFailed = %+v", f)
	}
	if st := c.Stats(); st.Acked != 1 || handled.Load() != 2 {
		t.Errorf("Stats %+v, handled %d; want Acked 1, handled 2", st, handled.Load())
	}
}

// TestConsumerShutdownGrace: on cancel, a running handler keeps a live
// context until the grace expires, then sees it cancelled; an interrupted
// handler is not acked; Run waits for it and returns nil; deliveries not
// started are not handled.
func TestConsumerShutdownGrace(t *testing.T) {
	const grace = 300 * time.Millisecond
	src := newMemSource(delivery("slow-ok", "a"), delivery("slow-cut", "b"), delivery("after-ok", "a"))
	started := make(chan string, 2)
	release := make(chan struct{})
	var handled sync.Map
	h := func(ctx context.Context, d effects.Delivery) error {
		handled.Store(d.ID, true)
		switch d.ID {
		case "slow-ok":
			started <- d.ID
			<-release
			if ctx.Err() != nil {
				t.Errorf("slow-ok: handler context cancelled before the grace expired")
			}
			return nil
		case "slow-cut":
			started <- d.ID
			<-ctx.Done() // ignores the shutdown until its context ends
			return ctx.Err()
		}
		return nil
	}
	obs := &events{}
	c := newConsumer(t, src, h, consume.WithConcurrency(4), consume.WithShutdownGrace(grace), consume.WithObserver(obs), consume.WithoutDeadLetter())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-started
	<-started
	began := time.Now()
	cancel()
	time.Sleep(50 * time.Millisecond) // shutdown under way, grace not expired
	close(release)
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	if err != nil {
		t.Fatalf("Run = %v, want nil after a cancel", err)
	}
	if took := time.Since(began); took < grace {
		t.Errorf("Run returned after %v, before the %v grace let slow-cut finish", took, grace)
	}
	if src.ackCount("slow-ok") != 1 || src.ackCount("slow-cut") != 0 {
		t.Errorf("acks: slow-ok %d, slow-cut %d; want 1 and 0", src.ackCount("slow-ok"), src.ackCount("slow-cut"))
	}
	if _, ok := handled.Load("after-ok"); ok {
		t.Errorf("after-ok was handled after shutdown began")
	}
	if f := obs.of(effects.EventFailed); len(f) != 1 || f[0].DeliveryID != "slow-cut" || !errors.Is(f[0].Err, context.Canceled) {
		t.Errorf("EventFailed = %+v, want one for slow-cut wrapping context.Canceled", f)
	}
	src.checkNoDoubleAcks(t)
}

// TestConsumerSourceFailure: a Next error while ctx is live stops the
// consumer: Run returns it, wrapped, after the running handlers finished.
func TestConsumerSourceFailure(t *testing.T) {
	src := newMemSource(delivery("evt-1", ""))
	broken := errors.New("broker unreachable")
	var handled atomic.Int64
	h := func(ctx context.Context, d effects.Delivery) error {
		src.nextErr <- broken // Next fails once this handler is running
		time.Sleep(20 * time.Millisecond)
		handled.Add(1)
		return nil
	}
	c := newConsumer(t, src, h, consume.WithoutDeadLetter())
	err := c.Run(context.Background())
	if !errors.Is(err, broken) {
		t.Fatalf("Run = %v, want the source's error", err)
	}
	if handled.Load() != 1 || src.ackCount("evt-1") != 1 {
		t.Errorf("handled %d, acked %d; want the running handler finished and acked", handled.Load(), src.ackCount("evt-1"))
	}
}

// TestConsumerRunOnce: a second Run while one is running is refused.
func TestConsumerRunOnce(t *testing.T) {
	src := newMemSource(delivery("evt", ""))
	c := newConsumer(t, src, func(context.Context, effects.Delivery) error { return nil }, consume.WithoutDeadLetter())
	stop := start(t, c)
	waitFor(t, 5*time.Second, "the first Run to ack", func() bool { return src.totalAcks() == 1 })
	if err := c.Run(context.Background()); !errors.Is(err, consume.ErrRunning) {
		t.Fatalf("second Run = %v, want ErrConsumerRunning", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestConsumerOrderingAndConcurrency: deliveries of one Ordering run one at
// a time in order; different Orderings and unordered ones run in parallel,
// bounded by the concurrency.
func TestConsumerOrderingAndConcurrency(t *testing.T) {
	const orderings, per, unordered, workers = 6, 30, 40, 4
	var ds []effects.Delivery
	for i := range per {
		for o := range orderings {
			ds = append(ds, delivery(fmt.Sprintf("o%d-%03d", o, i), fmt.Sprintf("o%d", o)))
		}
		if i < unordered {
			ds = append(ds, delivery(fmt.Sprintf("u-%03d", i), ""))
		}
	}
	src := newMemSource(ds...)
	var mu sync.Mutex
	seen := map[string][]string{}
	active := map[string]int{}
	var running, peak atomic.Int64
	h := func(_ context.Context, d effects.Delivery) error {
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		mu.Lock()
		active[d.Ordering]++
		if d.Ordering != "" && active[d.Ordering] > 1 {
			t.Errorf("two handlers at once for Ordering %s", d.Ordering)
		}
		seen[d.Ordering] = append(seen[d.Ordering], d.ID)
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		active[d.Ordering]--
		mu.Unlock()
		return nil
	}
	c := newConsumer(t, src, h, consume.WithConcurrency(workers), consume.WithoutDeadLetter())
	stop := start(t, c)
	waitFor(t, 20*time.Second, "every ack", func() bool { return src.totalAcks() == len(ds) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for o := range orderings {
		got := seen[fmt.Sprintf("o%d", o)]
		if len(got) != per || !slices.IsSorted(got) {
			t.Errorf("Ordering o%d handled in order %v", o, got)
		}
	}
	if p := peak.Load(); p > workers || p < 2 {
		t.Errorf("peak concurrency %d, want 2..%d", p, workers)
	}
	src.checkNoDoubleAcks(t)
}

// TestConsumerMaxPending: the consumer stops taking deliveries when
// WithMaxPending of them are unfinished, and resumes when one finishes.
func TestConsumerMaxPending(t *testing.T) {
	var ds []effects.Delivery
	for i := range 10 {
		ds = append(ds, delivery(fmt.Sprintf("a-%d", i), "a"))
	}
	src := newMemSource(ds...)
	release := make(chan struct{})
	h := func(_ context.Context, d effects.Delivery) error {
		if d.ID == "a-0" {
			<-release
		}
		return nil
	}
	c := newConsumer(t, src, h, consume.WithMaxPending(3), consume.WithoutDeadLetter())
	stop := start(t, c)
	waitFor(t, 5*time.Second, "three deliveries taken", func() bool { return c.Stats().Delivered == 3 })
	time.Sleep(20 * time.Millisecond)
	if n := c.Stats().Delivered; n != 3 {
		t.Fatalf("took %d deliveries with a-0 stuck and WithMaxPending(3)", n)
	}
	close(release)
	waitFor(t, 5*time.Second, "every ack", func() bool { return src.totalAcks() == 10 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !slices.IsSorted(src.acked) {
		t.Errorf("acked out of order: %v", src.acked)
	}
}

// runUntilAcked runs c until src has n acks, then stops it.
func runUntilAcked(t *testing.T, c *consume.Consumer, src *memSource, n int) {
	t.Helper()
	stop := start(t, c)
	waitFor(t, 20*time.Second, "every ack", func() bool { return src.totalAcks() == n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// batchLog records what a BatchHandler was given.
type batchLog struct {
	mu      sync.Mutex
	batches [][]effects.Delivery
	seen    map[string]int      // presentations per delivery id
	firsts  map[string][]string // per Ordering, ids in the order first presented
	done    map[string][]string // per Ordering, ids in the order they succeeded
}

func newBatchLog() *batchLog {
	return &batchLog{seen: map[string]int{}, firsts: map[string][]string{}, done: map[string][]string{}}
}

// record notes a batch; fail says which deliveries fail this time.
func (l *batchLog) record(t *testing.T, batch []effects.Delivery, fail func(d effects.Delivery, i int, errs []error) error) []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batches = append(l.batches, slices.Clone(batch))
	last := map[string]string{}
	errs := make([]error, len(batch))
	for i, d := range batch {
		if prev, ok := last[d.Ordering]; ok && d.Ordering != "" && prev >= d.ID {
			t.Errorf("batch %v: %s after %s in Ordering %s", ids(batch), d.ID, prev, d.Ordering)
		}
		last[d.Ordering] = d.ID
		if l.seen[d.ID]++; l.seen[d.ID] == 1 {
			l.firsts[d.Ordering] = append(l.firsts[d.Ordering], d.ID)
		}
		if errs[i] = fail(d, i, errs); errs[i] == nil {
			l.done[d.Ordering] = append(l.done[d.Ordering], d.ID)
		}
	}
	return errs
}

// longestRun returns the most deliveries of one Ordering any batch held.
func (l *batchLog) longestRun() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	longest := 0
	for _, b := range l.batches {
		n := map[string]int{}
		for _, d := range b {
			if d.Ordering != "" {
				n[d.Ordering]++
				longest = max(longest, n[d.Ordering])
			}
		}
	}
	return longest
}

func ids(ds []effects.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

// orderedDeliveries returns per deliveries for each of the Orderings a, b
// and c, and per without an Ordering, interleaved as a Kafka fetch would
// not: one of each in turn.
func orderedDeliveries(per int) []effects.Delivery {
	var ds []effects.Delivery
	for i := range per {
		for _, o := range []string{"a", "b", "c"} {
			ds = append(ds, delivery(fmt.Sprintf("%s-%02d", o, i), o))
		}
		ds = append(ds, delivery(fmt.Sprintf("u-%02d", i), ""))
	}
	return ds
}

// TestConsumerBatch: batches carry in-order runs of one Ordering, every
// Ordering is presented in order, and each delivery is settled on its own:
// a failed one is retried in a later batch (the later deliveries of its run
// that succeeded are acked, their effects being done), a poison one
// dead-lettered.
func TestConsumerBatch(t *testing.T) {
	ds := orderedDeliveries(10)
	src := newMemSource(ds...)
	log := newBatchLog()
	failedOnce := false
	bh := func(_ context.Context, batch []effects.Delivery) []error {
		return log.record(t, batch, func(d effects.Delivery, _ int, _ []error) error {
			switch {
			case d.ID == "b-03" && !failedOnce:
				failedOnce = true
				return errors.New("serialization failure")
			case d.ID == "u-05":
				return fmt.Errorf("%w: bad JSON", effects.ErrPoison)
			}
			return nil
		})
	}
	var mu sync.Mutex
	var dead []string
	hook := func(_ context.Context, d effects.Delivery, _ error) error {
		mu.Lock()
		defer mu.Unlock()
		dead = append(dead, d.ID)
		return nil
	}
	c := newConsumer(t, src, nil, consume.WithBatch(8, 20*time.Millisecond, bh), consume.WithConcurrency(2),
		consume.WithBackoff(time.Millisecond, 5*time.Millisecond), consume.WithDeadLetter(hook))
	runUntilAcked(t, c, src, len(ds))
	log.mu.Lock()
	for _, o := range []string{"a", "b", "c"} {
		if got := log.firsts[o]; len(got) != 10 || !slices.IsSorted(got) {
			t.Errorf("Ordering %s first presented in order %v", o, got)
		}
		if got := log.done[o]; len(got) != 10 {
			t.Errorf("Ordering %s: %d deliveries succeeded, want 10: %v", o, len(got), got)
		}
	}
	if log.seen["b-03"] != 2 {
		t.Errorf("b-03 presented %d times, want 2 (failed once)", log.seen["b-03"])
	}
	for id, n := range log.seen {
		if n > 1 && id != "b-03" {
			t.Errorf("%s presented %d times; only b-03 failed", id, n)
		}
	}
	log.mu.Unlock()
	if n := log.longestRun(); n < 3 {
		t.Errorf("no batch held a run of 3 deliveries of one Ordering (longest %d)", n)
	}
	mu.Lock()
	if !slices.Equal(dead, []string{"u-05"}) {
		t.Errorf("dead-lettered %v, want [u-05]", dead)
	}
	mu.Unlock()
	if st := c.Stats(); st.Retried != 1 || st.DeadLettered != 1 || st.Acked != int64(len(ds)) {
		t.Errorf("Stats = %+v", st)
	}
	src.checkNoDoubleAcks(t)
}

// TestConsumerBatchFailRestOfRun: a BatchHandler that fails the rest of a
// run after a failure keeps the order of effects strict: those deliveries
// are tried again after the failed one, in order, and their failures there
// neither count as attempts nor are reported. b-03 fails at its first
// presentation (with b-04 behind it in the same batch), b-04 at its second;
// with a budget of 2 attempts, b-04 is dead-lettered if its failure behind
// b-03 counted.
func TestConsumerBatchFailRestOfRun(t *testing.T) {
	ds := orderedDeliveries(10)
	src := newMemSource(ds...)
	log := newBatchLog()
	obs := &events{}
	bh := func(_ context.Context, batch []effects.Delivery) []error {
		return log.record(t, batch, func(d effects.Delivery, i int, errs []error) error {
			for j := range i {
				if errs[j] != nil && batch[j].Ordering == d.Ordering && d.Ordering != "" {
					return errors.New("an earlier delivery of the run failed")
				}
			}
			switch {
			case d.ID == "b-03" && log.seen[d.ID] == 1, d.ID == "b-04" && log.seen[d.ID] == 2:
				return errors.New("serialization failure")
			}
			return nil
		})
	}
	// One worker whose first batch holds all 40 deliveries: it lingers
	// until the consumer has taken them all and holds every slot. (The
	// retries' batches linger out the 2 s: the source is idle, more could
	// arrive.)
	c := newConsumer(t, src, nil, consume.WithBatch(100, 2*time.Second, bh), consume.WithConcurrency(1),
		consume.WithMaxPending(len(ds)),
		consume.WithBackoff(time.Millisecond, 5*time.Millisecond), consume.WithMaxAttempts(2),
		consume.WithObserver(obs), consume.WithDeadLetter(func(_ context.Context, d effects.Delivery, _ error) error {
			t.Errorf("%s dead-lettered: a failure behind an earlier one was counted as an attempt", d.ID)
			return nil
		}))
	runUntilAcked(t, c, src, len(ds))
	log.mu.Lock()
	for _, o := range []string{"a", "b", "c"} {
		if got := log.done[o]; len(got) != 10 || !slices.IsSorted(got) {
			t.Errorf("Ordering %s succeeded in order %v", o, got)
		}
	}
	if log.seen["b-04"] < 3 {
		t.Errorf("b-04 presented %d times, want 3 (behind b-03, failed itself, succeeded)", log.seen["b-04"])
	}
	log.mu.Unlock()
	var got []string
	for _, ev := range obs.of(effects.EventRetried) {
		got = append(got, fmt.Sprintf("%s#%d", ev.DeliveryID, ev.Attempt))
	}
	if !slices.Equal(got, []string{"b-03#1", "b-04#1"}) || len(obs.evs) != 2 {
		t.Errorf("events %+v; want only b-03's and b-04's first attempts retried", obs.evs)
	}
	src.checkNoDoubleAcks(t)
}

// TestConsumerBatchNoLingerWhenNothingCanArrive: a batch does not wait out
// its linger when every slot is taken: no delivery can join it.
func TestConsumerBatchNoLingerWhenNothingCanArrive(t *testing.T) {
	src := newMemSource(delivery("p-0", "p"), delivery("p-1", "p"), delivery("p-2", "p"))
	log := newBatchLog()
	bh := func(_ context.Context, batch []effects.Delivery) []error {
		return log.record(t, batch, func(effects.Delivery, int, []error) error { return nil })
	}
	c := newConsumer(t, src, nil, consume.WithBatch(100, time.Hour, bh), consume.WithMaxPending(3), consume.WithoutDeadLetter())
	stop := start(t, c)
	waitFor(t, 20*time.Second, "every ack (a batch that lingers for its hour never acks)", func() bool { return src.totalAcks() == 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := log.longestRun(); n < 2 {
		t.Errorf("longest run in a batch %d; the run of p should have been batched: %v", n, log.batches)
	}
}

// TestConsumerBatchWrongLength: a batch handler that returns the wrong
// number of errors fails the whole batch with ErrBatchResults.
func TestConsumerBatchWrongLength(t *testing.T) {
	src := newMemSource(delivery("evt", ""))
	obs := &events{}
	bh := func(context.Context, []effects.Delivery) []error { return nil }
	c := newConsumer(t, src, nil, consume.WithBatch(4, 0, bh), consume.WithObserver(obs),
		consume.WithBackoff(time.Hour, time.Hour), consume.WithoutDeadLetter())
	stop := start(t, c)
	waitFor(t, 5*time.Second, "the failure", func() bool { return len(obs.of(effects.EventRetried)) == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if ev := obs.of(effects.EventRetried)[0]; !errors.Is(ev.Err, consume.ErrBatchResults) {
		t.Errorf("error %v, want ErrBatchResults", ev.Err)
	}
	if src.totalAcks() != 0 {
		t.Error("acked a delivery whose batch result was missing")
	}
}

// TestConsumerLeavesNoGoroutines: runs with pending retries, blocked
// handlers and batches leave nothing behind when Run returns.
func TestConsumerLeavesNoGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for round := range 5 {
		src := newMemSource(delivery("fail", "a"), delivery("ok", "b"), delivery("block", "c"))
		handle := func(ctx context.Context, d effects.Delivery) error {
			switch d.ID {
			case "fail":
				return errors.New("retry me later")
			case "block":
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}
		h := consume.Handler(handle)
		opts := []consume.Option{consume.WithBackoff(time.Millisecond, time.Hour), consume.WithShutdownGrace(10 * time.Millisecond),
			consume.WithoutDeadLetter()}
		if round%2 == 1 {
			bh := func(ctx context.Context, ds []effects.Delivery) []error {
				errs := make([]error, len(ds))
				for i, d := range ds {
					errs[i] = handle(ctx, d)
				}
				return errs
			}
			opts = append(opts, consume.WithBatch(3, 5*time.Millisecond, bh))
			h = nil
		}
		c := newConsumer(t, src, h, opts...)
		stop := start(t, c)
		waitFor(t, 5*time.Second, "every delivery", func() bool { return c.Stats().Delivered == 3 })
		time.Sleep(20 * time.Millisecond) // a retry pending, a handler blocked
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the consumer's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestConsumerLogsFailuresByDefault: without an observer, failed attempts,
// parked deliveries and dead letters are logged to slog.Default() with the
// delivery id, the attempt, the error's class and the error; with an
// observer, nothing is logged.
func TestConsumerLogsFailuresByDefault(t *testing.T) {
	var buf syncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })

	failing := func(_ context.Context, d effects.Delivery) error {
		if d.ID == "poison" {
			return fmt.Errorf("%w: bad body", effects.ErrPoison)
		}
		return errors.New("database is down")
	}
	run := func(opts ...consume.Option) string {
		buf.mu.Lock()
		buf.b.Reset()
		buf.mu.Unlock()
		src := newMemSource(delivery("down", "a"), delivery("poison", "b"))
		c := newConsumer(t, src, failing, append([]consume.Option{
			consume.WithMaxAttempts(2), consume.WithBackoff(time.Millisecond, 2*time.Millisecond)}, opts...)...)
		stop := start(t, c)
		waitFor(t, 10*time.Second, "both deliveries given up on", func() bool {
			st := c.Stats()
			return st.Failed >= 3 || st.DeadLettered == 2
		})
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}

	out := run(consume.WithoutDeadLetter())
	for _, want := range []string{
		`level=INFO msg="consume.Consumer: attempt failed; retrying" delivery_id=down attempt=1 class=unclassified error="database is down"`,
		`level=WARN msg="consume.Consumer: delivery parked; its Ordering waits" delivery_id=down attempt=2 class=unclassified`,
		`level=WARN msg="consume.Consumer: delivery parked; its Ordering waits" delivery_id=poison attempt=1 class=poison`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	out = run(consume.WithDeadLetter(func(context.Context, effects.Delivery, error) error { return nil }))
	if want := `msg="consume.Consumer: delivery dead-lettered" delivery_id=poison attempt=1`; !strings.Contains(out, want) {
		t.Errorf("log lacks %q:\n%s", want, out)
	}
	if out := run(consume.WithoutDeadLetter(), consume.WithObserver(&events{})); out != "" {
		t.Errorf("with an observer, the consumer logged:\n%s", out)
	}
	var own syncBuffer
	out = run(consume.WithoutDeadLetter(), consume.WithLogger(slog.New(slog.NewTextHandler(&own, nil))))
	if want := `delivery_id=down attempt=1`; out != "" || !strings.Contains(own.String(), want) {
		t.Errorf("with WithLogger, slog.Default() got %q and the given logger %q; want %q in the given logger only", out, own.String(), want)
	}
}
