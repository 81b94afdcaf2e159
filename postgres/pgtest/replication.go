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

// Failover does what a failover manager does when a primary dies: it
// crashes primary (an immediate shutdown, [Cluster.StopImmediate]: every
// connection dies at once, in-flight transactions with it) and promotes
// standby ([Cluster.Promote]), returning when standby accepts writes. What
// survives is what standby had received: with a synchronous standby, every
// acknowledged commit. primary's directory is kept until its Stop.
func Failover(ctx context.Context, primary, standby *Cluster) error {
	if err := primary.StopImmediate(); err != nil {
		return err
	}
	return standby.Promote(ctx)
}

// ReadWriteURL returns a connection URL for database db that lists every
// cluster as a host with target_session_attrs=read-write, so that pgx (and
// libpq) connect to whichever of them accepts writes: after a [Failover],
// new connections of a pool find the promoted standby by themselves.
// connect_timeout=2 keeps a dead host from stalling a connect. It needs at
// least one cluster.
func ReadWriteURL(db string, clusters ...*Cluster) string {
	hosts := make([]string, len(clusters))
	for i, c := range clusters {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", c.Port())
	}
	u := clusters[0].URL(db)
	u = strings.Replace(u, fmt.Sprintf("127.0.0.1:%d", clusters[0].Port()), strings.Join(hosts, ","), 1)
	return u + "&target_session_attrs=read-write&connect_timeout=2"
}

// Pair is a primary and a synchronous standby that streams from it
// through a [Proxy], started for one test by [StartPair]: the setup of a
// failover test.
type Pair struct {
	// Primary is the cluster the test writes to.
	Primary *Cluster
	// Standby is a hot standby of Primary, synchronous (named in Primary's
	// synchronous_standby_names as Name) and streaming through Link.
	Standby *Cluster
	// Link carries replication from Primary to Standby: Stall it to hold
	// back WAL. With a synchronous standby, commits then wait.
	Link *Proxy
	// Name is the standby's application_name.
	Name string
}

// StartPair starts a primary with opts, a standby of it named opts.Name
// (default "standby") streaming through a new [Proxy], and makes the
// standby synchronous; everything is stopped when t ends. It takes two
// cluster starts and a base backup, a few seconds. opts.Upstream is
// ignored. Call [Cluster.SetSynchronousStandbys] on Primary with no names
// to make the standby asynchronous (the control of a failover test).
// Create the test's databases on Primary: the standby replicates them.
// StartPair ignores DATABASE_URL: a failover needs clusters the test owns.
func StartPair(t testing.TB, opts Options) *Pair {
	t.Helper()
	if opts.Name == "" {
		opts.Name = standbyName
	}
	primary := Start(t, opts)
	link, err := NewProxy(fmt.Sprintf("127.0.0.1:%d", primary.Port()))
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { link.Close() })
	opts.Upstream = link.Addr()
	standby := primary.NewStandby(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := primary.SetSynchronousStandbys(ctx, opts.Name); err != nil {
		t.Fatalf("%v", err)
	}
	return &Pair{Primary: primary, Standby: standby, Link: link, Name: opts.Name}
}

// Failover crashes Primary and promotes Standby ([Failover]); Standby is
// then the primary, and Primary stays stopped.
func (p *Pair) Failover(ctx context.Context) error { return Failover(ctx, p.Primary, p.Standby) }

// URL returns [ReadWriteURL] for db over both clusters: the URL a worker's
// pool should use to follow the failover.
func (p *Pair) URL(db string) string { return ReadWriteURL(db, p.Primary, p.Standby) }

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
