package pgtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"effectively.dev/internal/testserver"
)

// What only this package's tests use: a primary-standby pair and its
// failover, and a poll of a settling state.
var (
	WaitFor      = waitFor
	StartPair    = startPair
	ReadWriteURL = readWriteURL
)

type Pair = pair

// failover does what a failover manager does when a primary dies: it
// crashes primary (an immediate shutdown, [Cluster.StopImmediate]: every
// connection dies at once, in-flight transactions with it) and promotes
// standby ([Cluster.Promote]), returning when standby accepts writes. What
// survives is what standby had received: with a synchronous standby, every
// acknowledged commit. primary's directory is kept until its Stop.
func failover(ctx context.Context, primary, standby *Cluster) error {
	if err := primary.StopImmediate(); err != nil {
		return err
	}
	return standby.Promote(ctx)
}

// readWriteURL returns a connection URL for database db that lists every
// cluster as a host with target_session_attrs=read-write, so that pgx (and
// libpq) connect to whichever of them accepts writes: after a failover,
// new connections of a pool find the promoted standby by themselves.
// connect_timeout=2 keeps a dead host from stalling a connect. It needs at
// least one cluster.
func readWriteURL(db string, clusters ...*Cluster) string {
	hosts := make([]string, len(clusters))
	for i, c := range clusters {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", c.Port())
	}
	u := clusters[0].URL(db)
	u = strings.Replace(u, fmt.Sprintf("127.0.0.1:%d", clusters[0].Port()), strings.Join(hosts, ","), 1)
	return u + "&target_session_attrs=read-write&connect_timeout=2"
}

// pair is a primary and a synchronous standby that streams from it
// through a [Proxy], started for one test by startPair: the setup of a
// failover test.
type pair struct {
	// Primary is the cluster the test writes to.
	Primary *Cluster
	// Standby is a hot standby of Primary, synchronous (named in Primary's
	// synchronous_standby_names as Name) and streaming through Link.
	Standby *Cluster
	// Link carries replication from Primary to Standby: Stall it to hold
	// back WAL. With a synchronous standby, commits then wait.
	Link *testserver.Proxy
	// Name is the standby's application_name.
	Name string
}

// startPair starts a primary with opts, a standby of it named opts.Name
// (default "standby") streaming through a new [Proxy], and makes the
// standby synchronous; everything is stopped when t ends. It takes two
// cluster starts and a base backup, a few seconds. opts.Upstream is
// ignored. Call [Cluster.SetSynchronousStandbys] on Primary with no names
// to make the standby asynchronous (the control of a failover test).
// Create the test's databases on Primary: the standby replicates them.
// startPair ignores DATABASE_URL: a failover needs clusters the test owns.
func startPair(t testing.TB, opts Options) *pair {
	t.Helper()
	if opts.Name == "" {
		opts.Name = standbyName
	}
	primary := Start(t, opts)
	link, err := testserver.NewProxy(fmt.Sprintf("127.0.0.1:%d", primary.Port()))
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
	return &pair{Primary: primary, Standby: standby, Link: link, Name: opts.Name}
}

// Failover crashes Primary and promotes Standby (failover); Standby is
// then the primary, and Primary stays stopped.
func (p *pair) Failover(ctx context.Context) error { return failover(ctx, p.Primary, p.Standby) }

// URL returns readWriteURL for db over both clusters: the URL a worker's
// pool should use to follow the failover.
func (p *pair) URL(db string) string { return readWriteURL(db, p.Primary, p.Standby) }

// waitFor polls sql on conn every 20 ms until it returns want (as text), and
// fails t if ctx ends first: for states that settle asynchronously, such as
// a standby's replication state.
func waitFor(t testing.TB, ctx context.Context, conn *pgx.Conn, sql, want string) {
	t.Helper()
	var got string
	for {
		err := conn.QueryRow(ctx, sql).Scan(&got)
		if err == nil && got == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: got %q (err %v), want %q", sql, got, err, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
