package mysql_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/mysql"
	"effectively.dev/mysql/mysqltest"
)

// applyKeys applies n new keys in scope.
func applyKeys(t *testing.T, eff *mysql.Effect[payment], prefix string, n int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		if _, err := eff.Apply(testCtx(t), effects.MustKey(id), payment{EventID: id, Amount: 1}); err != nil {
			t.Fatal(err)
		}
	}
}

func keyCount(t *testing.T, dsn string) int {
	t.Helper()
	db := openPlain(t, dsn)
	var n int
	if err := db.QueryRowContext(testCtx(t), `SELECT COUNT(*) FROM effectively_keys`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPrune deletes the keys older than the cutoff, in batches, and only
// of its scope; a pruned key applies again.
func TestPrune(t *testing.T) {
	db, dsn := newDB(t)
	ctx := testCtx(t)
	eff, _ := mysql.New(db, "s", writeLedger)
	other, _ := mysql.New(db, "other", writeLedger)
	applyKeys(t, eff, "old", 5)
	applyKeys(t, other, "old-other", 2)
	if err := mysqltest.Age(ctx, dsn, 48*time.Hour); err != nil {
		t.Fatal(err)
	}
	applyKeys(t, eff, "new", 3)
	n, err := mysql.Prune(ctx, db, "s", time.Now().Add(-24*time.Hour), 2)
	if err != nil || n != 5 {
		t.Fatalf("Prune: %d, %v; want 5", n, err)
	}
	if got := keyCount(t, dsn); got != 5 {
		t.Errorf("keys left: %d, want 5 (3 new, 2 of the other scope)", got)
	}
	if res, err := eff.Apply(ctx, effects.MustKey("old-0"), payment{EventID: "old-0", Amount: 1}); err != nil || res.Status != effects.Applied {
		t.Errorf("a pruned key: %+v, %v; want applied again", res, err)
	}
}

// TestPruner deletes expired keys at its pace and stops with ctx; over a
// database without the table it stops with a configuration error.
func TestPruner(t *testing.T) {
	db, dsn := newDB(t)
	eff, _ := mysql.New(db, "s", writeLedger)
	applyKeys(t, eff, "k", 10)
	if err := mysqltest.Age(testCtx(t), dsn, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	applyKeys(t, eff, "fresh", 2)
	p := &mysql.Pruner{DB: db, Scope: "s", Horizon: time.Hour, BatchSize: 3, Interval: 20 * time.Millisecond}
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for keyCount(t, dsn) != 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if got := keyCount(t, dsn); got != 2 {
		t.Errorf("keys left: %d, want the 2 fresh ones", got)
	}

	bare := openPlain(t, mysqltest.DB(t))
	p = &mysql.Pruner{DB: bare, Scope: "s", Horizon: time.Hour}
	if err := p.Run(testCtx(t)); !errors.Is(err, effects.ErrInvalidConfig) {
		t.Errorf("Run without the table: %v, want ErrInvalidConfig", err)
	}
}
