package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// TestMain stops the shared clusters after the tests and checks, with
// goleak, that no goroutine (a pool's health checker, say) outlived them.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// ledgerDDL is the business table the tests write. It deliberately has no
// unique index: only the dedup row can keep a duplicate out, and counting
// rows per event_id shows whether it did.
const ledgerDDL = `CREATE TABLE ledger (
	id       bigserial,
	event_id text   NOT NULL,
	amount   bigint NOT NULL
)`

// payment is the input of the tests' effect.
type payment struct {
	EventID string
	Amount  int64
}

// writeLedger is the tests' effect: one ledger row, whose id is the ref.
func writeLedger(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO ledger (event_id, amount) VALUES ($1, $2) RETURNING id`,
		p.EventID, p.Amount).Scan(&id)
	return "ledger:" + strconv.FormatInt(id, 10), err
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newDB creates a database with the schema and the ledger table and returns
// its URL.
func newDB(t testing.TB) string {
	t.Helper()
	return newDBWith(t, pgtest.Options{})
}

func newDBWith(t testing.TB, opts pgtest.Options) string {
	t.Helper()
	url := pgtest.DBWith(t, opts)
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := postgres.Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, ledgerDDL); err != nil {
		t.Fatal(err)
	}
	return url
}

// newPool opens a pool on url, closed when t ends; configure may adjust its
// config first.
func newPool(t testing.TB, url string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// asyncPool returns a pool to url whose sessions run with
// synchronous_commit = off: the settings under which an acknowledged
// commit can be lost, which Apply refuses (ErrAsyncCommit).
func asyncPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	return newPool(t, url, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["synchronous_commit"] = "off" })
}

// count runs a SELECT count(*) query.
func count(t testing.TB, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func mustExec(t testing.TB, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// faults is a pgx DialFunc whose connections lose one reply from the server
// on demand: the reply is read off the socket (so the server has done the
// work, e.g. committed) and then the connection is closed instead of
// delivering it. It simulates a network cut or a client crash at the worst
// moment, deterministically.
type faults struct {
	onCommit  atomic.Bool  // drop the reply to the next COMMIT
	countdown atomic.Int64 // > 0: drop the reply to the countdown-th write from now
	fired     atomic.Int64 // replies dropped so far
}

// isCommit reports whether p, a write to the server, holds a COMMIT: pgx's
// tx.Commit sends a simple Query message "commit"; Apply pipelines the ref
// UPDATE and "COMMIT" in one batch, whose Parse message has the SQL text
// when the statement is not cached (pgx.QueryExecModeExec).
func isCommit(p []byte) bool {
	return bytes.Contains(p, []byte("Q\x00\x00\x00\x0bcommit\x00")) || bytes.Contains(p, []byte("COMMIT\x00"))
}

var errInjected = errors.New("connection reset (injected: reply dropped after the server sent it)")

func (f *faults) configure(cfg *pgxpool.Config) {
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &faultConn{Conn: c, f: f}, nil
	}
}

type faultConn struct {
	net.Conn
	f        *faults
	dropNext atomic.Bool
}

func (c *faultConn) Write(p []byte) (int, error) {
	if c.f.onCommit.Load() && isCommit(p) && c.f.onCommit.CompareAndSwap(true, false) {
		c.dropNext.Store(true)
	} else if n := c.f.countdown.Load(); n > 0 && c.f.countdown.CompareAndSwap(n, n-1) && n == 1 {
		c.dropNext.Store(true)
	}
	return c.Conn.Write(p)
}

func (c *faultConn) Read(p []byte) (int, error) {
	if c.dropNext.CompareAndSwap(true, false) {
		var b [1]byte
		_, _ = c.Conn.Read(b[:]) // wait for the server's reply: it has done the work
		c.Conn.Close()
		c.f.fired.Add(1)
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: errInjected}
	}
	return c.Conn.Read(p)
}

var exampleSeq atomic.Int64

// exampleDB stands in, in the examples, for the application's own pool
// (pgxpool.New(ctx, os.Getenv("DATABASE_URL"))): it creates an empty
// database on the test cluster.
func exampleDB() *pgxpool.Pool {
	ctx := context.Background()
	c, err := pgtest.Shared()
	if err != nil {
		panic(err)
	}
	name := fmt.Sprintf("example_%d_%d", os.Getpid(), exampleSeq.Add(1))
	if err := c.CreateDatabase(ctx, name); err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, c.URL(name))
	if err != nil {
		panic(err)
	}
	return pool
}

// pollUntil polls sql on conn every 20 ms until it returns want (as text),
// and fails t if ctx ends first: for states that settle asynchronously.
func pollUntil(t testing.TB, ctx context.Context, conn *pgx.Conn, sql, want string) {
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
