package postgres

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/internal/sqlkeys"
)

// Schema is the SQL that [Migrate] runs: CREATE TABLE IF NOT EXISTS for
// effectively_keys (the dedup rows of [Effect], [Claim] and [ClaimBatch])
// and effectively_journal (the sent-records of [Journal]), and an index on
// effectively_keys(scope, created_at) for [Prune]. It is exported for
// projects that manage their schema with their own migration tool: copy it
// into a migration rather than calling Migrate at startup.
//
//go:embed schema.sql
var Schema string

// migrateLockID is the pg_advisory_xact_lock key that serializes Migrate
// calls; it spells "effectiv" in ASCII.
const migrateLockID int64 = 0x6566666563746976

// DB is what the functions that take a database handle need:
// *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx all satisfy it.
// Given a pgx.Tx, Begin opens a savepoint, so the work joins the caller's
// transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate creates the tables and index in [Schema] if they do not exist. It
// is idempotent and safe to run concurrently from many processes: it takes a
// transaction-scoped advisory lock, so one caller creates the objects while
// the others wait and then find them. It needs the privilege to create
// tables in the connection's current schema (the first one on search_path).
// A nil db is an [*effects.ConfigError].
func Migrate(ctx context.Context, db DB) error {
	if nilDB(db) {
		return effects.ConfigErrorf("postgres.Migrate", "db", "nil")
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("postgres.Migrate: begin: %w", err)
	}
	defer rollback(ctx, tx) // after Commit it is a no-op
	if _, err := tx.Exec(ctx, migrateLockSQL, migrateLockID); err != nil {
		return fmt.Errorf("postgres.Migrate: lock: %w", err)
	}
	// No arguments: pgx sends it with the simple protocol, which runs
	// several statements in one round trip.
	if _, err := tx.Exec(ctx, Schema); err != nil {
		return fmt.Errorf("postgres.Migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("postgres.Migrate: commit: %w", err)
	}
	return nil
}

// validateScope checks what PostgreSQL text can hold and what keeps
// operators sane: non-empty, valid UTF-8, no NUL byte. A bad scope is an
// *effects.ConfigError.
func validateScope(op, scope string) error { return sqlkeys.Scope(op, scope, 0) }

// nilDB reports whether db is nil, or a nil pool, connection or
// transaction of pgx's.
func nilDB(db DB) bool {
	switch d := db.(type) {
	case nil:
		return true
	case *pgxpool.Pool:
		return d == nil
	case *pgxpool.Conn:
		return d == nil
	case *pgxpool.Tx:
		return d == nil
	case *pgx.Conn:
		return d == nil
	}
	return false
}
