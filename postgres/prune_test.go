package postgres_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

func TestPrune(t *testing.T) {
	url := newDB(t)
	tracer := new(statementCounter)
	pool := newPool(t, url, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	ctx := testCtx(t)
	seed := func(scope, prefix string, n int, age time.Duration) {
		for i := range n {
			mustExec(t, pool, `INSERT INTO effectively_keys (scope, key, fingerprint, created_at) VALUES ($1, $2, '', now() - $3 * interval '1 second')`,
				scope, prefix+strconv.Itoa(i), age.Seconds())
		}
	}
	seed("billing", "old", 10, 48*time.Hour)
	seed("billing", "recent", 5, time.Minute)
	seed("other", "old", 3, 48*time.Hour)

	before := tracer.deletes.Load()
	deleted, err := postgres.Prune(ctx, pool, "billing", time.Now().Add(-24*time.Hour), 3)
	if err != nil || deleted != 10 {
		t.Fatalf("Prune = %d, %v; want 10 deleted", deleted, err)
	}
	if n := tracer.deletes.Load() - before; n != 4 {
		t.Errorf("%d DELETE statements, want 4 (3+3+3+1)", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM effectively_keys WHERE scope = 'billing'`); n != 5 {
		t.Errorf("%d billing keys left, want the 5 recent ones", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM effectively_keys WHERE scope = 'other'`); n != 3 {
		t.Errorf("%d keys left in another scope, want 3", n)
	}
	if deleted, err := postgres.Prune(ctx, pool, "billing", time.Now().Add(-24*time.Hour), 0); err != nil || deleted != 0 {
		t.Errorf("second Prune = %d, %v; want 0", deleted, err)
	}
	if _, err := postgres.Prune(ctx, pool, "", time.Now(), 10); err == nil {
		t.Error("Prune with an empty scope succeeded")
	}
}

func TestMigrate(t *testing.T) {
	t.Run("concurrent runs all succeed", func(t *testing.T) {
		pool := newPool(t, pgtest.DB(t), func(c *pgxpool.Config) { c.MaxConns = 8 })
		errs := make(chan error, 8)
		for range 8 {
			go func() { errs <- postgres.Migrate(testCtx(t), pool) }()
		}
		var all []error
		for range 8 {
			all = append(all, <-errs)
		}
		if err := errors.Join(all...); err != nil {
			t.Fatal(err)
		}
		if n := count(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename IN ('effectively_keys', 'effectively_journal')`); n != 2 {
			t.Fatalf("%d tables, want 2", n)
		}
	})
	t.Run("inside a caller's transaction", func(t *testing.T) {
		pool := newPool(t, pgtest.DB(t), nil)
		ctx := testCtx(t)
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := postgres.Migrate(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if err := postgres.Migrate(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestJournalPrune(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	ctx := testCtx(t)
	j, err := postgres.NewJournal(pool, "mail")
	if err != nil {
		t.Fatal(err)
	}
	seed := func(scope, key string, age time.Duration, done bool, lease time.Duration) {
		mustExec(t, pool, `INSERT INTO effectively_journal (scope, key, fingerprint, done, lease_until, created_at)
			VALUES ($1, $2, '', $3, CASE WHEN $4::float8 = 0 THEN NULL ELSE now() + $4 * interval '1 second' END, now() - $5 * interval '1 second')`,
			scope, key, done, lease.Seconds(), age.Seconds())
	}
	seed("mail", "old-done", 48*time.Hour, true, 0)
	seed("mail", "old-expired", 48*time.Hour, false, -time.Hour)
	seed("mail", "old-leased", 48*time.Hour, false, time.Hour) // an attempt holds it now
	seed("mail", "recent", time.Minute, true, 0)
	seed("other", "old-done", 48*time.Hour, true, 0)

	deleted, err := j.Prune(ctx, time.Now().Add(-24*time.Hour), 1)
	if err != nil || deleted != 2 {
		t.Fatalf("Journal.Prune = %d, %v; want 2 deleted", deleted, err)
	}
	rows, err := pool.Query(ctx, `SELECT scope || '/' || key FROM effectively_journal ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		left = append(left, s)
	}
	if got, want := strings.Join(left, ","), "mail/old-leased,mail/recent,other/old-done"; got != want {
		t.Errorf("left %s, want %s (a live lease, a recent record, another scope)", got, want)
	}
}
