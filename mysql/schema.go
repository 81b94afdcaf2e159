package mysql

import (
	"context"
	"database/sql"
	_ "embed"
	"fmt"
	"strings"

	"effectively.dev/effects"
	"effectively.dev/internal/sqlkeys"
)

// Schema is the SQL that [Migrate] runs: CREATE TABLE IF NOT EXISTS for
// effectively_keys (the dedup rows of [Effect]) and effectively_journal
// (the sent-records of [Journal]), both InnoDB, with an index on (scope,
// created_at) for [Prune]. Statements are separated by semicolons at the
// end of a line. It is exported for projects that manage their schema
// with their own migration tool: copy it into a migration rather than
// calling Migrate at start-up.
//
//go:embed schema.sql
var Schema string

// DB is what [Migrate], [Prune] and [Pruner] need: *sql.DB, *sql.Conn
// and *sql.Tx all satisfy it. MySQL commits the open transaction before
// a CREATE TABLE, so run Migrate outside one.
type DB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Migrate creates the tables in [Schema] if they do not exist. It is
// idempotent and safe to run concurrently from many processes (CREATE
// TABLE IF NOT EXISTS under the server's metadata lock). It needs the
// privilege to create tables in the connection's database. A nil db is an
// [*effects.ConfigError].
func Migrate(ctx context.Context, db DB) error {
	const op = "mysql.Migrate"
	if nilDB(db) {
		return effects.ConfigErrorf(op, "db", "nil")
	}
	for _, stmt := range statements(Schema) {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	return nil
}

// statements splits a schema into its statements, dropping comments: each
// ends with a semicolon at the end of a line.
func statements(schema string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(schema) {
		if t := strings.TrimSpace(line); t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(strings.TrimSpace(line), ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	return out
}

// maxScopeLen is the longest scope in bytes: the scope column's size.
const maxScopeLen = 255

// validateScope checks what the scope column holds and what keeps
// operators sane: non-empty, at most 255 bytes, valid UTF-8, no NUL byte.
// A bad scope is an *effects.ConfigError.
func validateScope(op, scope string) error { return sqlkeys.Scope(op, scope, maxScopeLen) }

// nilDB reports whether db is nil, or a nil *sql.DB, *sql.Conn or *sql.Tx.
func nilDB(db DB) bool {
	switch d := db.(type) {
	case nil:
		return true
	case *sql.DB:
		return d == nil
	case *sql.Conn:
		return d == nil
	case *sql.Tx:
		return d == nil
	}
	return false
}
