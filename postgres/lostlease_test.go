package postgres_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/postgres"
)

// journalRecord reads key's record: its attempt, whether its lease is
// live, and whether it is done.
func journalRecord(t *testing.T, pool *pgxpool.Pool, key effects.Key) (attempt int, live, done bool) {
	t.Helper()
	err := pool.QueryRow(testCtx(t), `SELECT attempt, coalesce(lease_until > now(), false), done FROM effectively_journal WHERE key = $1`,
		string(key)).Scan(&attempt, &live, &done)
	if err != nil {
		t.Fatalf("reading the record of %q: %v", key, err)
	}
	return attempt, live, done
}

// faultyJournal returns a Journal on url whose pool drops replies as f
// says: one connection, each statement in one write (so that the write
// after loseBegin's warm-up is Begin's).
func faultyJournal(t *testing.T, url string, f *faults) (*postgres.Journal, *pgxpool.Pool) {
	t.Helper()
	pool := newPool(t, url, func(c *pgxpool.Config) {
		f.configure(c)
		c.MaxConns = 1
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	})
	j, err := postgres.NewJournal(pool, "email")
	if err != nil {
		t.Fatal(err)
	}
	return j, pool
}

// loseBegin runs a Begin of key through j whose reply is dropped after
// the server committed it, and checks that it reports ErrAmbiguous.
func loseBegin(t *testing.T, j *postgres.Journal, pool *pgxpool.Pool, f *faults, key effects.Key, fp []byte) {
	t.Helper()
	ctx := testCtx(t)
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil { // the connection is up: the next write is Begin's
		t.Fatal(err)
	}
	before := f.fired.Load()
	f.countdown.Store(1)
	_, err := j.Begin(ctx, key, fp, time.Minute)
	f.countdown.Store(0)
	if f.fired.Load() != before+1 {
		t.Fatal("the reply to Begin was not dropped")
	}
	if !errors.Is(err, effects.ErrAmbiguous) {
		t.Fatalf("Begin with a lost reply = %v; want ErrAmbiguous", err)
	}
}

// TestJournalTakesBackALeaseWhoseReplyWasLost: a Begin whose reply is lost
// took the lease, but nobody holds it (the caller got ErrAmbiguous and did
// nothing). The same Journal takes it back at once on its next Begin, as
// the same attempt, also after a Begin with another payload was refused;
// another Journal (another process) cannot tell it from a live lease and
// waits. Once taken back, the lease is held: neither Journal takes it
// again.
func TestJournalTakesBackALeaseWhoseReplyWasLost(t *testing.T) {
	url := newDB(t)
	var f faults
	j1, faulty := faultyJournal(t, url, &f)
	clean := newPool(t, url, nil)
	ctx := testCtx(t)
	j2, err := postgres.NewJournal(clean, "email")
	if err != nil {
		t.Fatal(err)
	}
	fp := effects.Fingerprint([]byte("receipt for evt_lost"))
	key := effects.MustKey("evt_lost_begin", "email")
	loseBegin(t, j1, faulty, &f, key, fp)
	if attempt, live, done := journalRecord(t, clean, key); attempt != 1 || !live || done {
		t.Fatalf("record after the lost reply: attempt %d, live %v, done %v; want attempt 1 holding a live lease", attempt, live, done)
	}

	if _, err := j2.Begin(ctx, key, fp, time.Minute); !errors.Is(err, effects.ErrInFlight) {
		t.Fatalf("Begin through another Journal = %v; want ErrInFlight until the lease expires", err)
	}
	if _, err := j1.Begin(ctx, key, effects.Fingerprint([]byte("another payload")), time.Minute); !errors.Is(err, effects.ErrKeyReused) {
		t.Fatalf("Begin with another payload = %v; want ErrKeyReused", err)
	}
	rec, err := j1.Begin(ctx, key, fp, time.Minute)
	if err != nil || rec != (journal.Record{Attempt: 1}) {
		t.Fatalf("Begin again through the Journal that lost the reply = %+v, %v; want the lease back at once, as attempt 1 (which did nothing)", rec, err)
	}
	for name, j := range map[string]*postgres.Journal{"the same Journal": j1, "another Journal": j2} {
		if _, err := j.Begin(ctx, key, fp, time.Minute); !errors.Is(err, effects.ErrInFlight) {
			t.Fatalf("Begin through %s after the lease was taken back = %v; want ErrInFlight", name, err)
		}
	}
	if err := j1.Complete(ctx, key, "250 queued as L1"); err != nil {
		t.Fatal(err)
	}
	rec, err = j2.Begin(ctx, key, fp, time.Minute)
	if err != nil || rec != (journal.Record{Done: true, Ref: "250 queued as L1", Attempt: 1}) {
		t.Fatalf("Begin after Complete = %+v, %v; want done with the ref", rec, err)
	}
	// A lease held by a Begin that got its reply is never taken.
	held := effects.MustKey("evt_held", "email")
	if _, err := j1.Begin(ctx, held, fp, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := j1.Begin(ctx, held, fp, time.Minute); !errors.Is(err, effects.ErrInFlight) {
		t.Fatalf("second Begin of a held lease = %v; want ErrInFlight", err)
	}
}

// TestCoalescedBeginTakesBackALostLease: a Begin that would take a lost
// lease back, queued with others into one coalesced statement, runs on
// its own beside it and gets the lease back; the others share the
// statement.
func TestCoalescedBeginTakesBackALostLease(t *testing.T) {
	var f faults
	j, pool := faultyJournal(t, newDB(t), &f)
	ctx := testCtx(t)
	fp := effects.Fingerprint([]byte("receipt"))
	lost := effects.MustKey("evt_coalesced_lost", "email")
	loseBegin(t, j, pool, &f, lost, fp)

	keys := []effects.Key{lost, effects.MustKey("evt_coalesced_a", "email"), effects.MustKey("evt_coalesced_b", "email")}
	queued, release := postgres.HoldJournal(j)
	recs := make([]journal.Record, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() { recs[i], errs[i] = j.Begin(ctx, k, fp, time.Minute) })
	}
	waitQueued(t, queued, len(keys))
	release()
	wg.Wait()
	for i, k := range keys {
		if errs[i] != nil || recs[i] != (journal.Record{Attempt: 1}) {
			t.Errorf("coalesced Begin of %q = %+v, %v; want the lease, attempt 1", k, recs[i], errs[i])
		}
	}
	if _, err := j.Begin(ctx, lost, fp, time.Minute); !errors.Is(err, effects.ErrInFlight) {
		t.Fatalf("Begin after the lease was taken back = %v; want ErrInFlight", err)
	}
}
