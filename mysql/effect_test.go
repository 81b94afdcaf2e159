package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/mysql"
	"effectively.dev/mysql/mysqltest"
)

// TestApplyOnceAndReplay: a new key applies with its ref; its redelivery
// replays that ref without writing; the key with another payload is
// refused as reused.
func TestApplyOnceAndReplay(t *testing.T) {
	db, _ := newDB(t)
	ctx := testCtx(t)
	eff, err := mysql.New(db, "payments", writeLedger)
	if err != nil {
		t.Fatal(err)
	}
	key := effects.MustKey("payments", "evt-1", "charge")
	first, err := eff.Apply(ctx, key, payment{EventID: "evt-1", Amount: 100})
	if err != nil || first.Status != effects.Applied || !strings.HasPrefix(first.Ref, "ledger:") {
		t.Fatalf("first Apply: %+v, %v", first, err)
	}
	again, err := eff.Apply(ctx, key, payment{EventID: "evt-1", Amount: 100})
	if err != nil || again.Status != effects.Replayed || again.Ref != first.Ref {
		t.Errorf("redelivery: %+v, %v; want replayed %q", again, err, first.Ref)
	}
	if _, err := eff.Apply(ctx, key, payment{EventID: "evt-1", Amount: 999}); !errors.Is(err, effects.ErrKeyReused) || effects.ClassOf(err) == effects.Retryable {
		t.Errorf("another payload: %v, want ErrKeyReused, not retryable", err)
	}
	if n := ledgerRows(t, db, "evt-1"); n != 1 {
		t.Errorf("ledger rows: %d, want 1", n)
	}
}

// TestWriteErrorRollsBack: the write's own error is returned wrapped, not
// retryable, and nothing of the attempt, key included, is committed.
func TestWriteErrorRollsBack(t *testing.T) {
	db, _ := newDB(t)
	ctx := testCtx(t)
	declined := errors.New("card declined")
	eff, err := mysql.New(db, "s", func(ctx context.Context, tx *sql.Tx, p payment) (string, error) {
		if _, err := writeLedger(ctx, tx, p); err != nil {
			return "", err
		}
		return "", declined
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = eff.Apply(ctx, effects.MustKey("k"), payment{EventID: "evt", Amount: 1})
	if !errors.Is(err, declined) || effects.ClassOf(err) == effects.Retryable {
		t.Errorf("Apply: %v, want the write's error, not retryable", err)
	}
	if n := ledgerRows(t, db, "evt"); n != 0 {
		t.Errorf("ledger rows after a failed write: %d, want 0", n)
	}
}

// TestConcurrentDuplicates: many Applies of one key at once write once;
// every one returns the first ref.
func TestConcurrentDuplicates(t *testing.T) {
	db, _ := newDB(t)
	ctx := testCtx(t)
	eff, err := mysql.New(db, "s", writeLedger)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	refs := make([]string, 16)
	errs := make([]error, 16)
	for i := range refs {
		wg.Go(func() {
			res, err := eff.Apply(ctx, effects.MustKey("dup"), payment{EventID: "dup", Amount: 5})
			refs[i], errs[i] = res.Ref, err
		})
	}
	wg.Wait()
	for i := range refs {
		if errs[i] != nil || refs[i] != refs[0] {
			t.Errorf("Apply %d: ref %q, %v; want %q", i, refs[i], errs[i], refs[0])
		}
	}
	if n := ledgerRows(t, db, "dup"); n != 1 {
		t.Errorf("ledger rows: %d, want 1", n)
	}
}

// TestDeadlockRetried: two Applies whose writes lock two rows in opposite
// orders deadlock; InnoDB rolls one back (1213), Apply retries it, and
// both apply once. Without retries the victim is ErrTransient, with
// nothing written.
func TestDeadlockRetried(t *testing.T) {
	for _, retries := range []int{5, 0} {
		t.Run(fmt.Sprintf("retries=%d", retries), func(t *testing.T) {
			db, _ := newDB(t)
			ctx := testCtx(t)
			if _, err := db.ExecContext(ctx, `CREATE TABLE accounts (id INT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB`); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `INSERT INTO accounts VALUES (1, 0), (2, 0)`); err != nil {
				t.Fatal(err)
			}
			var (
				both  sync.WaitGroup // both hold their first lock
				calls atomic.Int32
			)
			both.Add(2)
			eff, err := mysql.New(db, "s", func(ctx context.Context, tx *sql.Tx, p payment) (string, error) {
				first, second := 1, 2
				if p.Amount == 2 {
					first, second = 2, 1
				}
				if _, err := tx.ExecContext(ctx, `UPDATE accounts SET n = n + 1 WHERE id = ?`, first); err != nil {
					return "", err
				}
				if calls.Add(1) <= 2 {
					both.Done()
					both.Wait()
				}
				if _, err := tx.ExecContext(ctx, `UPDATE accounts SET n = n + 1 WHERE id = ?`, second); err != nil {
					return "", err
				}
				return writeLedger(ctx, tx, p)
			}, mysql.WithMaxRetries(retries))
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range errs {
				wg.Go(func() {
					id := fmt.Sprintf("evt-%d", i+1)
					_, errs[i] = eff.Apply(ctx, effects.MustKey(id), payment{EventID: id, Amount: int64(i + 1)})
				})
			}
			wg.Wait()
			failed := 0
			for i, err := range errs {
				switch {
				case err == nil:
					if n := ledgerRows(t, db, fmt.Sprintf("evt-%d", i+1)); n != 1 {
						t.Errorf("Apply %d succeeded with %d ledger rows, want 1", i+1, n)
					}
				case errors.Is(err, effects.ErrTransient) && retries == 0:
					failed++
					if !isErrNumber(err, 1213) {
						t.Errorf("Apply %d: %v, want the deadlock (1213) underneath", i+1, err)
					}
					if n := ledgerRows(t, db, fmt.Sprintf("evt-%d", i+1)); n != 0 {
						t.Errorf("Apply %d: ErrTransient with %d ledger rows, want 0", i+1, n)
					}
				default:
					t.Errorf("Apply %d: %v", i+1, err)
				}
			}
			if retries == 0 && failed != 1 {
				t.Errorf("%d Applies failed without retries, want the deadlock's victim", failed)
			}
			if retries > 0 && calls.Load() != 3 {
				t.Errorf("the writes ran %d times, want 3 (the victim's twice)", calls.Load())
			}
		})
	}
}

func isErrNumber(err error, n uint16) bool {
	var me *driver.MySQLError
	return errors.As(err, &me) && me.Number == n
}

// TestLockWaitTimeoutTransient: a write that waits for a row lock longer
// than innodb_lock_wait_timeout (1205) is retried, and after the last
// retry Apply returns ErrTransient with nothing written.
func TestLockWaitTimeoutTransient(t *testing.T) {
	db, _ := newDB(t)
	ctx := testCtx(t)
	if _, err := db.ExecContext(ctx, `CREATE TABLE accounts (id INT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO accounts VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if _, err := holder.ExecContext(ctx, `UPDATE accounts SET n = 1 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	eff, err := mysql.New(db, "s", func(ctx context.Context, tx *sql.Tx, p payment) (string, error) {
		calls.Add(1)
		if _, err := tx.ExecContext(ctx, `SET SESSION innodb_lock_wait_timeout = 1`); err != nil {
			return "", err
		}
		if _, err := writeLedger(ctx, tx, p); err != nil {
			return "", err
		}
		_, err := tx.ExecContext(ctx, `UPDATE accounts SET n = n + 1 WHERE id = 1`)
		return "", err
	}, mysql.WithMaxRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	_, err = eff.Apply(ctx, effects.MustKey("k"), payment{EventID: "evt", Amount: 1})
	if !errors.Is(err, effects.ErrTransient) || !isErrNumber(err, 1205) {
		t.Errorf("Apply: %v, want ErrTransient over 1205", err)
	}
	if calls.Load() != 2 {
		t.Errorf("the write ran %d times, want 2 (one retry)", calls.Load())
	}
	if n := ledgerRows(t, db, "evt"); n != 0 {
		t.Errorf("ledger rows: %d, want 0", n)
	}
}

// TestReadOnlyServerTransient: a server in read-only mode (a replica, a
// failover in progress) refuses the write with 1290: transient, nothing
// written, and the same key applies once the server is writable.
func TestReadOnlyServerTransient(t *testing.T) {
	s := mysqltest.Start(t, mysqltest.Options{})
	ctx := testCtx(t)
	if err := s.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", s.DSN("app"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, stmt := range []string{
		// read_only binds users without SUPER (READ ONLY ADMIN): an
		// application's user.
		`CREATE USER 'app'@'127.0.0.1'`, `GRANT ALL ON app.* TO 'app'@'127.0.0.1'`,
	} {
		if _, err := admin.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	if err := mysql.Migrate(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(ctx, ledgerDDL); err != nil {
		t.Fatal(err)
	}
	cfg, _ := driver.ParseDSN(s.DSN("app"))
	cfg.User = "app"
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	eff, err := mysql.New(db, "s", writeLedger)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(ctx, `SET GLOBAL read_only = 1`); err != nil {
		t.Fatal(err)
	}
	_, err = eff.Apply(ctx, effects.MustKey("k"), payment{EventID: "evt", Amount: 1})
	if !errors.Is(err, effects.ErrTransient) || !(isErrNumber(err, 1290) || isErrNumber(err, 1836)) {
		t.Errorf("Apply on a read-only server: %v, want ErrTransient over 1290", err)
	}
	if _, err := admin.ExecContext(ctx, `SET GLOBAL read_only = 0`); err != nil {
		t.Fatal(err)
	}
	if res, err := eff.Apply(ctx, effects.MustKey("k"), payment{EventID: "evt", Amount: 1}); err != nil || res.Status != effects.Applied {
		t.Errorf("Apply once writable: %+v, %v; want applied", res, err)
	}
}

// TestConfigErrors: an unknown table or column, in the write or because
// Migrate did not run, is a ConfigError naming it, and never retried.
func TestConfigErrors(t *testing.T) {
	ctx := testCtx(t)
	for _, tc := range []struct {
		name    string
		migrate bool
		stmt    string
		want    string
	}{
		{"effectively_keys missing", false, `INSERT INTO ledger (event_id, amount) VALUES ('x', 1)`, "effectively_keys"},
		{"write's table missing", true, `INSERT INTO nowhere (a) VALUES (1)`, "nowhere"},
		{"write's column missing", true, `INSERT INTO ledger (event_id, amount, nope) VALUES ('x', 1, 2)`, "nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, err := sql.Open("mysql", mysqltest.DB(t))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if tc.migrate {
				if err := mysql.Migrate(ctx, db); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := db.ExecContext(ctx, ledgerDDL); err != nil {
				t.Fatal(err)
			}
			eff, err := mysql.New(db, "s", func(ctx context.Context, tx *sql.Tx, _ payment) (string, error) {
				_, err := tx.ExecContext(ctx, tc.stmt)
				return "", err
			})
			if err != nil {
				t.Fatal(err)
			}
			_, err = eff.Apply(ctx, effects.MustKey("k"), payment{})
			var cfg *effects.ConfigError
			if !errors.As(err, &cfg) || effects.ClassOf(err) != effects.InvalidConfig || !strings.Contains(cfg.Option, tc.want) {
				t.Errorf("Apply: %v, want a ConfigError naming %s", err, tc.want)
			}
		})
	}
}

// TestWriteMustNotEndTx: a write that commits the transaction itself
// fails the attempt; the key is not recorded.
func TestWriteMustNotEndTx(t *testing.T) {
	db, _ := newDB(t)
	ctx := testCtx(t)
	eff, err := mysql.New(db, "s", func(ctx context.Context, tx *sql.Tx, p payment) (string, error) {
		if _, err := writeLedger(ctx, tx, p); err != nil {
			return "", err
		}
		return "", tx.Commit()
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eff.Apply(ctx, effects.MustKey("k"), payment{EventID: "evt", Amount: 1}); err == nil || effects.ClassOf(err) == effects.Retryable {
		t.Errorf("Apply with a write that commits: %v, want a permanent error", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM effectively_keys").Scan(&n); err != nil || n != 0 {
		t.Errorf("keys recorded: %d (%v), want 0", n, err)
	}
}

// TestNewConfig: bad arguments and options are ConfigErrors, found before
// any I/O.
func TestNewConfig(t *testing.T) {
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/x") // never connected
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for name, err := range map[string]error{
		"nil db":           func() error { _, err := mysql.New[payment](nil, "s", writeLedger); return err }(),
		"nil write":        func() error { _, err := mysql.New[payment](db, "s", nil); return err }(),
		"empty scope":      func() error { _, err := mysql.New(db, "", writeLedger); return err }(),
		"long scope":       func() error { _, err := mysql.New(db, strings.Repeat("s", 256), writeLedger); return err }(),
		"NUL in scope":     func() error { _, err := mysql.New(db, "a\x00b", writeLedger); return err }(),
		"negative retries": func() error { _, err := mysql.New(db, "s", writeLedger, mysql.WithMaxRetries(-1)); return err }(),
		"bad isolation": func() error {
			_, err := mysql.New(db, "s", writeLedger, mysql.WithIsolation(sql.LevelSnapshot))
			return err
		}(),
		"Fingerprint on *In only": func() error {
			_, err := mysql.New(db, "s", func(context.Context, *sql.Tx, ptrFingerprinted) (string, error) { return "", nil })
			return err
		}(),
		"journal nil db":      func() error { _, err := mysql.NewJournal(nil, "s"); return err }(),
		"pruner horizon":      (&mysql.Pruner{DB: db, Scope: "s"}).Run(context.Background()),
		"pruner rate":         (&mysql.Pruner{DB: db, Scope: "s", Horizon: time.Hour, Rate: -1}).Run(context.Background()),
		"prune negative size": func() error { _, err := mysql.Prune(context.Background(), db, "s", time.Now(), -1); return err }(),
		"migrate nil":         mysql.Migrate(context.Background(), (*sql.DB)(nil)),
	} {
		if effects.ClassOf(err) != effects.InvalidConfig {
			t.Errorf("%s: %v, want a ConfigError", name, err)
		}
	}
}

// ptrFingerprinted has a Fingerprint method on its pointer only, which an
// Effect of ptrFingerprinted values would never call.
type ptrFingerprinted struct{}

func (*ptrFingerprinted) Fingerprint() ([]byte, error) { return nil, nil }

// TestLostCommitReplyAmbiguous: when COMMIT's reply is lost (the server
// committed; the connection dropped before the client read the answer),
// Apply returns ErrAmbiguous, and the retry with the same key finds the
// key and replays: one effect.
func TestLostCommitReplyAmbiguous(t *testing.T) {
	db, dsn := newDB(t)
	ctx := testCtx(t)
	f := new(conformance.Faults)
	faulted, err := faultedDB(dsn, f)
	if err != nil {
		t.Fatal(err)
	}
	defer faulted.Close()
	faulted.SetMaxOpenConns(1) // one warm connection: every Apply makes the same round trips
	eff, err := mysql.New(faulted, "s", writeLedger)
	if err != nil {
		t.Fatal(err)
	}
	apply := func(id string) (effects.Result, error) {
		return eff.Apply(ctx, effects.MustKey(id), payment{EventID: id, Amount: 1})
	}
	if _, err := apply("warm-up"); err != nil {
		t.Fatal(err)
	}
	before := f.RoundTrips()
	if _, err := apply("measure"); err != nil {
		t.Fatal(err)
	}
	trips := f.RoundTrips() - before // the last one is COMMIT
	f.Arm(f.RoundTrips()+trips, conformance.DropReply, nil)
	_, err = apply("lost")
	if !errors.Is(err, effects.ErrAmbiguous) || !f.Fired() {
		t.Fatalf("Apply whose COMMIT reply was lost: %v (fault fired: %t), want ErrAmbiguous", err, f.Fired())
	}
	if n := ledgerRows(t, db, "lost"); n != 1 {
		t.Errorf("after the lost reply: %d ledger rows, want 1 (the server committed)", n)
	}
	res, err := apply("lost")
	if err != nil || res.Status != effects.Replayed {
		t.Errorf("retry with the same key: %+v, %v; want replayed", res, err)
	}
	if n := ledgerRows(t, db, "lost"); n != 1 {
		t.Errorf("after the retry: %d ledger rows, want 1", n)
	}
}
