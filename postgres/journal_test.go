package postgres_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/postgres"
)

func TestJournal(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	j, err := postgres.NewJournal(pool, "email")
	if err != nil {
		t.Fatal(err)
	}
	fp := effects.Fingerprint([]byte("receipt for evt_1"))

	t.Run("begin, complete, then replay", func(t *testing.T) {
		ctx := testCtx(t)
		key := effects.MustKey("evt_j1", "email")
		rec, err := j.Begin(ctx, key, fp, time.Minute)
		if err != nil || rec != (journal.Record{Attempt: 1}) {
			t.Fatalf("Begin = %+v, %v; want attempt 1, not done", rec, err)
		}
		if err := j.Complete(ctx, key, "250 2.0.0 queued as A1"); err != nil {
			t.Fatal(err)
		}
		rec, err = j.Begin(ctx, key, fp, time.Minute)
		if err != nil || rec != (journal.Record{Done: true, Ref: "250 2.0.0 queued as A1", Attempt: 1}) {
			t.Fatalf("Begin after Complete = %+v, %v; want done with the ref", rec, err)
		}
		if err := j.Complete(ctx, key, "another ref"); err != nil {
			t.Fatalf("second Complete: %v", err)
		}
		if rec, _ := j.Begin(ctx, key, fp, time.Minute); rec.Ref != "250 2.0.0 queued as A1" {
			t.Fatalf("second Complete replaced the ref: %+v", rec)
		}
	})

	t.Run("live lease is in flight", func(t *testing.T) {
		ctx := testCtx(t)
		key := effects.MustKey("evt_j2", "email")
		if _, err := j.Begin(ctx, key, fp, time.Minute); err != nil {
			t.Fatal(err)
		}
		_, err := j.Begin(ctx, key, fp, time.Minute)
		if !errors.Is(err, effects.ErrInFlight) || effects.ClassOf(err) != effects.Retryable {
			t.Fatalf("second Begin = %v; want ErrInFlight", err)
		}
	})

	t.Run("expired lease is taken over with attempt 2", func(t *testing.T) {
		ctx := testCtx(t)
		key := effects.MustKey("evt_j3", "email")
		if _, err := j.Begin(ctx, key, fp, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		rec, err := j.Begin(ctx, key, fp, time.Minute)
		if err != nil || rec != (journal.Record{Attempt: 2}) {
			t.Fatalf("Begin after expiry = %+v, %v; want attempt 2", rec, err)
		}
		if _, err := j.Begin(ctx, key, fp, time.Minute); !errors.Is(err, effects.ErrInFlight) {
			t.Fatalf("Begin during the takeover's lease = %v; want ErrInFlight", err)
		}
	})

	t.Run("release lets the next attempt in at once", func(t *testing.T) {
		ctx := testCtx(t)
		key := effects.MustKey("evt_j4", "email")
		first, err := j.Begin(ctx, key, fp, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Release(ctx, key, first.Attempt); err != nil {
			t.Fatal(err)
		}
		rec, err := j.Begin(ctx, key, fp, time.Hour)
		if err != nil || rec.Attempt != 2 {
			t.Fatalf("Begin after Release = %+v, %v; want attempt 2", rec, err)
		}
	})

	t.Run("a stale attempt cannot release a lease taken over", func(t *testing.T) {
		ctx := testCtx(t)
		key := effects.MustKey("evt_j4b", "email")
		stale, err := j.Begin(ctx, key, fp, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // the lease expires
		current, err := j.Begin(ctx, key, fp, time.Hour)
		if err != nil || current.Attempt != stale.Attempt+1 {
			t.Fatalf("takeover = %+v, %v", current, err)
		}
		// The stale attempt fails late and releases: it must not free the
		// lease the current attempt holds.
		if err := j.Release(ctx, key, stale.Attempt); err != nil {
			t.Fatal(err)
		}
		if _, err := j.Begin(ctx, key, fp, time.Hour); !errors.Is(err, effects.ErrInFlight) {
			t.Fatalf("Begin after a stale Release = %v; want ErrInFlight (the current lease holds)", err)
		}
	})

	t.Run("another fingerprint is ErrKeyReused", func(t *testing.T) {
		ctx := testCtx(t)
		key := effects.MustKey("evt_j5", "email")
		if _, err := j.Begin(ctx, key, fp, time.Millisecond); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		_, err := j.Begin(ctx, key, effects.Fingerprint([]byte("other")), time.Minute)
		if !errors.Is(err, effects.ErrKeyReused) {
			t.Fatalf("Begin = %v; want ErrKeyReused (even with the lease expired)", err)
		}
		if err := j.Complete(ctx, key, "ref"); err != nil {
			t.Fatal(err)
		}
		if _, err := j.Begin(ctx, key, effects.Fingerprint([]byte("other")), time.Minute); !errors.Is(err, effects.ErrKeyReused) {
			t.Fatalf("Begin on a done key = %v; want ErrKeyReused", err)
		}
	})

	t.Run("concurrent begins: one holds the lease", func(t *testing.T) {
		ctx := testCtx(t)
		key := effects.MustKey("evt_j6", "email")
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			leases int
		)
		for range 16 {
			wg.Go(func() {
				_, err := j.Begin(ctx, key, fp, time.Minute)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					leases++
				case !errors.Is(err, effects.ErrInFlight):
					t.Errorf("Begin = %v", err)
				}
			})
		}
		wg.Wait()
		if leases != 1 {
			t.Fatalf("%d callers got the lease, want 1", leases)
		}
	})

	t.Run("complete of an unknown key fails", func(t *testing.T) {
		if err := j.Complete(testCtx(t), "never-begun", "ref"); err == nil {
			t.Fatal("Complete succeeded")
		}
	})

	t.Run("invalid key and lease", func(t *testing.T) {
		ctx := testCtx(t)
		if _, err := j.Begin(ctx, "", fp, time.Minute); !errors.Is(err, effects.ErrInvalidKey) {
			t.Errorf("Begin with an empty key = %v", err)
		}
		if _, err := j.Begin(ctx, "k", fp, 0); err == nil {
			t.Error("Begin with a zero lease succeeded")
		}
		if n := count(t, pool, `SELECT count(*) FROM effectively_journal WHERE key IN ('', 'k')`); n != 0 {
			t.Errorf("%d records written", n)
		}
	})
}
