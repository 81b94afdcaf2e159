package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// events records a Pruner's events, and signals each one.
type events struct {
	mu   sync.Mutex
	evs  []effects.Event
	at   []time.Time
	seen chan struct{}
}

func newEvents() *events { return &events{seen: make(chan struct{}, 1000)} }

func (e *events) Observe(_ context.Context, ev effects.Event) {
	e.mu.Lock()
	e.evs = append(e.evs, ev)
	e.at = append(e.at, time.Now())
	e.mu.Unlock()
	select {
	case e.seen <- struct{}{}:
	default:
	}
}

func (e *events) all() ([]effects.Event, []time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]effects.Event(nil), e.evs...), append([]time.Time(nil), e.at...)
}

// waitFor waits until cond holds of the events so far.
func (e *events) waitFor(t *testing.T, what string, cond func([]effects.Event) bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		evs, _ := e.all()
		if cond(evs) {
			return
		}
		select {
		case <-e.seen:
		case <-deadline:
			t.Fatalf("no %s after 30s; events: %+v", what, evs)
		}
	}
}

// caughtUp reports whether the last pruned event deleted fewer than
// batch keys: the Pruner found nothing more to delete.
func caughtUp(batch int64) func([]effects.Event) bool {
	return func(evs []effects.Event) bool {
		return len(evs) > 0 && evs[len(evs)-1].Kind == effects.EventPruned && evs[len(evs)-1].Count < batch
	}
}

// seedKeys inserts n keys of scope with the given prefix, created age ago
// by the server's clock.
func seedKeys(t *testing.T, pool *pgxpool.Pool, scope, prefix string, n int, age time.Duration) {
	t.Helper()
	mustExec(t, pool, `INSERT INTO effectively_keys (scope, key, fingerprint, created_at)
		SELECT $1, $2 || i, '', now() - $3 * interval '1 second' FROM generate_series(1, $4) AS i`,
		scope, prefix, age.Seconds(), n)
}

// runPruner starts p.Run and returns a function that stops it and
// returns Run's error; the test fails if Run does not return promptly.
func runPruner(t *testing.T, p *postgres.Pruner) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return within 10s of its context's cancellation")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

func TestPrunerDeletesExpiredKeysOfItsScopeOnly(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	seedKeys(t, pool, "billing", "old", 10, 48*time.Hour)
	seedKeys(t, pool, "billing", "recent", 5, time.Minute)
	seedKeys(t, pool, "other", "old", 3, 48*time.Hour)
	evs := newEvents()
	p := &postgres.Pruner{DB: pool, Scope: "billing", Horizon: 24 * time.Hour, BatchSize: 3, Interval: 10 * time.Millisecond, Observer: evs}
	stop := runPruner(t, p)
	evs.waitFor(t, "catch-up", caughtUp(3))
	if err := stop(); err != nil {
		t.Fatalf("Run = %v after cancel, want nil", err)
	}
	got, _ := evs.all()
	var deleted int64
	for i, ev := range got {
		if ev.Kind != effects.EventPruned || ev.Component != "postgres.Pruner" || ev.Effect != "" || ev.Step != "" || ev.Duration <= 0 {
			t.Errorf("event %d = %+v, want EventPruned from Component postgres.Pruner with a duration", i, ev)
		}
		deleted += ev.Count
	}
	if deleted != 10 {
		t.Errorf("events count %d deleted keys, want 10", deleted)
	}
	if got[0].Count != 3 {
		t.Errorf("first statement deleted %d keys, want a full batch of 3", got[0].Count)
	}
	if n := count(t, pool, `SELECT count(*) FROM effectively_keys WHERE scope = 'billing'`); n != 5 {
		t.Errorf("%d billing keys left, want the 5 recent ones", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM effectively_keys WHERE scope = 'other'`); n != 3 {
		t.Errorf("%d keys left in another scope, want 3", n)
	}
}

// TestPrunerKeepsPruning: keys that expire while it runs are deleted on a
// later pass, after the interval.
func TestPrunerKeepsPruning(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	evs := newEvents()
	p := &postgres.Pruner{DB: pool, Scope: "billing", Horizon: time.Hour, Interval: 20 * time.Millisecond, Observer: evs}
	runPruner(t, p)
	evs.waitFor(t, "first pass", func(evs []effects.Event) bool { return len(evs) > 0 })
	seedKeys(t, pool, "billing", "late", 4, 2*time.Hour)
	evs.waitFor(t, "the late keys' deletion", func(evs []effects.Event) bool {
		var n int64
		for _, ev := range evs {
			n += ev.Count
		}
		return n == 4
	})
	if n := count(t, pool, `SELECT count(*) FROM effectively_keys`); n != 0 {
		t.Errorf("%d keys left, want 0", n)
	}
}

// TestPrunerPacesItsStatements: with a rate of r keys/s, a statement
// that deleted n keys is followed by the next no sooner than n/r after it
// began, so the deletes never outrun the rate (a lower bound on the time
// taken, which a slow machine only makes longer).
func TestPrunerPacesItsStatements(t *testing.T) {
	const (
		keys  = 500
		batch = 100
		rate  = 1000.0 // keys/s: a statement every 100 ms
	)
	pool := newPool(t, newDB(t), nil)
	seedKeys(t, pool, "billing", "old", keys, 48*time.Hour)
	evs := newEvents()
	p := &postgres.Pruner{DB: pool, Scope: "billing", Horizon: 24 * time.Hour, Rate: rate, BatchSize: batch, Interval: time.Hour, Observer: evs}
	runPruner(t, p)
	evs.waitFor(t, "catch-up", caughtUp(batch))
	got, at := evs.all()
	if len(got) != keys/batch+1 {
		t.Fatalf("%d statements, want %d full ones and the one that found none: %+v", len(got), keys/batch, got)
	}
	for i := 1; i < len(got); i++ {
		// Statement i began at least batch/rate after statement i-1 began,
		// and ended Duration after it began.
		minGap := time.Duration(float64(got[i-1].Count)/rate*float64(time.Second)) - got[i-1].Duration + got[i].Duration
		if gap := at[i].Sub(at[i-1]); gap < minGap-time.Millisecond {
			t.Errorf("statement %d ended %v after the one before, want at least %v at %v keys/s", i, gap, minGap, rate)
		}
	}
}

// TestPrunerStopsOnCancelDuringAStatement: a DELETE waiting on a lock is
// abandoned when the context is done, and Run returns nil at once.
func TestPrunerStopsOnCancelDuringAStatement(t *testing.T) {
	url := newDB(t)
	pool := newPool(t, url, nil)
	seedKeys(t, pool, "billing", "old", 5, 48*time.Hour)
	locker, err := pgx.Connect(testCtx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	tx, err := locker.Begin(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	mustExec(t, tx, `LOCK TABLE effectively_keys IN ACCESS EXCLUSIVE MODE`)
	p := &postgres.Pruner{DB: pool, Scope: "billing", Horizon: time.Hour}
	stop := runPruner(t, p)
	waitForLockWait(t, locker)
	if err := stop(); err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
	if err := tx.Rollback(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM effectively_keys`); n != 5 {
		t.Errorf("%d keys left, want all 5: the interrupted DELETE must not commit", n)
	}
}

// waitForLockWait waits until a session of conn's database waits on a
// lock.
func waitForLockWait(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	pollUntil(t, testCtx(t), conn, `SELECT (count(*) > 0)::text FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`, "true")
}

// TestPrunerRetriesAfterLostConnection: a statement whose session is
// terminated is reported as failed, logged, and retried after a pause;
// the keys are then deleted.
func TestPrunerRetriesAfterLostConnection(t *testing.T) {
	url := newDB(t)
	pool := newPool(t, url, nil)
	seedKeys(t, pool, "billing", "old", 5, 48*time.Hour)
	admin, err := pgx.Connect(testCtx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	tx, err := admin.Begin(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	mustExec(t, tx, `LOCK TABLE effectively_keys IN ACCESS EXCLUSIVE MODE`)
	evs := newEvents()
	var logs bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&logs, &logMu}, nil))
	p := &postgres.Pruner{DB: pool, Scope: "billing", Horizon: time.Hour, Interval: 2 * time.Second, Observer: evs, Logger: logger}
	runPruner(t, p)
	waitForLockWait(t, admin)
	other, err := pgx.Connect(testCtx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	mustExec(t, other, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`)
	evs.waitFor(t, "failure", func(evs []effects.Event) bool { return len(evs) > 0 })
	if err := tx.Rollback(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	evs.waitFor(t, "catch-up after the failure", caughtUp(1000))
	got, _ := evs.all()
	var pgErr *pgconn.PgError
	if got[0].Kind != effects.EventFailed || !errors.As(got[0].Err, &pgErr) || pgErr.Code != "57P01" {
		t.Errorf("first event = %+v, want EventFailed with the server's 57P01", got[0])
	}
	if n := count(t, pool, `SELECT count(*) FROM effectively_keys`); n != 0 {
		t.Errorf("%d keys left after the retry, want 0", n)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if logs.Len() != 0 {
		t.Errorf("the Pruner logged though it has an observer:\n%s", &logs)
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestPrunerStopsOnMissingTable: a table that is not there is a
// configuration error: Run stops at once with it instead of retrying.
func TestPrunerStopsOnMissingTable(t *testing.T) {
	pool := newPool(t, pgtest.DB(t), nil) // no Migrate
	evs := newEvents()
	p := &postgres.Pruner{DB: pool, Scope: "billing", Horizon: time.Hour, Observer: evs}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := p.Run(ctx)
	var pgErr *pgconn.PgError
	if !errors.Is(err, effects.ErrInvalidConfig) || !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Fatalf("Run = %v, want ErrInvalidConfig wrapping the server's 42P01", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run returned only when its context expired")
	}
	if got, _ := evs.all(); len(got) != 1 || got[0].Kind != effects.EventFailed {
		t.Errorf("events %+v, want one EventFailed", got)
	}
}

func TestPrunerRefusesBadConfig(t *testing.T) {
	pool := newPool(t, pgtest.DB(t), nil)
	for _, tc := range []struct {
		name   string
		p      postgres.Pruner
		option string
	}{
		{"nil db", postgres.Pruner{Scope: "billing", Horizon: time.Hour}, "DB"},
		{"empty scope", postgres.Pruner{DB: pool, Horizon: time.Hour}, "scope"},
		{"zero horizon", postgres.Pruner{DB: pool, Scope: "billing"}, "Horizon"},
		{"negative horizon", postgres.Pruner{DB: pool, Scope: "billing", Horizon: -time.Hour}, "Horizon"},
		{"negative rate", postgres.Pruner{DB: pool, Scope: "billing", Horizon: time.Hour, Rate: -1}, "Rate"},
		{"NaN rate", postgres.Pruner{DB: pool, Scope: "billing", Horizon: time.Hour, Rate: math.NaN()}, "Rate"},
		{"negative batch", postgres.Pruner{DB: pool, Scope: "billing", Horizon: time.Hour, BatchSize: -1}, "BatchSize"},
		{"negative interval", postgres.Pruner{DB: pool, Scope: "billing", Horizon: time.Hour, Interval: -1}, "Interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Run(testCtx(t))
			var ce *effects.ConfigError
			if !errors.As(err, &ce) || ce.Option != tc.option {
				t.Fatalf("Run = %v, want a ConfigError about %s", err, tc.option)
			}
		})
	}
}
