// Package pgtest starts throwaway PostgreSQL clusters from the system's
// server binaries, for tests and benchmarks: what a test of an adapter that
// keeps its dedup record in PostgreSQL needs, from a fresh database to a
// failover.
//
//   - [DB]: the URL of a brand-new empty database on a cluster shared by the
//     whole test binary, dropped when the test ends. Most tests need only
//     this. [DBWith] picks the cluster's [Options] (Durable for benchmarks).
//   - [DedicatedDB]: a fresh database on a cluster of the top-level test's
//     own, with a [RestartFunc] that restarts it and a [CrashRestartFunc]
//     that crashes it and starts it again: a conformance harness's
//     backend-restart and crash-restart capabilities.
//   - [Start] (or [New], without a test): a cluster of one's own, to stop,
//     crash ([Cluster.StopImmediate]) or restart ([Cluster.Restart]).
//   - A failover: [Cluster.NewStandby] (a standby streaming from a
//     cluster, directly or through a TCP proxy that the test can stall,
//     given as [Options].Upstream),
//     [Cluster.SetSynchronousStandbys], [Cluster.StopImmediate] and
//     [Cluster.Promote].
//   - [InstallAppFaults]: triggers that make the server answer a SQLSTATE
//     (40001, 40P01, 55P03) on demand, the connection up: a conformance
//     harness's application faults.
//
// A package that uses DB, DBWith, DedicatedDB or [Shared] must stop the shared
// clusters when its tests finish, by having this TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// Clusters from Start and NewStandby are stopped by t.Cleanup.
//
// If DATABASE_URL is set (a server that allows CREATE DATABASE), DB, DBWith
// and DedicatedDB create their databases on it instead of starting a
// cluster, and DedicatedDB returns no restart or crash function. New and Start
// ignore it: a test that asks for a cluster of its own wants to stop, crash
// or restart it.
//
// Costs: starting a cluster runs initdb and a postmaster, which takes one to
// two seconds and 40 MB of disk in a temporary directory, and leaves a handful
// of server processes running until [Cluster.Stop]. Creating a database with
// DB takes tens of milliseconds. Server binaries are looked up in
// $PGTEST_BIN, then the newest /usr/lib/postgresql/*/bin, then $PATH; when
// none are found, the error says to install them (Debian's and Ubuntu's
// package is postgresql) or to set PGTEST_BIN or DATABASE_URL. When the test
// runs as root, the server runs as the "postgres" system user, because
// PostgreSQL refuses to run as root.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"effectively.dev/internal/testserver"
)

const (
	startTimeout = 30 * time.Second // how long a postmaster may take to accept connections
	stopTimeout  = 10 * time.Second // how long a shutdown may take before we SIGKILL
	superuser    = "postgres"
	systemUser   = "postgres"
	standbyName  = "standby"
	logName      = "postgres.log"
	dataDirName  = "data"
)

// errNotFound is returned when no server binaries can be found.
var errNotFound = errors.New("pgtest: PostgreSQL server binaries (initdb, postgres) not found: " +
	"install them with `apt-get install -y postgresql` or set PGTEST_BIN to their directory, " +
	"or set DATABASE_URL to an existing server")

// Options configures a cluster started by [New] or [Cluster.StartStandby].
// The zero value is a fast, non-durable cluster, right for most tests.
type Options struct {
	// Durable keeps PostgreSQL's default durability. When false, fsync and
	// full_page_writes are off, which makes writes much cheaper but loses data
	// on an OS crash (not on a server crash). synchronous_commit is never
	// changed: commits always wait for their WAL to be written and, if
	// synchronous_standby_names is set, for the synchronous standby.
	// Benchmarks should use Durable clusters to measure realistic costs.
	Durable bool

	// Settings are extra server settings, passed as "-c name=value". They
	// override pgtest's defaults (max_connections=200, wal_level=replica,
	// max_wal_senders=10, max_replication_slots=10, and the Durable ones), but
	// not the listen address, port, socket directory or cluster_name.
	// A standby needs max_connections and similar settings at least as high
	// as its primary's, so give it the same Settings.
	Settings map[string]string

	// Name is the application_name a standby started by
	// [Cluster.StartStandby] puts in its primary_conninfo; it is what the
	// primary's synchronous_standby_names matches. Default "standby".
	// Start ignores it.
	Name string

	// Upstream is the "host:port" a standby started by
	// [Cluster.StartStandby] streams WAL from, instead of its primary's own
	// address: typically a TCP proxy the test controls, to delay or cut
	// replication. pg_basebackup still copies from the primary directly.
	// Start ignores it.
	Upstream string
}

// A Cluster is a running PostgreSQL server whose data lives in a temporary
// directory, started by [New] or [Cluster.StartStandby]. It accepts
// connections as the superuser "postgres" without a password on 127.0.0.1,
// including replication connections. Its methods are safe for concurrent use.
// Call [Cluster.Stop] when done, or the server processes outlive the test
// (they get SIGQUIT if the test process dies).
type Cluster struct {
	bins  binaries
	opts  Options
	cred  *syscall.Credential // run server programs as this user; nil: as ourselves
	dir   string
	port  int
	extra map[string]string // settings that override opts.Settings (primary_conninfo)

	proc *testserver.Proc // the postmaster; nil before its first start

	mu      sync.Mutex // serializes Stop and StopImmediate
	removed bool
}

// New initializes a new cluster in a temporary directory and starts its
// server on a free loopback port, waiting until it accepts connections,
// for a program or a test that stops it itself ([Cluster.Stop]); a test
// calls [Start] instead.
// It takes one to two seconds, mostly initdb. The cluster is configured to
// be a replication primary; see [Cluster.StartStandby]. On failure the error
// includes the tail of the server log, and nothing is left behind.
func New(opts Options) (*Cluster, error) {
	bins, err := findBinaries()
	if err != nil {
		return nil, err
	}
	c, err := newCluster(bins, opts)
	if err != nil {
		return nil, err
	}
	initdb := exec.Command(bins.initdb, "-D", c.dataDir(), "-A", "trust", "-U", superuser,
		"--no-sync", "-E", "UTF8", "--locale=C")
	if out, err := c.run(initdb); err != nil {
		c.removeDir()
		return nil, fmt.Errorf("pgtest: initdb: %v\n%s", err, out)
	}
	hba := "local all all trust\nlocal replication all trust\n" +
		"host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n"
	if err := os.WriteFile(filepath.Join(c.dataDir(), "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		c.removeDir()
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if err := c.launch(); err != nil {
		c.removeDir()
		return nil, err
	}
	return c, nil
}

// StartStandby clones c with pg_basebackup into a new temporary directory and
// starts it as a hot standby streaming from c, with opts.Name as its
// application_name. It waits until the standby accepts (read-only)
// connections, not until it has caught up. The standby becomes synchronous
// once c's synchronous_standby_names names it. It costs a cluster start plus
// copying c's data. The standby is itself configured to be a primary once
// promoted.
func (c *Cluster) StartStandby(opts Options) (*Cluster, error) {
	if c.bins.basebackup == "" {
		return nil, fmt.Errorf("pgtest: pg_basebackup not found next to %s or in PATH", c.bins.postgres)
	}
	name := opts.Name
	if name == "" {
		name = standbyName
	}
	s, err := newCluster(c.bins, opts)
	if err != nil {
		return nil, err
	}
	args := []string{"-D", s.dataDir(), "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", superuser,
		"-X", "stream", "-R", "--checkpoint=fast"}
	if !opts.Durable {
		args = append(args, "--no-sync")
	}
	if out, err := s.run(exec.Command(c.bins.basebackup, args...)); err != nil {
		s.removeDir()
		return nil, fmt.Errorf("pgtest: pg_basebackup: %v\n%s", err, out)
	}
	// -R wrote a primary_conninfo without application_name; the command
	// line overrides it.
	upHost, upPort := "127.0.0.1", strconv.Itoa(c.port)
	if opts.Upstream != "" {
		if upHost, upPort, err = net.SplitHostPort(opts.Upstream); err != nil {
			s.removeDir()
			return nil, fmt.Errorf("pgtest: Options.Upstream: %w", err)
		}
	}
	s.extra = map[string]string{"primary_conninfo": fmt.Sprintf(
		"host=%s port=%s user=%s application_name=%s",
		quoteConninfo(upHost), quoteConninfo(upPort), superuser, quoteConninfo(name))}
	if err := s.launch(); err != nil {
		s.removeDir()
		return nil, err
	}
	return s, nil
}

// Promote turns a standby into a primary (SELECT pg_promote()) and waits,
// up to a minute or until ctx is done, until it accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: promote: %w", err)
	}
	defer conn.Close(context.Background())
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote()").Scan(&ok); err != nil {
		return fmt.Errorf("pgtest: promote: %w", err)
	}
	if !ok {
		return errors.New("pgtest: promote: pg_promote() returned false (not finished within 60 s)")
	}
	return nil
}

// URL returns the URL for connecting to database db as the superuser over
// TCP, e.g. postgres://postgres@127.0.0.1:5432/db?sslmode=disable.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", superuser, c.port, url.PathEscape(db))
}

// Port returns the TCP port the server listens on, on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Dir returns the cluster's temporary directory. It holds the data directory
// (Dir()/data), the server log (Dir()/postgres.log) and the Unix socket, so
// Dir() also works as a libpq host. Stop removes it.
func (c *Cluster) Dir() string { return c.dir }

// CreateDatabase creates an empty database, which takes tens of milliseconds.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	return execAdmin(ctx, c.URL("postgres"), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
}

// Stop shuts the server down with a fast shutdown (SIGINT: clients are
// disconnected, open transactions rolled back), kills its processes if it
// has not exited after 10 s, and removes Dir. It works after StopImmediate,
// and calling it again does nothing.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return nil
	}
	err := c.halt(syscall.SIGINT)
	c.removed = true
	if rmErr := os.RemoveAll(c.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("pgtest: %w", rmErr))
	}
	return err
}

// StopImmediate simulates a crash: it stops the server with an immediate
// shutdown (SIGQUIT: no checkpoint, crash recovery on the next start) and
// waits for it to exit. Dir is kept until Stop.
func (c *Cluster) StopImmediate() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.halt(syscall.SIGQUIT)
}

// Restart restarts the server as an operator would: a fast shutdown (as
// [Cluster.Stop] does, but keeping Dir), then a start on the same port with
// the same data directory, waiting until it accepts connections again. Every
// client is disconnected and open transactions roll back; committed data
// survives. After [Cluster.StopImmediate] it just starts the server, which
// then runs crash recovery. It takes about as long as a start, and fails
// after Stop or if another process took the port in between.
func (c *Cluster) Restart() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return errors.New("pgtest: Restart after Stop")
	}
	if err := c.halt(syscall.SIGINT); err != nil {
		return err
	}
	if err := c.launchOn(c.port, false); err != nil {
		return fmt.Errorf("pgtest: restart on port %d: %w", c.port, err)
	}
	return nil
}

// halt sends sig to the postmaster, if it is still running, and waits for it
// to exit, killing its whole process group after stopTimeout.
func (c *Cluster) halt(sig syscall.Signal) error { return c.proc.Halt(sig) }

// newCluster makes the temporary directory for a cluster, owned by the user
// the server will run as.
func newCluster(bins binaries, opts Options) (*Cluster, error) {
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err == nil {
		dir, err = filepath.Abs(dir)
	}
	if err == nil && cred != nil {
		err = os.Chown(dir, int(cred.Uid), int(cred.Gid))
	}
	if err != nil {
		if dir != "" {
			os.RemoveAll(dir)
		}
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	return &Cluster{bins: bins, opts: opts, cred: cred, dir: dir}, nil
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, dataDirName) }

func (c *Cluster) removeDir() { os.RemoveAll(c.dir) }

// prepare sets up cmd to run as the server user, in c.dir, without
// inherited PG* variables that could redirect it.
func (c *Cluster) prepare(cmd *exec.Cmd) {
	cmd.Dir = c.dir // the server user may not be able to access our working directory
	cmd.SysProcAttr = testserver.SysProcAttr(c.cred, syscall.SIGQUIT)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PG") })
}

// run runs a short-lived program such as initdb and returns its output.
func (c *Cluster) run(cmd *exec.Cmd) ([]byte, error) {
	c.prepare(cmd)
	return cmd.CombinedOutput()
}

// launch starts the postmaster on a free port, retrying with another port
// if the chosen one is taken before the server binds it.
func (c *Cluster) launch() error {
	return testserver.OnFreePort("pgtest", func(port int) error { return c.launchOn(port, true) })
}

// launchOn starts the postmaster on port. A fresh start truncates the
// server log, so that errors quote this attempt's; a restart appends to it.
func (c *Cluster) launchOn(port int, fresh bool) error {
	c.port = port
	clusterName := filepath.Base(c.dir)

	settings := map[string]string{
		"max_connections":       "200",
		"wal_level":             "replica",
		"max_wal_senders":       "10",
		"max_replication_slots": "10",
	}
	if !c.opts.Durable {
		settings["fsync"] = "off"
		settings["full_page_writes"] = "off"
	}
	for k, v := range c.opts.Settings {
		settings[k] = v
	}
	for k, v := range c.extra {
		settings[k] = v
	}
	settings["listen_addresses"] = "127.0.0.1"
	settings["cluster_name"] = clusterName
	args := []string{"-D", c.dataDir(), "-p", strconv.Itoa(port), "-k", c.dir}
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		args = append(args, "-c", k+"="+settings[k])
	}

	cmd := exec.Command(c.bins.postgres, args...)
	c.prepare(cmd)
	proc, err := testserver.Launch("pgtest", "postgres", c.logPath(), testserver.Timeouts{Start: startTimeout, Stop: stopTimeout},
		cmd, fresh, true, func(ctx context.Context) error { return c.ready(ctx, clusterName) },
		func(tail string) bool { return strings.Contains(tail, "Address already in use") })
	if err != nil {
		return err
	}
	c.proc = proc
	return nil
}

// ready reports whether the server accepts connections. The cluster_name
// check makes sure the server that answered is ours, not one that took our
// port (testserver.ErrPortTaken).
func (c *Cluster) ready(ctx context.Context, clusterName string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var name string
	if err := conn.QueryRow(ctx, "SELECT current_setting('cluster_name')").Scan(&name); err != nil {
		return err
	}
	if name != clusterName {
		return testserver.ErrPortTaken
	}
	return nil
}

func (c *Cluster) logPath() string { return filepath.Join(c.dir, logName) }

// serverCredential returns the credential to run server programs with: nil
// normally, the postgres system user's when we are root.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(systemUser)
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root, so the server must run as the %q system user, "+
			"but looking it up failed (%v): create it with `useradd --system %s`", systemUser, err, systemUser)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgtest: user %s: %w", systemUser, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// quoteConninfo quotes a libpq connection-string value.
func quoteConninfo(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// execAdmin runs one statement on a fresh connection to dbURL.
func execAdmin(ctx context.Context, dbURL, sql string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgtest: %s: %w", sql, err)
	}
	return nil
}

// binaries are the paths of the server programs; basebackup may be empty.
type binaries struct {
	initdb, postgres, basebackup string
}

// findBinaries looks in $PGTEST_BIN, then the newest
// /usr/lib/postgresql/*/bin with a server, then $PATH.
func findBinaries() (binaries, error) {
	if dir := os.Getenv("PGTEST_BIN"); dir != "" {
		if b, ok := binariesIn(dir); ok {
			return b, nil
		}
		return binaries{}, fmt.Errorf("pgtest: PGTEST_BIN=%s does not contain initdb and postgres: point it at the bin directory of a PostgreSQL server installation "+
			"(e.g. /usr/lib/postgresql/15/bin after `apt-get install -y postgresql`), or unset it", dir)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { // newest first
		return compareVersions(filepath.Base(filepath.Dir(b)), filepath.Base(filepath.Dir(a)))
	})
	for _, dir := range dirs {
		if b, ok := binariesIn(dir); ok { // client-only packages ship a bin dir without a server
			return b, nil
		}
	}
	initdb, err1 := exec.LookPath("initdb")
	postgres, err2 := exec.LookPath("postgres")
	if err1 != nil || err2 != nil {
		return binaries{}, errNotFound
	}
	b := binaries{initdb: initdb, postgres: postgres}
	if b.basebackup = filepath.Join(filepath.Dir(postgres), "pg_basebackup"); !testserver.IsExecutable(b.basebackup) {
		b.basebackup, _ = exec.LookPath("pg_basebackup")
	}
	return b, nil
}

func binariesIn(dir string) (binaries, bool) {
	b := binaries{
		initdb:     filepath.Join(dir, "initdb"),
		postgres:   filepath.Join(dir, "postgres"),
		basebackup: filepath.Join(dir, "pg_basebackup"),
	}
	if !testserver.IsExecutable(b.basebackup) {
		b.basebackup = ""
	}
	return b, testserver.IsExecutable(b.initdb) && testserver.IsExecutable(b.postgres)
}

// compareVersions compares dotted version strings such as "9.6" and "15"
// numerically; non-numeric parts compare as 0.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}
