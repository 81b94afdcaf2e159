package consume_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
)

// hookLog is a dead-letter hook that keeps what it was given.
type hookLog struct {
	mu       sync.Mutex
	ids      []string
	errs     []error
	attempts []int
}

func (h *hookLog) hook(_ context.Context, d effects.Delivery, err error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ids = append(h.ids, d.ID)
	h.errs = append(h.errs, err)
	h.attempts = append(h.attempts, d.Attempt)
	return nil
}

func (h *hookLog) got() ([]string, []error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ids), slices.Clone(h.errs)
}

// refuseOnDeadLetter is a hook that fails the test: nothing may be
// dead-lettered.
func refuseOnDeadLetter(t *testing.T) consume.Option {
	return consume.WithDeadLetter(func(_ context.Context, d effects.Delivery, err error) error {
		t.Errorf("%s dead-lettered: %v", d.ID, err)
		return nil
	})
}

// runErr runs c in the background and returns a channel with Run's
// result; the run is stopped at cleanup if it is still going.
func runErr(t *testing.T, c *consume.Consumer) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() { done <- c.Run(ctx); close(finished) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return within 30 s of the cancel")
		}
	})
	return done
}

// TestConsumerDeadLettersEachPermanentErrorAtFirstAttempt: every error of
// the permanent class (a refusal such as a card decline, a key reused, an
// invalid key, poison, a panic), however deeply wrapped, goes to the hook
// after one attempt with the handler's error unchanged; retryable and
// unclassified errors (an application's own) spend the attempt budget
// first.
func TestConsumerDeadLettersEachPermanentErrorAtFirstAttempt(t *testing.T) {
	decline := effects.Refused("stripe.PaymentIntents", "k", errors.New("card_declined: insufficient_funds"))
	cases := []struct {
		name     string
		err      error
		attempts int64
	}{
		{"refused (card decline)", decline, 1},
		{"refused in a plan step", &effects.StepError{Step: "charge", Key: "k", Err: decline}, 1},
		{"key reused", &effects.Error{Kind: effects.ErrKeyReused, Op: "postgres.Apply", Key: "k"}, 1},
		{"invalid key", fmt.Errorf("building the key: %w", effects.Key("").Validate()), 1},
		{"poison", fmt.Errorf("decoding: %w: %w", effects.ErrPoison, errors.New("unexpected EOF")), 1},
		{"panic", &effects.PanicError{Where: "test", Value: "boom"}, 1},
		{"permanent over retryable", effects.Ambiguous("x", "k", effects.Refused("y", "k", nil)), 1},
		{"ambiguous", effects.Ambiguous("postgres.Apply", "k", errors.New("lost reply")), 4},
		{"transient", effects.Transient("postgres.Apply", "k", errors.New("connection refused")), 4},
		{"unclassified (the application's own)", errors.New("downstream said 503"), 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := newMemSource(delivery("evt", "p"))
			var attempts atomic.Int64
			h := func(context.Context, effects.Delivery) error { attempts.Add(1); return tc.err }
			hooks := &hookLog{}
			c := newConsumer(t, src, h, consume.WithMaxAttempts(4), consume.WithBackoff(time.Millisecond, 2*time.Millisecond),
				consume.WithDeadLetter(hooks.hook), consume.WithObserver(&events{}))
			stop := start(t, c)
			waitFor(t, 10*time.Second, "the ack", func() bool { return src.totalAcks() == 1 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			ids, errs := hooks.got()
			if attempts.Load() != tc.attempts || len(ids) != 1 {
				t.Fatalf("%d attempts, %d hook calls; want %d and 1", attempts.Load(), len(ids), tc.attempts)
			}
			if errs[0] != tc.err {
				t.Errorf("hook got %v; want the handler's error itself", errs[0])
			}
			hooks.mu.Lock()
			gotAttempt := hooks.attempts[0]
			hooks.mu.Unlock()
			if int64(gotAttempt) != tc.attempts {
				t.Errorf("hook's delivery says attempt %d; want %d, the attempts made", gotAttempt, tc.attempts)
			}
			st := c.Stats()
			if st.DeadLettered != 1 || st.Retried != tc.attempts-1 || st.Parked != 0 {
				t.Errorf("Stats = %+v; want DeadLettered 1, Retried %d", st, tc.attempts-1)
			}
		})
	}
}

// crashedLease begins key in j as a worker that crashed mid-send would
// have: the lease taken, the effect's outcome never recorded.
func crashedLease(t *testing.T, j *memjournal.Journal, key effects.Key, lease time.Duration) {
	t.Helper()
	if _, err := j.Begin(context.Background(), key, []byte("mail"), lease); err != nil {
		t.Fatal(err)
	}
}

// sendMail returns a handler that sends one mail per delivery through a
// journaled effect on j, counting the sends.
func sendMail(t *testing.T, j *memjournal.Journal, lease time.Duration, send func(ctx context.Context) error) consume.Handler {
	t.Helper()
	jd, err := journal.NewJournaled("test.Mail", j, journal.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	return func(ctx context.Context, d effects.Delivery) error {
		key, err := effects.NewKey("shop", d.ID, "mail")
		if err != nil {
			return err
		}
		_, err = jd.Apply(ctx, key, []byte("mail"), func(ctx context.Context, _ *journal.Attempt) (effects.Result, error) {
			if err := send(ctx); err != nil {
				return effects.Result{}, effects.Ambiguous("test.Mail", key, err)
			}
			return effects.Result{Status: effects.Applied, Ref: "250 ok"}, nil
		})
		return err
	}
}

// TestConsumerWaitsOutALeaseAfterACrash is the repro: a worker
// crashed mid-send and left the mail's key leased for 60 s. The restarted
// worker's attempts answer ErrInFlight; they spend no attempt (the budget
// is 2) and nothing is dead-lettered; once the lease has expired the
// worker takes the key over and sends, once.
func TestConsumerWaitsOutALeaseAfterACrash(t *testing.T) {
	const lease = 60 * time.Second
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	j := memjournal.New(clock)
	key, _ := effects.NewKey("shop", "order-7", "mail")
	crashedLease(t, j, key, lease)

	var sends atomic.Int64
	h := sendMail(t, j, lease, func(context.Context) error { sends.Add(1); return nil })
	src := newMemSource(delivery("order-7", "p0"))
	obs := &events{}
	c := newConsumer(t, src, h, consume.WithMaxAttempts(2), consume.WithBackoff(time.Millisecond, 5*time.Millisecond),
		refuseOnDeadLetter(t), consume.WithObserver(obs))
	stop := start(t, c)
	waitFor(t, 10*time.Second, "ten waits for the lease", func() bool { return c.Stats().InFlight >= 10 })
	if src.totalAcks() != 0 || sends.Load() != 0 {
		t.Fatalf("acked %d, sent %d while the lease was held", src.totalAcks(), sends.Load())
	}
	mu.Lock()
	now = now.Add(lease + time.Second)
	mu.Unlock()
	waitFor(t, 10*time.Second, "the ack after the lease", func() bool { return src.totalAcks() == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := sends.Load(); n != 1 {
		t.Errorf("%d mails sent, want 1", n)
	}
	st := c.Stats()
	if st.Retried != 0 || st.DeadLettered != 0 || st.Failed != 0 {
		t.Errorf("Stats = %+v; the waits must be neither retries nor failures", st)
	}
	waits := obs.of(effects.EventInFlight)
	if int64(len(waits)) != st.InFlight || waits[0].Attempt != 1 || waits[len(waits)-1].Attempt != 1 ||
		!errors.Is(waits[0].Err, effects.ErrInFlight) {
		t.Errorf("%d EventInFlight (Stats.InFlight %d), first %+v; want one per wait, each at attempt 1", len(waits), st.InFlight, waits[0])
	}
	if r := j.Get(key); !r.Done || r.Attempt != 2 {
		t.Errorf("journal record %+v; want done by the second attempt at the key", r)
	}
}

// TestConsumerWaitsNoLongerThanTheLease: the pause after ErrInFlight is
// bounded by the rest of the other attempt's lease that the error
// reports: with a backoff of 20 s and a lease of 200 ms, the delivery is
// applied long before the backoff would have let it.
func TestConsumerWaitsNoLongerThanTheLease(t *testing.T) {
	const lease = 200 * time.Millisecond
	j := memjournal.New(nil)
	key, _ := effects.NewKey("shop", "order-8", "mail")
	began := time.Now() // before the lease is taken, so its end is at or after began+lease
	crashedLease(t, j, key, lease)
	var sends atomic.Int64
	h := sendMail(t, j, lease, func(context.Context) error { sends.Add(1); return nil })
	src := newMemSource(delivery("order-8", "p0"))
	c := newConsumer(t, src, h, consume.WithBackoff(20*time.Second, 20*time.Second), refuseOnDeadLetter(t),
		consume.WithObserver(&events{}))
	stop := start(t, c)
	waitFor(t, 8*time.Second, "the ack (a backoff of 10-20 s would be later)", func() bool { return src.totalAcks() == 1 })
	took := time.Since(began)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if took < lease {
		t.Errorf("applied after %v, before the %v lease expired", took, lease)
	}
	if st := c.Stats(); st.InFlight != 1 || sends.Load() != 1 {
		t.Errorf("Stats %+v, %d sends; want one wait and one send", st, sends.Load())
	}
}

// TestConsumerInFlightForEverEnds: an adapter that answers ErrInFlight
// for ever is waited for only WithInFlightWait; after that its answers
// count as failed attempts, and the delivery reaches the hook with the
// in-flight error.
func TestConsumerInFlightForEverEnds(t *testing.T) {
	src := newMemSource(delivery("stuck", "p0"), delivery("next", "p0"))
	inFlight := &effects.Error{Kind: effects.ErrInFlight, Op: "liar.Apply", Key: "k", RetryAfter: time.Hour}
	h := func(_ context.Context, d effects.Delivery) error {
		if d.ID == "stuck" {
			return inFlight
		}
		return nil
	}
	hooks := &hookLog{}
	c := newConsumer(t, src, h, consume.WithMaxAttempts(3), consume.WithBackoff(time.Millisecond, 5*time.Millisecond),
		consume.WithInFlightWait(100*time.Millisecond), consume.WithDeadLetter(hooks.hook), consume.WithObserver(&events{}))
	stop := start(t, c)
	waitFor(t, 10*time.Second, "both acks", func() bool { return src.totalAcks() == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	ids, errs := hooks.got()
	if !slices.Equal(ids, []string{"stuck"}) || !errors.Is(errs[0], effects.ErrInFlight) {
		t.Fatalf("dead-lettered %v with %v; want stuck, in flight", ids, errs)
	}
	if st := c.Stats(); st.InFlight < 2 || st.Retried != 2 || st.DeadLettered != 1 {
		t.Errorf("Stats = %+v; want waits, then 2 retries and the dead letter", st)
	}
}

// TestConsumerConfigErrorStopsRun: a configuration error (a rotated API
// key) stops Run with an error that names the setting. The delivery that
// met it is neither acked nor dead-lettered, nothing after it in its
// Ordering runs, the handler already running elsewhere finishes and is
// acked, and nothing new starts.
func TestConsumerConfigErrorStopsRun(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "handler", true: "batch handler"}[batch], func(t *testing.T) {
			ds := []effects.Delivery{delivery("a-1", "a"), delivery("a-2", "a"), delivery("b-1", "b")}
			for i := range 20 {
				ds = append(ds, delivery(fmt.Sprintf("later-%02d", i), fmt.Sprintf("o%d", i)))
			}
			src := newMemSource(ds...)
			rotated := &effects.ConfigError{Op: "stripe.PaymentIntents", Option: "API key", Reason: "401: the key was rejected"}
			bRunning := make(chan struct{})
			configFailed := make(chan struct{})
			var handled sync.Map
			var afterStop atomic.Int64
			handle := func(ctx context.Context, d effects.Delivery) error {
				select {
				case <-configFailed:
					afterStop.Add(1)
				default:
				}
				handled.Store(d.ID, true)
				switch d.ID {
				case "a-1":
					<-bRunning
					defer close(configFailed)
					return &effects.StepError{Step: "charge", Key: "k", Err: rotated}
				case "b-1":
					close(bRunning)
					<-configFailed
					time.Sleep(20 * time.Millisecond) // still running while Run stops
					return nil
				}
				return nil
			}
			opts := []consume.Option{refuseOnDeadLetter(t), consume.WithObserver(&events{}), consume.WithConcurrency(2),
				consume.WithMaxPending(3)}
			var h consume.Handler = handle
			if batch {
				h = nil
				opts = append(opts, consume.WithBatch(1, 0, func(ctx context.Context, ds []effects.Delivery) []error {
					return []error{handle(ctx, ds[0])}
				}))
			}
			c := newConsumer(t, src, h, opts...)
			var err error
			select {
			case err = <-runErr(t, c):
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not stop after the configuration error")
			}
			var ce *effects.ConfigError
			if !errors.Is(err, effects.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Option != "API key" ||
				!strings.Contains(err.Error(), `"a-1"`) {
				t.Fatalf("Run = %v; want the configuration error naming the setting and the delivery", err)
			}
			if src.ackCount("a-1") != 0 || src.ackCount("b-1") != 1 {
				t.Errorf("acks: a-1 %d, b-1 %d; want 0 and 1 (b-1 was running, its effects are done)",
					src.ackCount("a-1"), src.ackCount("b-1"))
			}
			if _, ok := handled.Load("a-2"); ok {
				t.Error("a-2, behind a-1 in its Ordering, ran after the configuration error")
			}
			if n := afterStop.Load(); n != 0 {
				t.Errorf("%d attempts started after the configuration error", n)
			}
			if st := c.Stats(); st.DeadLettered != 0 || st.Retried != 0 || st.Acked != 1 || st.Failed != 1 {
				t.Errorf("Stats = %+v; want one failure, one ack, no retry or dead letter", st)
			}
		})
	}
}

// TestConsumerHookConfigErrorStopsRun: a dead-letter hook that answers a
// configuration error (its topic does not exist) stops Run too, and the
// delivery stays unacked.
func TestConsumerHookConfigErrorStopsRun(t *testing.T) {
	src := newMemSource(delivery("poison", "p"))
	h := func(context.Context, effects.Delivery) error { return fmt.Errorf("%w: bad JSON", effects.ErrPoison) }
	missing := &effects.ConfigError{Op: "kafka.DeadLetterTopic", Option: "topic", Reason: "unknown topic \"dlq\""}
	hook := func(context.Context, effects.Delivery, error) error { return missing }
	c := newConsumer(t, src, h, consume.WithDeadLetter(hook), consume.WithObserver(&events{}))
	var err error
	select {
	case err = <-runErr(t, c):
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop after the hook's configuration error")
	}
	var ce *effects.ConfigError
	if !errors.As(err, &ce) || ce != missing {
		t.Fatalf("Run = %v; want the hook's configuration error", err)
	}
	if src.totalAcks() != 0 || c.Stats().DeadLettered != 0 {
		t.Errorf("acked %d, dead-lettered %d; want 0 and 0", src.totalAcks(), c.Stats().DeadLettered)
	}
}

// TestConsumerRecoversPanics: a panic in a handler becomes a
// *effects.PanicError that is dead-lettered at once, with "panic" and the
// stack in what the hook and the observer get; the other Orderings go on,
// and so does the process.
func TestConsumerRecoversPanics(t *testing.T) {
	src := newMemSource(delivery("a-1", "a"), delivery("a-2", "a"), delivery("b-1", "b"), delivery("b-2", "b"))
	h := func(_ context.Context, d effects.Delivery) error {
		if d.ID == "a-1" {
			var m map[string]int
			m["boom"]++ // assignment to entry in nil map
		}
		return nil
	}
	hooks := &hookLog{}
	obs := &events{}
	c := newConsumer(t, src, h, consume.WithDeadLetter(hooks.hook), consume.WithObserver(obs))
	runUntilAcked(t, c, src, 4)
	ids, errs := hooks.got()
	if !slices.Equal(ids, []string{"a-1"}) {
		t.Fatalf("dead-lettered %v, want [a-1]", ids)
	}
	var pe *effects.PanicError
	if !errors.As(errs[0], &pe) || !errors.Is(errs[0], effects.ErrPanic) || effects.ClassOf(errs[0]) != effects.Permanent ||
		!strings.Contains(errs[0].Error(), "panic") || !strings.Contains(string(pe.Stack), "policy_test.go") {
		t.Fatalf("hook got %v; want a permanent *PanicError with the handler's stack", errs[0])
	}
	dl := obs.of(effects.EventDeadLettered)
	if len(dl) != 1 || !errors.As(dl[0].Err, &pe) || dl[0].Attempt != 1 {
		t.Errorf("EventDeadLettered = %+v; want a-1's panic at attempt 1", dl)
	}
	if want := []string{"a-1", "a-2", "b-1", "b-2"}; !slices.Equal(sortedAcks(src), want) {
		t.Errorf("acked %v, want %v", sortedAcks(src), want)
	}
}

func sortedAcks(s *memSource) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(slices.Values(s.acked))
}

// TestConsumerRecoversBatchPanics: a panic in a batch handler is
// recovered; each delivery of the batch is then handed to it alone, so
// only the one that panics by itself is dead-lettered, and the rest of its
// batch is acked, in order.
func TestConsumerRecoversBatchPanics(t *testing.T) {
	src := newMemSource(delivery("a-1", "a"), delivery("a-2", "a"), delivery("a-3", "a"), delivery("b-1", "b"))
	var mu sync.Mutex
	var calls [][]string
	bh := func(_ context.Context, ds []effects.Delivery) []error {
		mu.Lock()
		calls = append(calls, ids(ds))
		mu.Unlock()
		for _, d := range ds {
			if d.ID == "a-2" {
				panic("a-2 is poison")
			}
		}
		return make([]error, len(ds))
	}
	hooks := &hookLog{}
	c := newConsumer(t, src, nil, consume.WithBatch(10, time.Second, bh), consume.WithConcurrency(1), consume.WithMaxPending(4),
		consume.WithDeadLetter(hooks.hook), consume.WithObserver(&events{}))
	runUntilAcked(t, c, src, 4)
	ids, errs := hooks.got()
	var pe *effects.PanicError
	if !slices.Equal(ids, []string{"a-2"}) || !errors.As(errs[0], &pe) || pe.Value != "a-2 is poison" {
		t.Fatalf("dead-lettered %v with %v; want a-2's panic", ids, errs)
	}
	mu.Lock()
	defer mu.Unlock()
	want := [][]string{{"a-1", "a-2", "a-3", "b-1"}, {"a-1"}, {"a-2"}, {"a-3"}, {"b-1"}}
	if !slices.EqualFunc(calls, want, slices.Equal) {
		t.Errorf("batch handler calls %v, want %v", calls, want)
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if !slices.Equal(src.acked, []string{"a-1", "a-2", "a-3", "b-1"}) {
		t.Errorf("acked %v; want the batch's order", src.acked)
	}
}

// panicky is an effect that panics.
type panicky struct{}

func (panicky) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "test"}
}

func (panicky) Apply(context.Context, effects.Key, string) (effects.Result, error) {
	panic("receipt template missing")
}

// TestConsumerPlanConcurrentStepPanic: a panic in a Concurrent() step of
// a plan, on a goroutine of the plan's own, reaches the consumer as the
// step's *effects.PanicError and is dead-lettered; the process goes on.
func TestConsumerPlanConcurrentStepPanic(t *testing.T) {
	ledger := &memoryEffect{done: map[effects.Key]string{}}
	plan, err := effects.NewPlan("shop",
		effects.EventStep[string]("ledger", ledger),
		effects.EventStep[string]("mail", ledger).Concurrent(),
		effects.EventStep[string]("receipt", panicky{}).Concurrent(),
	)
	if err != nil {
		t.Fatal(err)
	}
	src := newMemSource(delivery("order-1", "p"), delivery("order-2", "q"))
	h := func(ctx context.Context, d effects.Delivery) error {
		_, err := plan.Run(ctx, d.ID, string(d.Body))
		return err
	}
	hooks := &hookLog{}
	c := newConsumer(t, src, h, consume.WithDeadLetter(hooks.hook), consume.WithObserver(&events{}))
	runUntilAcked(t, c, src, 2)
	ids, errs := hooks.got()
	var pe *effects.PanicError
	var se *effects.StepError
	if len(ids) != 2 || !errors.As(errs[0], &pe) || !errors.As(errs[0], &se) || se.Step != "receipt" {
		t.Fatalf("dead-lettered %v with %v; want both, with the receipt step's panic", ids, errs)
	}
	if st := c.Stats(); st.Retried != 0 || st.DeadLettered != 2 {
		t.Errorf("Stats = %+v; want 2 dead letters at the first attempt", st)
	}
}

// TestConsumerAttemptTimeout: each attempt runs under the time limit; a
// handler stuck until its context ends is cut, its error wraps
// ErrAttemptTimeout and the context's, the cut counts in Stats.TimedOut,
// and the retry succeeds. Without the option, attempts get the default
// limit.
func TestConsumerAttemptTimeout(t *testing.T) {
	t.Run("cut and retried", func(t *testing.T) {
		src := newMemSource(delivery("hung", "p"))
		var attempts atomic.Int64
		h := func(ctx context.Context, d effects.Delivery) error {
			if attempts.Add(1) == 1 {
				<-ctx.Done() // a dead TCP path: only the deadline ends it
				return ctx.Err()
			}
			return nil
		}
		obs := &events{}
		c := newConsumer(t, src, h, consume.WithAttemptTimeout(50*time.Millisecond),
			consume.WithBackoff(time.Millisecond, time.Millisecond), refuseOnDeadLetter(t), consume.WithObserver(obs))
		runUntilAcked(t, c, src, 1)
		r := obs.of(effects.EventRetried)
		if len(r) != 1 || !errors.Is(r[0].Err, consume.ErrAttemptTimeout) || !errors.Is(r[0].Err, context.DeadlineExceeded) ||
			r[0].Duration < 50*time.Millisecond {
			t.Fatalf("EventRetried = %+v; want the first attempt cut at its limit", r)
		}
		if st := c.Stats(); st.TimedOut != 1 || st.Retried != 1 || st.Acked != 1 {
			t.Errorf("Stats = %+v; want one cut attempt, retried and acked", st)
		}
	})
	t.Run("default", func(t *testing.T) {
		src := newMemSource(delivery("evt", ""))
		var left atomic.Int64
		h := func(ctx context.Context, d effects.Delivery) error {
			if dl, ok := ctx.Deadline(); ok {
				left.Store(int64(time.Until(dl)))
			}
			return nil
		}
		c := newConsumer(t, src, h, refuseOnDeadLetter(t))
		runUntilAcked(t, c, src, 1)
		const defaultLimit = time.Minute // WithAttemptTimeout's default
		if l := time.Duration(left.Load()); l <= defaultLimit-10*time.Second || l > defaultLimit {
			t.Errorf("handler's deadline %v away; want about the default limit (%v)", l, defaultLimit)
		}
	})
}

// TestConsumerAttemptTimeoutThenLease: an attempt cut mid-send leaves the
// mail's key leased (the outcome is unknown); the retry waits the lease
// out without spending attempts and then sends, so a budget of two
// attempts is enough and nothing is dead-lettered.
func TestConsumerAttemptTimeoutThenLease(t *testing.T) {
	const lease = 400 * time.Millisecond
	j := memjournal.New(nil)
	var sends atomic.Int64
	h := sendMail(t, j, lease, func(ctx context.Context) error {
		if sends.Add(1) == 1 {
			<-ctx.Done() // the SMTP server hangs
			return ctx.Err()
		}
		return nil
	})
	src := newMemSource(delivery("order-9", "p"))
	c := newConsumer(t, src, h, consume.WithAttemptTimeout(100*time.Millisecond), consume.WithMaxAttempts(2),
		consume.WithBackoff(time.Millisecond, 50*time.Millisecond), refuseOnDeadLetter(t), consume.WithObserver(&events{}))
	runUntilAcked(t, c, src, 1)
	if st := c.Stats(); st.TimedOut != 1 || st.InFlight < 1 || st.Retried != 1 || sends.Load() != 2 {
		t.Errorf("Stats = %+v, %d sends; want the cut, waits for the lease, one retry, and the second send", st, sends.Load())
	}
}

// TestConsumerParksWithoutHook: with WithoutDeadLetter, a delivery given
// up on is parked: held unacked and retried every max backoff while its
// Ordering waits; the default log says so once, not at every round; Stats
// shows it parked; when it succeeds it is acked and no longer parked.
func TestConsumerParksWithoutHook(t *testing.T) {
	var buf syncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })

	src := newMemSource(delivery("poison", "a"), delivery("behind", "a"), delivery("other", "b"))
	var heal atomic.Bool
	var rounds atomic.Int64
	h := func(_ context.Context, d effects.Delivery) error {
		if d.ID == "poison" && !heal.Load() {
			rounds.Add(1)
			return fmt.Errorf("%w: bad JSON", effects.ErrPoison)
		}
		return nil
	}
	c := newConsumer(t, src, h, consume.WithoutDeadLetter(), consume.WithBackoff(time.Millisecond, 2*time.Millisecond))
	stop := start(t, c)
	waitFor(t, 10*time.Second, "twenty rounds", func() bool { return rounds.Load() >= 20 })
	if st := c.Stats(); st.Parked != 1 || st.Failed < 19 || st.Acked != 1 || src.ackCount("behind") != 0 {
		t.Errorf("Stats = %+v, behind acked %d; want 1 parked, a failure per round, only other acked", st, src.ackCount("behind"))
	}
	heal.Store(true) // the code was fixed; in real life: a restart
	waitFor(t, 10*time.Second, "every ack", func() bool { return src.totalAcks() == 3 })
	if st := c.Stats(); st.Parked != 0 {
		t.Errorf("Stats = %+v; want nothing parked once it succeeded", st)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if n := strings.Count(out, "\n"); n != 1 || !strings.Contains(out,
		`level=WARN msg="consume.Consumer: delivery parked; its Ordering waits" delivery_id=poison attempt=1 class=poison error="permanent error, no dead-letter hook (WithoutDeadLetter); parked, retrying every 2ms: poison delivery: retrying cannot succeed: bad JSON"`) {
		t.Errorf("log has %d lines; want the one line saying poison was parked:\n%s", n, out)
	}
}

// TestConsumerParkedGaugeResetsAfterRun: deliveries parked when Run
// returns are unacked, delivered again, and no longer parked here.
func TestConsumerParkedGaugeResetsAfterRun(t *testing.T) {
	src := newMemSource(delivery("poison", "a"), delivery("down", "b"))
	h := func(_ context.Context, d effects.Delivery) error {
		if d.ID == "poison" {
			return fmt.Errorf("%w: bad JSON", effects.ErrPoison)
		}
		return errors.New("database is down")
	}
	c := newConsumer(t, src, h, consume.WithoutDeadLetter(), consume.WithMaxAttempts(2),
		consume.WithBackoff(time.Millisecond, 2*time.Millisecond), consume.WithObserver(&events{}))
	stop := start(t, c)
	waitFor(t, 10*time.Second, "both parked", func() bool { return c.Stats().Parked == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Parked != 0 || st.Acked != 0 {
		t.Errorf("Stats after Run = %+v; want nothing parked or acked", st)
	}
}

// TestConsumerWrapsErrorsOnce: the hook and the observer's retry and
// dead-letter events get the handler's error itself; what the consumer
// adds to a failure it reports (parked, shutdown) wraps it once, and the
// default log line is one line with the error's text once.
func TestConsumerWrapsErrorsOnce(t *testing.T) {
	var buf syncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })

	inner := effects.Transient("postgres.Apply", "k", errors.New("connection refused"))
	handlerErr := &effects.StepError{Step: "ledger", Key: "k", Err: inner}
	src := newMemSource(delivery("evt", "p"))
	h := func(context.Context, effects.Delivery) error { return handlerErr }
	var hookCalls atomic.Int64
	hook := func(_ context.Context, _ effects.Delivery, err error) error {
		if hookCalls.Add(1) == 1 {
			return errors.New("dead-letter topic unreachable")
		}
		return nil
	}
	c := newConsumer(t, src, h, consume.WithMaxAttempts(2), consume.WithBackoff(time.Millisecond, time.Millisecond),
		consume.WithDeadLetter(hook))
	runUntilAcked(t, c, src, 1)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d log lines, want 3 (retry, parked after the hook failed, dead letter):\n%s", len(lines), buf.String())
	}
	for _, l := range lines {
		if n := strings.Count(l, "connection refused"); n != 1 {
			t.Errorf("the cause appears %d times in %q", n, l)
		}
		if n := strings.Count(l, "(retry later with the same key)"); n != 1 {
			t.Errorf("the advice appears %d times in %q", n, l)
		}
	}
	for i, want := range []string{
		`level=INFO msg="consume.Consumer: attempt failed; retrying" delivery_id=evt attempt=1 class=retryable error="plan step \"ledger\"`,
		`level=WARN msg="consume.Consumer: delivery parked; its Ordering waits" delivery_id=evt attempt=2 class=retryable error="gave up after 2 attempts, and the dead-letter hook failed (dead-letter topic unreachable); parked, retrying every 1ms: plan step`,
		`level=WARN msg="consume.Consumer: delivery dead-lettered" delivery_id=evt attempt=3 class=retryable error="plan step`,
	} {
		if !strings.HasPrefix(strings.SplitN(lines[i], " ", 2)[1], want) {
			t.Errorf("line %d = %s\nwant it to start (after the time) with %s", i+1, lines[i], want)
		}
	}
}

// TestConsumerLogsPanicStackOnce: the default log line of a dead-lettered
// panic carries its stack; the retry lines of ordinary errors carry none.
func TestConsumerLogsPanicStackOnce(t *testing.T) {
	var buf syncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	src := newMemSource(delivery("evt", ""))
	c := newConsumer(t, src, func(context.Context, effects.Delivery) error { panic("boom") },
		consume.WithDeadLetter(func(context.Context, effects.Delivery, error) error { return nil }))
	runUntilAcked(t, c, src, 1)
	out := buf.String()
	if !strings.Contains(out, `msg="consume.Consumer: delivery dead-lettered" delivery_id=evt attempt=1 class=permanent error="panic in consume.Handler: boom" stack=`) ||
		!strings.Contains(out, "policy_test.go") {
		t.Errorf("log lacks the panic's line with its stack:\n%s", out)
	}
}
