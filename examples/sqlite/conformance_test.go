package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	moderncsqlite "modernc.org/sqlite"

	"effectively.dev/conformance"
	"effectively.dev/effects"

	"example.com/sqlite"
)

// Timeouts of the slow-reply scenario: the adapter gives up after
// applyTimeout, and the suite holds each reply for longer.
const (
	applyTimeout = time.Second
	slowReply    = 2 * time.Second
)

// TestConformance holds the adapter to its contract in every scenario,
// each capability attached (restart, crash restart, successor process,
// age, batch count, slow replies, the default key capacity), and fails
// unless every field of the contract is verified.
func TestConformance(t *testing.T) {
	rep := conformance.Run(t, "sqlite", func(t testing.TB) conformance.Harness[sqlite.Entry] {
		return newHarness(t)
	},
		conformance.WithSuccessorProcess(attach),
		conformance.WithSlowReply(slowReply),
		conformance.WithLateRedelivery(time.Second),
	)
	for _, f := range rep.Fields {
		if f.Status != conformance.Verified {
			t.Errorf("contract field %s", f)
		}
	}
	for _, s := range conformance.Scenarios {
		if row, ok := rep.Row(s); !ok || row.Verdict != conformance.Pass && !row.NotApplicable {
			t.Errorf("scenario %s: %s (%s), want it run and passed", s, row.Verdict, row.Skipped)
		}
	}
}

// dsn opens path in WAL mode, with transactions that take the write lock
// at BEGIN (two instances never deadlock upgrading a read lock), a busy
// timeout for the instances' concurrent writers, and synchronous=FULL.
func dsn(path string) string {
	return "file:" + path + "?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)"
}

// harness gives each scenario a database file of its own. admin is the
// harness's own handle, outside the faults: it counts, ages, and holds
// the database open, so that its write-ahead log is never checkpointed
// away by a last connection closing (a crash copies it as it is).
type harness struct {
	mu      sync.Mutex
	root    string // the scenario's directory, removed when it ends
	crashes int    // crash restarts so far: each starts from a copy in root
	path    string // the database file
	admin   *sql.DB
	dbs     map[*sql.DB]struct{} // instances' handles, closed by Restart
}

var (
	_ conformance.Restarter      = (*harness)(nil)
	_ conformance.CrashRestarter = (*harness)(nil)
	_ conformance.Ager           = (*harness)(nil)
	_ conformance.BatchCounter   = (*harness)(nil)
	_ conformance.Attacher       = (*harness)(nil)
)

func newHarness(t testing.TB) *harness {
	t.Helper()
	h := &harness{dbs: map[*sql.DB]struct{}{}}
	h.root = tempDir(t)
	h.path = filepath.Join(h.root, "ledger.db")
	t.Cleanup(h.close)
	admin, err := h.openAdmin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(sqlite.Schema); err != nil {
		t.Fatal(err)
	}
	return h
}

// tempDir is a directory whose path is safe in a URI (t.TempDir keeps
// characters such as '#' and '%' from the test's name).
func tempDir(t testing.TB) string {
	dir, err := os.MkdirTemp("", "sqlite-example-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// attach is the successor process's harness: the test process's database
// file, opened again in the child (conformance.WithSuccessorProcess).
func attach(_ context.Context, path string) (conformance.Harness[sqlite.Entry], error) {
	return &harness{path: path, dbs: map[*sql.DB]struct{}{}}, nil
}

// Attachment is the database file: a second process opens it.
func (h *harness) Attachment() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.path
}

func (h *harness) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.admin != nil {
		h.admin.Close()
		h.admin = nil
	}
}

// openAdmin returns the harness's own handle, opening it if needed.
func (h *harness) openAdmin() (*sql.DB, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.admin == nil {
		c, err := moderncsqlite.NewConnector(dsn(h.path))
		if err != nil {
			return nil, err
		}
		h.admin = sql.OpenDB(c)
	}
	return h.admin, nil
}

// Make opens a new *sql.DB whose every driver call goes through f, and a
// Ledger over it.
func (h *harness) Make(_ context.Context, f *conformance.Faults) (effects.Effect[sqlite.Entry], func(), error) {
	h.mu.Lock()
	path := h.path
	h.mu.Unlock()
	base, err := moderncsqlite.NewConnector(dsn(path))
	if err != nil {
		return nil, nil, err
	}
	db := sql.OpenDB(f.SQLConnector(base))
	l, err := sqlite.New(db, sqlite.WithTimeout(applyTimeout))
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	h.mu.Lock()
	h.dbs[db] = struct{}{}
	h.mu.Unlock()
	return l, func() {
		h.mu.Lock()
		delete(h.dbs, db)
		h.mu.Unlock()
		db.Close()
	}, nil
}

// Input is variant 0 or, under a reused key, another amount.
func (h *harness) Input(_ effects.Key, variant int) sqlite.Entry {
	return sqlite.Entry{Account: "acct-1", Amount: int64(100 + variant)}
}

// Count reads the ledger itself: the entries written under key.
func (h *harness) Count(ctx context.Context, key effects.Key) (int, error) {
	n, err := h.CountBatch(ctx, []effects.Key{key})
	if err != nil {
		return 0, err
	}
	return n[0], nil
}

// Total is every entry written.
func (h *harness) Total(ctx context.Context) (int, error) {
	admin, err := h.openAdmin()
	if err != nil {
		return 0, err
	}
	var n int
	err = admin.QueryRowContext(ctx, `SELECT count(*) FROM entries`).Scan(&n)
	return n, err
}

// CountBatch counts the entries of many keys, a few hundred per query.
func (h *harness) CountBatch(ctx context.Context, keys []effects.Key) ([]int, error) {
	admin, err := h.openAdmin()
	if err != nil {
		return nil, err
	}
	byKey := make(map[string]int, len(keys))
	for chunk := range slicesChunk(keys, 500) {
		args := make([]any, len(chunk))
		for i, k := range chunk {
			args[i] = []byte(k)
		}
		q := `SELECT key, count(*) FROM entries WHERE key IN (?` + strings.Repeat(", ?", len(chunk)-1) + `) GROUP BY key`
		rows, err := admin.QueryContext(ctx, q, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var k []byte
			var n int
			if err := rows.Scan(&k, &n); err != nil {
				rows.Close()
				return nil, err
			}
			byKey[string(k)] = n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	out := make([]int, len(keys))
	for i, k := range keys {
		out[i] = byKey[string(k)]
	}
	return out, nil
}

// slicesChunk yields s in chunks of at most n.
func slicesChunk[T any](s []T, n int) func(func([]T) bool) {
	return func(yield func([]T) bool) {
		for len(s) > 0 {
			c := min(n, len(s))
			if !yield(s[:c]) {
				return
			}
			s = s[c:]
		}
	}
}

// Age makes every key row d older. The adapter keeps keys until pruned,
// so they must still replay.
func (h *harness) Age(ctx context.Context, d time.Duration) error {
	admin, err := h.openAdmin()
	if err != nil {
		return err
	}
	_, err = admin.ExecContext(ctx, `UPDATE effectively_keys SET created_at = created_at - ?`, d.Nanoseconds())
	return err
}

// Restart closes every handle on the database, the instances' connections
// included (the suite redelivers on an instance made before the restart),
// and opens them again over the same files: a clean restart, after which
// SQLite has checkpointed its log.
func (h *harness) Restart(context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for db := range h.dbs {
		db.SetMaxIdleConns(-1) // closes its idle connections: all of them, between Applies
		db.SetMaxIdleConns(2)
	}
	if h.admin != nil {
		h.admin.Close()
		h.admin = nil
	}
	return nil
}

// CrashRestart crashes the database as a killed process leaves it: the
// files are copied as they are, every handle still open and nothing
// checkpointed, the write-ahead log with them (committed transactions
// may be in it alone), and the database starts again from the copy. The
// old files and handles are abandoned, as a crashed process's are. The
// shared-memory index (-shm) is not copied: SQLite rebuilds it from the
// log when it opens the copy, as after a real crash.
func (h *harness) CrashRestart(context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.crashes++
	dir := filepath.Join(h.root, fmt.Sprintf("crash-%d", h.crashes))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	path := filepath.Join(dir, filepath.Base(h.path))
	for _, suffix := range []string{"", "-wal"} {
		if err := copyFile(h.path+suffix, path+suffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("copying the crashed database: %w", err)
		}
	}
	if h.admin != nil {
		h.admin.Close()
		h.admin = nil
	}
	h.path = path
	return nil
}

func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}
