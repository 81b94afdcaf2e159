package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	moderncsqlite "modernc.org/sqlite"

	"effectively.dev/conformance"
	"effectively.dev/effects"

	"example.com/sqlite"
)

// TestLostQueryReplyPanicsNothing: the reply of the INSERT ... RETURNING
// query is lost (its rows are the driver's, and the connection must end
// after them), through the adapter's *sql.DB and through a pinned
// sql.Conn. Nothing panics or hangs, the caller learns of the fault, the
// transaction rolls back and frees the write lock at once, and the next
// call works on a new connection.
func TestLostQueryReplyPanicsNothing(t *testing.T) {
	h := newHarness(t)
	open := func(f *conformance.Faults) *sql.DB {
		base, err := moderncsqlite.NewConnector(dsn(h.path))
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(f.SQLConnector(base))
		t.Cleanup(func() { db.Close() })
		return db
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	t.Run("adapter", func(t *testing.T) {
		f := new(conformance.Faults)
		l, err := sqlite.New(open(f))
		if err != nil {
			t.Fatal(err)
		}
		key := effects.MustKey("lost-query-reply")
		if err := l.Check(ctx); err != nil { // opens the pool's connection first
			t.Fatal(err)
		}
		f.Arm(f.RoundTrips()+2, conformance.DropReply, nil) // BEGIN, then INSERT ... RETURNING
		_, err = l.Apply(ctx, key, sqlite.Entry{Account: "a", Amount: 1})
		if !f.Fired() || !errors.Is(err, conformance.ErrInjected) || !errors.Is(err, effects.ErrTransient) {
			t.Fatalf("Apply with the query's reply lost: %v (fired %t), want ErrTransient wrapping ErrInjected", err, f.Fired())
		}
		if n, err := h.Count(ctx, key); err != nil || n != 0 {
			t.Fatalf("count after the lost reply: %d, %v; want 0: the transaction never committed", n, err)
		}
		res, err := l.Apply(ctx, key, sqlite.Entry{Account: "a", Amount: 1})
		if err != nil || res.Status != effects.Applied {
			t.Fatalf("retry: %v %v, want Applied", res.Status, err)
		}
	})

	t.Run("pinned sql.Conn", func(t *testing.T) {
		f := new(conformance.Faults)
		conn, err := open(f).Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		f.Arm(f.RoundTrips()+1, conformance.DropReply, nil)
		var id int64
		err = tx.QueryRowContext(ctx, `INSERT INTO effectively_keys (key, fingerprint, created_at) VALUES (?, ?, 0) RETURNING id`,
			[]byte("pinned"), []byte("fp")).Scan(&id)
		if !errors.Is(err, conformance.ErrInjected) {
			t.Fatalf("query with its reply lost: %v, want ErrInjected", err)
		}
		tx.Rollback()
		// The lock is free at once: a write from the harness's own handle
		// does not wait for the busy timeout.
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		defer wcancel()
		admin, _ := h.openAdmin()
		if _, err := admin.ExecContext(wctx, `INSERT INTO entries (key, account, amount) VALUES (x'00', 'probe', 0)`); err != nil {
			t.Fatalf("a write after the lost reply: %v, want the write lock free", err)
		}
	})
}
