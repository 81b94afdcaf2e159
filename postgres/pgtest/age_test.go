package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"effectively.dev/postgres/pgtest"
)

func TestAge(t *testing.T) {
	ctx := context.Background()
	url := pgtest.DB(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// Only effectively_keys exists: the journal table is skipped.
	if _, err := conn.Exec(ctx, `CREATE TABLE effectively_keys (key text PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now());
		INSERT INTO effectively_keys (key) VALUES ('k')`); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.Age(ctx, url, 400*24*time.Hour); err != nil {
		t.Fatalf("Age: %v", err)
	}
	var days float64
	if err := conn.QueryRow(ctx, `SELECT extract(epoch FROM now() - created_at) / 86400 FROM effectively_keys`).Scan(&days); err != nil {
		t.Fatal(err)
	}
	if days < 399.9 || days > 400.1 {
		t.Errorf("the row is %.2f days old after Age(400 days)", days)
	}
}
