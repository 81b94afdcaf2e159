package pgtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"effectively.dev/postgres/pgtest"
)

// TestAppFaults: an armed fault makes the real server answer the next
// write (or the next COMMIT of a transaction that wrote) with the SQLSTATE,
// once, rolls the transaction back, and is seen by a transaction that was
// already running under REPEATABLE READ.
func TestAppFaults(t *testing.T) {
	ctx := context.Background()
	url := pgtest.DB(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE app_fault_ledger (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	af, err := pgtest.InstallAppFaults(ctx, admin, "app_fault_ledger")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgtest.InstallAppFaults(ctx, admin, "app_fault_ledger"); err != nil {
		t.Fatalf("installing twice: %v", err)
	}
	code := func(err error) string {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return pgErr.Code
		}
		return ""
	}
	count := func(id string) int {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM app_fault_ledger WHERE id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Armed while a REPEATABLE READ transaction holds its snapshot.
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM app_fault_ledger`); err != nil {
		t.Fatal(err)
	}
	if err := af.FailNextWrite(ctx, "40P01"); err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO app_fault_ledger VALUES ('a')`)
	if code(err) != "40P01" {
		t.Fatalf("write after FailNextWrite(40P01): %v, want SQLSTATE 40P01", err)
	}
	_ = tx.Rollback(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO app_fault_ledger VALUES ('a')`); err != nil {
		t.Fatalf("the write after the fault fired: %v, want none (a fault fires once)", err)
	}

	if err := af.FailNextCommit(ctx, "40001"); err != nil {
		t.Fatal(err)
	}
	tx, err = conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO app_fault_ledger VALUES ('b')`); err != nil {
		t.Fatalf("a write with FailNextCommit armed: %v", err)
	}
	if err := tx.Commit(ctx); code(err) != "40001" {
		t.Fatalf("COMMIT after FailNextCommit(40001): %v, want SQLSTATE 40001", err)
	}
	if n := count("b"); n != 0 {
		t.Errorf("the failed COMMIT committed its row (%d)", n)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO app_fault_ledger VALUES ('b')`); err != nil {
		t.Fatalf("the commit after the fault fired: %v", err)
	}

	if err := af.FailNextWrite(ctx, "55P03"); err != nil {
		t.Fatal(err)
	}
	if err := af.Disarm(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO app_fault_ledger VALUES ('c')`); err != nil {
		t.Fatalf("a write after Disarm: %v", err)
	}
	if err := af.FailNextWrite(ctx, "4000"); err == nil {
		t.Error("FailNextWrite took a code that is no SQLSTATE")
	}
}
