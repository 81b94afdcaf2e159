package kafka_test

// An consume.Consumer on a ShareSource, against kfake and a real
// PostgreSQL: retries released to the broker, the delivery limit, dead
// letters, and a lock that expires under a running handler.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/kafka"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// shareLedger is a postgres effect that inserts a ledger row per event id,
// in a table without a unique index: only the effect's dedup row keeps
// duplicates out. rows counts the ledger rows per id.
func shareLedger(t *testing.T) (fx *postgres.Effect[string], rows func() map[string]int) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (id bigserial, event_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	fx, err = postgres.New(pool, "share-test", func(ctx context.Context, tx pgx.Tx, id string) (string, error) {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (event_id) VALUES ($1)`, id)
		return "", err
	})
	if err != nil {
		t.Fatal(err)
	}
	return fx, func() map[string]int {
		rs, _ := pool.Query(ctx, `SELECT event_id, count(*) FROM ledger GROUP BY event_id`)
		out := map[string]int{}
		var id string
		var n int
		if _, err := pgx.ForEachRow(rs, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
}

func applyLedger(ctx context.Context, fx *postgres.Effect[string], d effects.Delivery) (effects.Result, error) {
	key, err := effects.NewKey("share-test", d.ID, "ledger")
	if err != nil {
		return effects.Result{}, err
	}
	return fx.Apply(ctx, key, d.ID)
}

// runConsumer runs a consumer of src until the test ends.
func runConsumer(t *testing.T, src effects.Source, h consume.Handler, opts ...consume.Option) *consume.Consumer {
	t.Helper()
	cons, err := consume.New(src, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return cons
}

// eventually polls cond until it holds or 30 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestShareConsumerReleaseThenDeadLetter: a record whose handler always
// fails is released back to the broker after each backoff (its delivery
// count, the consumer's attempt, rising), until its last allowed delivery:
// there Release refuses, the consumer retries in place, and after
// WithMaxAttempts hands it to the dead-letter hook, whose success accepts
// it. Without the refusal, the broker would archive the record on its
// fourth release and the hook would never run.
func TestShareConsumerReleaseThenDeadLetter(t *testing.T) {
	const limit = 3
	c, topic, group := shareCluster(t, 1, shareTestLock, limit)
	produceN(t, c, topic, 1, 1)
	src := newShareSource(t, c, group, topic, kafka.WithDeliveryLimit(limit), kafka.WithShareMembers(1))
	var (
		mu       sync.Mutex
		attempts []int // Delivery.Attempt per handler call
		dead     = make(chan effects.Delivery, 1)
	)
	cons := runConsumer(t, src, func(_ context.Context, d effects.Delivery) error {
		mu.Lock()
		attempts = append(attempts, d.Attempt)
		mu.Unlock()
		return errors.New("downstream says no")
	}, consume.WithMaxAttempts(limit+2), consume.WithBackoff(time.Millisecond, 5*time.Millisecond),
		consume.WithDeadLetter(func(_ context.Context, d effects.Delivery, _ error) error {
			dead <- d
			return nil
		}))
	var d effects.Delivery
	select {
	case d = <-dead:
	case <-time.After(30 * time.Second):
		mu.Lock()
		t.Fatalf("not dead-lettered; handler saw attempts %v, stats %+v", attempts, cons.Stats())
	}
	eventually(t, "the ack after the dead letter", func() bool { return cons.Stats().Acked == 1 })
	mu.Lock()
	got := append([]int(nil), attempts...)
	mu.Unlock()
	// Deliveries 1 and 2 released; delivery 3 kept and tried 3 times in
	// place (attempts 3, 4, 5 of WithMaxAttempts(5)).
	if want := []int{1, 2, 3, 3, 3}; len(got) != len(want) || got[0] != 1 || got[1] != 2 || got[4] != 3 {
		t.Errorf("handler saw delivery counts %v, want %v", got, want)
	}
	// The hook sees the attempts made: 2 deliveries released, then 3
	// tries of the last one in place.
	if d.Attempt != limit+2 {
		t.Errorf("dead-lettered after %d attempts, want %d", d.Attempt, limit+2)
	}
	st := cons.Stats()
	if st.Released != limit-1 || st.DeadLettered != 1 {
		t.Errorf("stats %+v, want %d released and 1 dead-lettered", st, limit-1)
	}
	// Accepted: it does not come back past its lock.
	time.Sleep(shareTestLock + time.Second)
	if n := cons.Stats().Delivered; n != limit {
		t.Errorf("%d deliveries, want %d: the dead-lettered record came back", n, limit)
	}
}

// TestShareConsumerLockExpiryAbsorbed: member A's handler outlives the
// acquisition lock without renewing it (a frozen process: its renewal is
// switched off); the broker hands the record out again (to member B, or to
// A's own poller), and the second delivery applies the effect while the
// first handler still runs. The first handler's effect then replays, its
// ack reports ErrLockExpired, and the ledger holds one row.
func TestShareConsumerLockExpiryAbsorbed(t *testing.T) {
	c, topic, group := shareCluster(t, 1, shareTestLock, 0)
	produceN(t, c, topic, 1, 1)
	fx, rows := shareLedger(t)
	var (
		first    atomic.Bool
		started  = make(chan struct{})
		resume   = make(chan struct{})
		firstRes atomic.Value
		again    = make(chan effects.Delivery, 4)
		ackErrs  atomic.Int64
	)
	h := func(ctx context.Context, d effects.Delivery) error {
		if first.CompareAndSwap(false, true) {
			close(started)
			select { // frozen past the lock
			case <-resume:
			case <-ctx.Done():
				return ctx.Err()
			}
			r, err := applyLedger(ctx, fx, d)
			if err == nil {
				firstRes.Store(r)
			}
			return err
		}
		r, err := applyLedger(ctx, fx, d)
		if err == nil && !r.Replayed() {
			again <- d
		}
		return err
	}
	obs := consume.WithObserver(effects.ObserverFunc(func(_ context.Context, ev effects.Event) {
		if ev.Kind == effects.EventFailed && errors.Is(ev.Err, kafka.ErrLockExpired) {
			ackErrs.Add(1)
		}
	}))
	frozen := newShareSource(t, c, group, topic, kafka.WithShareMembers(1),
		kafka.WithRenewBefore(time.Millisecond), kafka.WithLockMargin(0))
	runConsumer(t, frozen, h, obs, consume.WithoutDeadLetter())
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("member A did not start the handler")
	}
	healthy := newShareSource(t, c, group, topic, kafka.WithShareMembers(1))
	runConsumer(t, healthy, h, obs, consume.WithoutDeadLetter())
	var d effects.Delivery
	select {
	case d = <-again:
	case <-time.After(30 * time.Second):
		t.Fatal("the record whose lock expired was not delivered again")
	}
	if d.Attempt < 2 {
		t.Errorf("the second delivery's attempt is %d, want 2 or more", d.Attempt)
	}
	close(resume) // the first handler wakes up, still on the same record
	eventually(t, "the first handler's late ack", func() bool { return ackErrs.Load() == 1 })
	if r, _ := firstRes.Load().(effects.Result); !r.Replayed() {
		t.Errorf("the first handler's late effect %v, want a replay", r)
	}
	if got := rows(); len(got) != 1 || got[d.ID] != 1 {
		t.Errorf("ledger rows %v, want one for %s", got, d.ID)
	}
}

// TestShareConsumerLongEffectRenewed: a handler that runs for two locks'
// time keeps its record: the source renews the lock in the background, so
// a second member never gets it, and the late Ack is accepted.
func TestShareConsumerLongEffectRenewed(t *testing.T) {
	c, topic, group := shareCluster(t, 1, shareTestLock, 0)
	produceN(t, c, topic, 1, 1)
	started := make(chan struct{})
	var calls atomic.Int64
	consA := runConsumer(t, newShareSource(t, c, group, topic, kafka.WithShareMembers(1)), func(ctx context.Context, d effects.Delivery) error {
		if calls.Add(1) == 1 {
			close(started)
		}
		select {
		case <-time.After(2*shareTestLock + time.Second):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, consume.WithoutDeadLetter())
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start")
	}
	other := newShareSource(t, c, group, topic, kafka.WithShareMembers(1))
	consB := runConsumer(t, other, func(context.Context, effects.Delivery) error { return nil }, consume.WithoutDeadLetter())
	eventually(t, "the long handler's ack", func() bool { return consA.Stats().Acked == 1 })
	time.Sleep(time.Second) // a redelivery would have had time to arrive
	if n := consB.Stats().Delivered; n != 0 {
		t.Errorf("the second member got %d deliveries of a record whose lock was being renewed", n)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
}
