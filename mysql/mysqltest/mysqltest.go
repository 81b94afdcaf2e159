// Package mysqltest starts throwaway MariaDB (or MySQL) servers from the
// system's server binaries, for tests and benchmarks of code that keeps its
// dedup record in MySQL or MariaDB: what package pgtest is for PostgreSQL.
//
//   - [DB]: the DSN of a brand-new empty database on a server shared by the
//     whole test binary, dropped when the test ends. Most tests need only
//     this.
//   - [DedicatedDB]: a fresh database on a server of the top-level test's
//     own, with a [RestartFunc] that restarts it cleanly and a
//     [CrashRestartFunc] that kills it with SIGKILL and starts it again
//     (InnoDB crash recovery): a conformance harness's
//     backend-restart and crash-restart capabilities.
//   - [Start]: a server of one's own, with its [Options] (Durable for
//     benchmarks), to stop, kill ([Server.Kill]) or restart
//     ([Server.Restart]).
//
// A package that uses DB, DedicatedDB or [Shared] must stop the shared
// servers when its tests finish, by having this TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(mysqltest.Main(m)) }
//
// If MYSQL_DSN is set (a go-sql-driver DSN of a user that may CREATE
// DATABASE, e.g. root@tcp(127.0.0.1:3306)/), DB and DedicatedDB
// create their databases on that server instead of starting one, and
// DedicatedDB returns no restart or crash function: that
// server is not the test's to restart. Start ignores it.
//
// Costs: the first server of a test binary runs mariadb-install-db (about
// six seconds, most of it the system tables' bootstrap); later servers copy
// that data directory (tens of milliseconds). Starting mariadbd takes about a
// second, a database tens of milliseconds. Server binaries are looked up in
// $MYSQLTEST_BIN, then $PATH, then /usr/sbin; when none are found, the
// error says to install them (Debian's and Ubuntu's package is
// mariadb-server) or to set MYSQLTEST_BIN or MYSQL_DSN. When the test runs
// as root, the server runs with --user=root, because mariadbd otherwise
// refuses to start as root.
package mysqltest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"effectively.dev/internal/testserver"
)

const (
	startTimeout = 60 * time.Second // how long mariadbd may take to accept connections (crash recovery included)
	stopTimeout  = 30 * time.Second // how long a shutdown may take before we SIGKILL
	logName      = "mysqld.log"
	dataDirName  = "data"
	socketName   = "mysqld.sock"
	initFileName = "init.sql"
	redoLogSize  = "16M" // MariaDB's InnoDB redo log (its default, 96M, is most of a copy's cost)
)

// errNotFound is returned when no server binaries can be found.
var errNotFound = errors.New("mysqltest: MariaDB/MySQL server binaries (mariadbd or mysqld, and mariadb-install-db for MariaDB) not found: " +
	"install them with `apt-get install -y mariadb-server` or set MYSQLTEST_BIN to their directory, " +
	"or set MYSQL_DSN to an existing server")

// Options configures a server started by [Start]. The zero value is a fast,
// non-durable server, right for most tests.
type Options struct {
	// Durable keeps InnoDB's durable defaults. When false (and the server
	// is MariaDB), innodb_flush_method is nosync and the doublewrite buffer
	// is off, which makes commits much cheaper but loses data on an OS
	// crash (not on a server crash: a SIGKILLed server keeps every commit).
	// innodb_flush_log_at_trx_commit is 1 either way, so the settings that
	// mysql.Check inspects are safe. Benchmarks should use Durable servers.
	Durable bool

	// Settings are extra server options, passed as --name=value, or as
	// --name for an empty value (underscores and dashes alike). They
	// override the package's defaults (log-bin turns the binary log on,
	// which is off by default), but not the address, port, data
	// directory, socket or log file.
	Settings map[string]string
}

// A Server is a running MariaDB or MySQL server whose data lives in a
// temporary directory, started by [Start]. It accepts connections as root
// without a password on 127.0.0.1. Its methods are safe for concurrent
// use. Call [Server.Stop] when done.
type Server struct {
	bins binaries
	opts Options
	dir  string
	port int

	mu      sync.Mutex       // serializes Stop, Kill and Restart
	proc    *testserver.Proc // the server; nil before its first start
	removed bool
}

// newServer initializes a new server in a temporary directory and starts it on a
// free loopback port, waiting until it accepts connections. On failure the
// error includes the tail of the server log, and nothing is left behind.
func newServer(opts Options) (*Server, error) {
	bins, err := findBinaries()
	if err != nil {
		return nil, err
	}
	tmpl, err := template(bins)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "mysqltest-")
	if err == nil {
		dir, err = filepath.Abs(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("mysqltest: %w", err)
	}
	s := &Server{bins: bins, opts: opts, dir: dir}
	if out, err := exec.Command("cp", "-a", tmpl, s.dataDir()).CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("mysqltest: copy the initialized data directory: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, initFileName), []byte(initSQL), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("mysqltest: %w", err)
	}
	if err := s.launch(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// initSQL runs at every start: it lets root connect over TCP from
// 127.0.0.1 without a password (MariaDB's install script creates that
// account already; MySQL's creates only root@localhost).
const initSQL = `CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
`

// Start initializes a new server in a temporary directory and starts it
// on a free loopback port, waiting until it accepts connections; it stops
// the server when t ends. It fails t when the server cannot start, with
// the tail of the server log, leaving nothing behind.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := newServer(opts)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return s
}

// DSN returns the go-sql-driver DSN for connecting to database db as root
// over TCP, e.g. root@tcp(127.0.0.1:3306)/db.
func (s *Server) DSN(db string) string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)), db
	return cfg.FormatDSN()
}

// Port returns the TCP port the server listens on, on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// Dir returns the server's temporary directory: its data directory
// (Dir()/data), its log (Dir()/mysqld.log) and its Unix socket
// (Dir()/mysqld.sock). Stop removes it.
func (s *Server) Dir() string { return s.dir }

// MariaDB reports whether the server is MariaDB (rather than MySQL).
func (s *Server) MariaDB() bool { return s.bins.mariadb }

// CreateDatabase creates an empty database with the server's default
// character set (utf8mb4).
func (s *Server) CreateDatabase(ctx context.Context, name string) error {
	return execAdmin(ctx, s.DSN(""), "CREATE DATABASE "+quoteIdent(name))
}

// Stop shuts the server down cleanly (SIGTERM), kills it if it has not
// exited after 30 s, and removes Dir. It works after Kill, and calling it
// again does nothing.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed {
		return nil
	}
	err := s.halt(syscall.SIGTERM)
	s.removed = true
	if rmErr := os.RemoveAll(s.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("mysqltest: %w", rmErr))
	}
	return err
}

// Kill simulates a crash: it sends SIGKILL to the server (no shutdown, no
// flush of anything InnoDB had not written at commit) and waits for it to
// exit. Dir is kept; Restart starts it again, with crash recovery.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.halt(syscall.SIGKILL)
}

// Restart restarts the server as an operator would: a clean shutdown
// (every client disconnected, open transactions rolled back; after Kill,
// nothing to stop), then a start on the same port with the same data
// directory, waiting until it accepts connections again. Committed data
// survives. It fails after Stop or if another process took the port.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed {
		return errors.New("mysqltest: Restart after Stop")
	}
	if err := s.halt(syscall.SIGTERM); err != nil {
		return err
	}
	if err := s.launchOn(s.port, false); err != nil {
		return fmt.Errorf("mysqltest: restart on port %d: %w", s.port, err)
	}
	return nil
}

// Crash kills the server with SIGKILL ([Server.Kill]) and starts it again
// on the same port ([Server.Restart]), which runs InnoDB's crash recovery:
// every commit the server acknowledged under innodb_flush_log_at_trx_commit
// = 1 survives, and so does every other commit it had handed to the OS.
func (s *Server) Crash() error {
	if err := s.Kill(); err != nil {
		return err
	}
	return s.Restart()
}

// halt sends sig to the server, if it is still running, and waits for it to
// exit, killing its process group after stopTimeout.
func (s *Server) halt(sig syscall.Signal) error { return s.proc.Halt(sig) }

func (s *Server) dataDir() string { return filepath.Join(s.dir, dataDirName) }

func (s *Server) logPath() string { return filepath.Join(s.dir, logName) }

// launch starts the server on a free port, retrying with another port if
// the chosen one is taken before the server binds it.
func (s *Server) launch() error {
	return testserver.OnFreePort("mysqltest", func(port int) error { return s.launchOn(port, true) })
}

// args returns the server's command line for port.
func (s *Server) args(port int) []string {
	settings := map[string]string{
		"character-set-server":    "utf8mb4",
		"collation-server":        "utf8mb4_general_ci", // Debian's default, and most installations'
		"max-connections":         "500",
		"innodb-buffer-pool-size": "64M",
		"skip-name-resolve":       "",
		"skip-log-bin":            "",
	}
	if s.bins.mariadb {
		// The initialized data directory's redo log (see initialize):
		// small, so that copying it is quick.
		settings["innodb-log-file-size"] = redoLogSize
	}
	if !s.opts.Durable && s.bins.mariadb {
		settings["innodb-flush-method"] = "nosync"
		settings["innodb-doublewrite"] = "0"
	}
	for k, v := range s.opts.Settings {
		k = strings.ReplaceAll(k, "_", "-")
		if k == "log-bin" {
			delete(settings, "skip-log-bin")
		}
		settings[k] = v
	}
	args := []string{"--no-defaults"}
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		if v := settings[k]; v != "" {
			args = append(args, "--"+k+"="+v)
		} else {
			args = append(args, "--"+k)
		}
	}
	args = append(args,
		"--datadir="+s.dataDir(),
		"--port="+strconv.Itoa(port),
		"--bind-address=127.0.0.1",
		"--socket="+filepath.Join(s.dir, socketName),
		"--pid-file="+filepath.Join(s.dir, "mysqld.pid"),
		"--log-error="+s.logPath(),
		"--init-file="+filepath.Join(s.dir, initFileName),
	)
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	return args
}

// launchOn starts the server on port. A fresh start truncates the server
// log, so that errors quote this attempt's; a restart appends to it.
func (s *Server) launchOn(port int, fresh bool) error {
	s.port = port
	cmd := exec.Command(s.bins.server, s.args(port)...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = testserver.SysProcAttr(nil, syscall.SIGKILL)
	proc, err := testserver.Launch("mysqltest", s.bins.server, s.logPath(), testserver.Timeouts{Start: startTimeout, Stop: stopTimeout},
		cmd, fresh, false, s.ready, func(tail string) bool {
			return strings.Contains(tail, "Address already in use") || strings.Contains(tail, "Do you already have another")
		})
	if err != nil {
		return err
	}
	s.proc = proc
	return nil
}

// ready reports whether the server accepts connections. The datadir check
// makes sure the server that answered is ours, not one that took our port
// (testserver.ErrPortTaken).
func (s *Server) ready(ctx context.Context) error {
	db, err := sql.Open("mysql", s.DSN(""))
	if err != nil {
		return err
	}
	defer db.Close()
	var dir string
	if err := db.QueryRowContext(ctx, "SELECT @@datadir").Scan(&dir); err != nil {
		return err
	}
	if filepath.Clean(dir) != filepath.Clean(s.dataDir()) {
		return testserver.ErrPortTaken
	}
	return nil
}

// The initialized data directory every server of the test binary copies:
// initializing one takes seconds, copying it milliseconds.
var (
	tmplMu  sync.Mutex
	tmplDir string
)

// template returns the path of an initialized data directory, creating it
// on first use; shutdown removes it.
func template(bins binaries) (string, error) {
	tmplMu.Lock()
	defer tmplMu.Unlock()
	if tmplDir == "" {
		dir, err := initialize(bins)
		if err != nil {
			return "", err
		}
		tmplDir = dir
	}
	return tmplDir, nil
}

// initialize creates an initialized data directory in a temporary
// directory and returns its path.
func initialize(bins binaries) (string, error) {
	dir, err := os.MkdirTemp("", "mysqltest-template-")
	if err == nil {
		dir, err = filepath.Abs(dir)
	}
	if err != nil {
		return "", fmt.Errorf("mysqltest: %w", err)
	}
	data := filepath.Join(dir, dataDirName)
	var cmd *exec.Cmd
	if bins.mariadb {
		args := []string{"--no-defaults", "--datadir=" + data, "--auth-root-authentication-method=normal",
			"--skip-test-db", "--skip-name-resolve", "--innodb-flush-method=nosync", "--innodb-log-file-size=" + redoLogSize}
		if os.Geteuid() == 0 {
			args = append(args, "--user=root")
		}
		cmd = exec.Command(bins.install, args...)
	} else {
		args := []string{"--no-defaults", "--initialize-insecure", "--datadir=" + data}
		if os.Geteuid() == 0 {
			args = append(args, "--user=root")
		}
		cmd = exec.Command(bins.server, args...)
	}
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("mysqltest: %s: %v\n%s", filepath.Base(cmd.Path), err, out)
	}
	return data, nil
}

// binaries are the paths of the server programs.
type binaries struct {
	server  string // mariadbd or mysqld
	install string // mariadb-install-db or mysql_install_db (MariaDB only)
	mariadb bool
}

// findBinaries looks in $MYSQLTEST_BIN, then $PATH, then /usr/sbin and
// /usr/bin.
func findBinaries() (binaries, error) {
	var dirs []string
	if d := os.Getenv("MYSQLTEST_BIN"); d != "" {
		dirs = []string{d}
	} else {
		dirs = append(filepath.SplitList(os.Getenv("PATH")), "/usr/sbin", "/usr/bin", "/usr/local/mysql/bin", "/usr/local/mysql/scripts")
	}
	find := func(names ...string) string {
		for _, d := range dirs {
			for _, n := range names {
				if p := filepath.Join(d, n); testserver.IsExecutable(p) {
					return p
				}
			}
		}
		return ""
	}
	b := binaries{server: find("mariadbd", "mysqld"), install: find("mariadb-install-db", "mysql_install_db")}
	if b.server == "" {
		if d := os.Getenv("MYSQLTEST_BIN"); d != "" {
			return binaries{}, fmt.Errorf("mysqltest: MYSQLTEST_BIN=%s holds neither mariadbd nor mysqld: point it at the directory of a MariaDB or MySQL server (e.g. /usr/sbin after `apt-get install -y mariadb-server`), or unset it", d)
		}
		return binaries{}, errNotFound
	}
	out, err := exec.Command(b.server, "--version").CombinedOutput()
	if err != nil {
		return binaries{}, fmt.Errorf("mysqltest: %s --version: %v\n%s", b.server, err, out)
	}
	b.mariadb = strings.Contains(string(out), "MariaDB")
	if b.mariadb && b.install == "" {
		return binaries{}, errNotFound
	}
	return b, nil
}

// quoteIdent quotes a MySQL identifier.
func quoteIdent(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

// execAdmin runs one statement on a fresh connection to dsn.
func execAdmin(ctx context.Context, dsn, stmt string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return fmt.Errorf("mysqltest: %w", err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, stmt); err != nil {
		return fmt.Errorf("mysqltest: %s: %w", stmt, err)
	}
	return nil
}
