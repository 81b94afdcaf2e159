package pgtest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Age makes every record in the effectively tables of the database at
// dbURL d older, as if d had passed since it was written: created_at (what
// Prune reads), updated_at and journal leases move back by d. Nothing is
// deleted. A conformance harness over PostgreSQL calls it from its Age
// method (conformance.Ager), so the horizon scenario can redeliver a key
// "400 days later" without waiting. Tables that do not exist are skipped.
func Age(ctx context.Context, dbURL string, d time.Duration) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("pgtest.Age: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	micros := d.Microseconds()
	for table, set := range map[string]string{
		"effectively_keys": `created_at = created_at - $1 * interval '1 microsecond'`,
		"effectively_journal": `created_at = created_at - $1 * interval '1 microsecond',
			updated_at = updated_at - $1 * interval '1 microsecond', lease_until = lease_until - $1 * interval '1 microsecond'`,
	} {
		var exists bool
		if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
			return fmt.Errorf("pgtest.Age: %w", err)
		}
		if !exists {
			continue
		}
		if _, err := conn.Exec(ctx, `UPDATE `+table+` SET `+set, micros); err != nil {
			return fmt.Errorf("pgtest.Age %s: %w", table, err)
		}
	}
	return nil
}
