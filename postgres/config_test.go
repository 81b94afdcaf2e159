package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// wantConfig fails t unless err is a configuration error whose
// *effects.ConfigError names option.
func wantConfig(t *testing.T, what string, err error, option string) {
	t.Helper()
	var ce *effects.ConfigError
	if !errors.As(err, &ce) || !errors.Is(err, effects.ErrInvalidConfig) || effects.ClassOf(err) != effects.InvalidConfig || ce.Option != option {
		t.Fatalf("%s = %v (class %v); want a ConfigError naming %q", what, err, effects.ClassOf(err), option)
	}
}

// TestMigrateAndPruneRefuseANilDB: a nil db, untyped or a nil pool, is a
// configuration error, not a panic.
func TestMigrateAndPruneRefuseANilDB(t *testing.T) {
	ctx := testCtx(t)
	var pool *pgxpool.Pool
	var conn *pgx.Conn
	for name, db := range map[string]postgres.DB{"nil": nil, "nil pool": pool, "nil conn": conn} {
		wantConfig(t, "Migrate("+name+")", postgres.Migrate(ctx, db), "db")
		_, err := postgres.Prune(ctx, db, "billing", time.Now(), 0)
		wantConfig(t, "Prune("+name+")", err, "db")
	}
}

// TestMissingTableIsAConfigError: Apply, Claim and the Journal on a
// database without the adapter's tables, and a write on a table the
// database lacks, fail with a configuration error naming the table; the
// server's error stays in the chain.
func TestMissingTableIsAConfigError(t *testing.T) {
	url := newDB(t)
	pool := newPool(t, url, nil)
	ctx := testCtx(t)
	missingLedger, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		_, err := tx.Exec(ctx, `INSERT INTO no_such_ledger (event_id) VALUES ($1)`, p.EventID)
		return "x", err
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = missingLedger.Apply(ctx, effects.MustKey("evt_missing_ledger", "ledger"), payment{EventID: "evt_missing_ledger"})
	wantConfig(t, "Apply on a missing write table", err, "table no_such_ledger")

	mustExec(t, pool, `DROP TABLE effectively_keys`)
	mustExec(t, pool, `DROP TABLE effectively_journal`)
	for _, shape := range applyShapes() {
		fx := shape.make(t, pool, new(atomic.Int64))
		_, err := fx.Apply(ctx, effects.MustKey("evt_missing", "ledger"), payment{EventID: "evt_missing", Amount: 1})
		wantConfig(t, shape.name+" Apply without effectively_keys", err, "table effectively_keys")
		if effects.ClassOf(err) == effects.Retryable {
			t.Fatalf("%s: %v is retryable", shape.name, err)
		}
	}
	err = func() error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		_, err = postgres.Claim(ctx, tx, "billing", effects.MustKey("evt_missing", "claim"), []byte("fp"))
		return err
	}()
	wantConfig(t, "Claim without effectively_keys", err, "table effectively_keys")
	j, err := postgres.NewJournal(pool, "email")
	if err != nil {
		t.Fatal(err)
	}
	_, err = j.Begin(ctx, effects.MustKey("evt_missing", "email"), []byte("fp"), time.Minute)
	wantConfig(t, "Journal.Begin without effectively_journal", err, "table effectively_journal")
}

// TestCheck: Check passes on a migrated database, and names the missing
// table, or the unsafe commit setting, as a configuration error, for the
// Effect in every shape and for the Journal. AllowAsyncCommit lets an
// Effect's Check pass under synchronous_commit = off.
func TestCheck(t *testing.T) {
	url := newDB(t)
	pool := newPool(t, url, nil)
	ctx := testCtx(t)
	j, err := postgres.NewJournal(pool, "email")
	if err != nil {
		t.Fatal(err)
	}
	var checkers []effects.Checker
	for _, shape := range applyShapes() {
		checkers = append(checkers, shape.make(t, pool, new(atomic.Int64)))
	}
	checkers = append(checkers, j)
	for i, c := range checkers {
		if err := c.Check(ctx); err != nil {
			t.Fatalf("checker %d on a migrated database: %v", i, err)
		}
	}

	async := asyncPool(t, url)
	fx := ledgerEffect(t, async, nil)
	err = fx.Check(ctx)
	wantConfig(t, "Check under synchronous_commit = off", err, "synchronous_commit")
	if !errors.Is(err, postgres.ErrAsyncCommit) {
		t.Fatalf("Check under synchronous_commit = off = %v; want ErrAsyncCommit too", err)
	}
	aj, err := postgres.NewJournal(async, "email")
	if err != nil {
		t.Fatal(err)
	}
	wantConfig(t, "Journal.Check under synchronous_commit = off", aj.Check(ctx), "synchronous_commit")
	if err := ledgerEffect(t, async, nil, postgres.AllowAsyncCommit()).Check(ctx); err != nil {
		t.Fatalf("Check with AllowAsyncCommit under synchronous_commit = off: %v", err)
	}

	mustExec(t, pool, `DROP TABLE effectively_keys`)
	mustExec(t, pool, `DROP TABLE effectively_journal`)
	for i, c := range checkers {
		want := "table effectively_keys"
		if c == effects.Checker(j) {
			want = "table effectively_journal"
		}
		wantConfig(t, fmt.Sprintf("checker %d without its table", i), c.Check(ctx), want)
	}
}

// TestJournalInFlightReportsTheLeaseLeft: a Begin of a key whose lease
// another process holds is ErrInFlight, with RetryAfter at most what is
// left of that lease and more than nothing.
func TestJournalInFlightReportsTheLeaseLeft(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	ctx := testCtx(t)
	holder, err := postgres.NewJournal(pool, "email")
	if err != nil {
		t.Fatal(err)
	}
	other, err := postgres.NewJournal(pool, "email") // another process's
	if err != nil {
		t.Fatal(err)
	}
	key := effects.MustKey("evt_inflight", "email")
	const lease = time.Hour
	if _, err := holder.Begin(ctx, key, []byte("fp"), lease); err != nil {
		t.Fatal(err)
	}
	_, err = other.Begin(ctx, key, []byte("fp"), time.Minute)
	after, ok := effects.RetryAfter(err)
	if !errors.Is(err, effects.ErrInFlight) || !ok || after <= lease-time.Minute || after > lease {
		t.Fatalf("Begin of a leased key = %v, RetryAfter %v (%t); want ErrInFlight with RetryAfter in (%v, %v]", err, after, ok, lease-time.Minute, lease)
	}
}
