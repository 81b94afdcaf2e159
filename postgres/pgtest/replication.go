package pgtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// syncTimeout bounds how long SetSynchronousStandbys waits for the
// replication state to settle when ctx has no earlier deadline.
const syncTimeout = 30 * time.Second

// Start is [New] for a test: it fails t with what to install when
// the server binaries are missing, and stops the cluster (removing its
// directory) when t ends. It ignores DATABASE_URL: a test that asks for a
// cluster of its own wants to stop, crash or restart it.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	c, err := New(opts)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { stopForTest(t, c) })
	return c
}

// NewStandby is [Cluster.StartStandby] for a test: it fails t on error and
// stops the standby when t ends.
func (c *Cluster) NewStandby(t testing.TB, opts Options) *Cluster {
	t.Helper()
	s, err := c.StartStandby(opts)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { stopForTest(t, s) })
	return s
}

func stopForTest(t testing.TB, c *Cluster) {
	if err := c.Stop(); err != nil {
		t.Errorf("%v", err)
	}
}

// SetSynchronousStandbys makes the standbys whose application_name is in
// names synchronous, in priority order (synchronous_standby_names =
// '"a", "b"': the first one streaming is synchronous), and waits, until ctx
// is done or 30 s, until the first of them is streaming with sync_state
// 'sync'. From then on every COMMIT the primary acknowledges has been
// flushed by that standby, so a failover to it loses no acknowledged
// commit. With no names it makes replication asynchronous again and waits
// until no standby is synchronous.
//
// Call it on the primary after the standby started: a standby cloned from a
// primary with synchronous_standby_names set would, once promoted, wait for
// a standby of its own.
func (c *Cluster) SetSynchronousStandbys(ctx context.Context, names ...string) error {
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: synchronous standbys: %w", err)
	}
	defer conn.Close(context.Background())
	quoted := make([]string, len(names))
	for i, n := range names {
		if n == "" {
			return errors.New("pgtest: synchronous standbys: empty name")
		}
		quoted[i] = pgx.Identifier{n}.Sanitize()
	}
	setting := strings.Join(quoted, ", ")
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quoteLiteral(setting)); err != nil {
		return fmt.Errorf("pgtest: synchronous standbys: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgtest: synchronous standbys: %w", err)
	}
	query, args := "SELECT count(*) = 0 FROM pg_stat_replication WHERE sync_state = 'sync'", []any(nil)
	if len(names) > 0 {
		query = "SELECT count(*) = 1 FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming' AND sync_state = 'sync'"
		args = []any{names[0]}
	}
	for {
		var done bool
		err := conn.QueryRow(ctx, query, args...).Scan(&done)
		if err == nil && done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: synchronous_standby_names = %s: replication did not settle (last error %v): %w; is the standby started and streaming?",
				quoteLiteral(setting), err, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
