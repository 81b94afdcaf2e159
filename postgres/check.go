package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
)

var (
	_ effects.Checker = (*Effect[struct{}])(nil)
	_ effects.Checker = (*Journal)(nil)
)

const opCheck = "postgres.Check"

// Check reports whether Apply can work: effectively_keys exists, and the
// commit settings of a pooled connection are safe (see [ErrAsyncCommit];
// not checked with [AllowAsyncCommit]). It runs one read-only statement.
// A missing table, or unsafe settings, is an [*effects.ConfigError] naming
// the table or the setting; a server it cannot reach is retryable. The
// write's own tables are not checked: the write names them. Run it at
// start-up, with [effects.Plan.Check].
func (e *Effect[In]) Check(ctx context.Context) error {
	return check(ctx, e.pool, "effectively_keys", e.cfg.allowAsyncCommit)
}

// Check reports whether the Journal can work: effectively_journal exists,
// and the commit settings of a pooled connection are safe (see
// [ErrAsyncCommit]). It runs one read-only statement. A missing table, or
// unsafe settings, is an [*effects.ConfigError] naming the table or the
// setting; a server it cannot reach is retryable.
func (j *Journal) Check(ctx context.Context) error {
	return check(ctx, j.pool, "effectively_journal", false)
}

// check runs checkSQL for table.
func check(ctx context.Context, pool *pgxpool.Pool, table string, allowAsync bool) error {
	var (
		exists bool
		s      commitSettings
	)
	if err := pool.QueryRow(ctx, checkSQL, table).Scan(&exists, &s.syncCommit, &s.syncRep); err != nil {
		return classify(ctx, opCheck, "", err, false, false).err
	}
	if !exists {
		return &effects.ConfigError{Op: opCheck, Option: "table " + table, Reason: "does not exist in the database: run postgres.Migrate"}
	}
	if s.unsafeCommit() && !allowAsync {
		return fmt.Errorf("%w: %w", &effects.ConfigError{Op: opCheck, Option: "synchronous_commit",
			Reason: fmt.Sprintf("%q (synchronous standbys configured: %t) makes an acknowledged commit losable", s.syncCommit, s.syncRep)}, ErrAsyncCommit)
	}
	return nil
}
