package conformance_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"effectively.dev/conformance"
)

// strictLog records what a strictDriver saw done out of the order
// database/sql's own contract keeps: a statement, rows or transaction
// used or closed after its connection was closed, anything closed twice,
// a connection closed with rows or statements still open on it. An
// embedded driver (modernc.org/sqlite) panics on the first of these.
type strictLog struct {
	mu         sync.Mutex
	violations []string
	queries    int // queries and execs the driver ran
	prepares   int // statements the driver prepared
	open       int // connections open
	// skipArgs makes a connection's Exec and Query with arguments answer
	// driver.ErrSkip, as go-sql-driver/mysql does unless it interpolates
	// them: database/sql then prepares.
	skipArgs bool
}

func (l *strictLog) violate(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.violations = append(l.violations, fmt.Sprintf(format, args...))
}

func (l *strictLog) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, v := range l.violations {
		t.Errorf("driver misused: %s", v)
	}
}

// strictDriver is a database/sql driver whose connections answer every
// query with two rows of one column, and check the order they are used
// and closed in (strictLog).
type strictDriver struct{ log *strictLog }

func (d strictDriver) Connect(context.Context) (driver.Conn, error) {
	d.log.mu.Lock()
	d.log.open++
	d.log.mu.Unlock()
	return &strictConn{log: d.log}, nil
}

func (d strictDriver) Driver() driver.Driver { return nil }

type strictConn struct {
	log    *strictLog
	mu     sync.Mutex
	closed bool
	inTx   bool
	kids   int // rows and statements open
}

// usable records a use after Close.
func (c *strictConn) usable(what string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.log.violate("%s after its connection was closed", what)
		return false
	}
	return true
}

func (c *strictConn) kid(delta int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kids += delta
}

func (c *strictConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.log.violate("connection closed twice")
		return nil
	}
	if c.kids != 0 {
		c.log.violate("connection closed with %d rows or statements open", c.kids)
	}
	c.closed = true
	c.log.mu.Lock()
	c.log.open--
	c.log.mu.Unlock()
	return nil
}

func (c *strictConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *strictConn) PrepareContext(context.Context, string) (driver.Stmt, error) {
	if !c.usable("Prepare") {
		return nil, driver.ErrBadConn
	}
	c.kid(1)
	c.log.mu.Lock()
	c.log.prepares++
	c.log.mu.Unlock()
	return &strictStmt{c: c}, nil
}

func (c *strictConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *strictConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	if !c.usable("BEGIN") {
		return nil, driver.ErrBadConn
	}
	c.mu.Lock()
	c.inTx = true
	c.mu.Unlock()
	return &strictTx{c: c}, nil
}

func (c *strictConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.log.skipArgs && len(args) > 0 {
		return nil, driver.ErrSkip
	}
	return c.query()
}

func (c *strictConn) query() (driver.Rows, error) {
	if !c.usable("Query") {
		return nil, driver.ErrBadConn
	}
	c.ran()
	c.kid(1)
	return &strictRows{c: c, left: 2}, nil
}

func (c *strictConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.log.skipArgs && len(args) > 0 {
		return nil, driver.ErrSkip
	}
	return c.exec()
}

func (c *strictConn) exec() (driver.Result, error) {
	if !c.usable("Exec") {
		return nil, driver.ErrBadConn
	}
	c.ran()
	return driver.RowsAffected(1), nil
}

func (c *strictConn) ran() {
	c.log.mu.Lock()
	c.log.queries++
	c.log.mu.Unlock()
}

type strictTx struct{ c *strictConn }

func (t *strictTx) end(what string) error {
	if !t.c.usable(what) {
		return driver.ErrBadConn
	}
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if !t.c.inTx {
		t.c.log.violate("%s with no transaction open", what)
	}
	t.c.inTx = false
	return nil
}

func (t *strictTx) Commit() error   { return t.end("COMMIT") }
func (t *strictTx) Rollback() error { return t.end("ROLLBACK") }

type strictStmt struct {
	c      *strictConn
	closed bool
}

func (s *strictStmt) Close() error {
	if !s.c.usable("statement Close") {
		return nil
	}
	if s.closed {
		s.c.log.violate("statement closed twice")
		return nil
	}
	s.closed = true
	s.c.kid(-1)
	return nil
}

func (s *strictStmt) NumInput() int { return -1 }

func (s *strictStmt) Exec([]driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), nil)
}

func (s *strictStmt) Query([]driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), nil)
}

func (s *strictStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if s.closed {
		s.c.log.violate("statement used after Close")
	}
	return s.c.exec()
}

func (s *strictStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if s.closed {
		s.c.log.violate("statement used after Close")
	}
	return s.c.query()
}

type strictRows struct {
	c      *strictConn
	left   int
	closed bool
}

func (r *strictRows) Columns() []string { return []string{"n"} }

func (r *strictRows) Close() error {
	if !r.c.usable("rows Close") {
		return nil
	}
	if r.closed {
		r.c.log.violate("rows closed twice")
		return nil
	}
	r.closed = true
	r.c.kid(-1)
	return nil
}

func (r *strictRows) Next(dest []driver.Value) error {
	if !r.c.usable("rows Next") {
		return driver.ErrBadConn
	}
	if r.closed {
		r.c.log.violate("rows read after Close")
	}
	if r.left == 0 {
		return io.EOF
	}
	r.left--
	dest[0] = int64(r.left)
	return nil
}

// TestSQLConnectorEndsFaultedRoundTrips: whatever round trip a fault
// lands on (a query, a statement's execution in a transaction with a
// prepared statement open, a Prepare, BEGIN, COMMIT, a query on a pinned
// sql.Conn), and whatever the fault, SQLConnector returns an error that
// is not driver.ErrBadConn, closes what the lost call produced and then
// the connection, children first and each once, and the *sql.DB goes on
// working on a new connection.
func TestSQLConnectorEndsFaultedRoundTrips(t *testing.T) {
	const hold = 300 * time.Millisecond
	calls := []struct {
		name string
		// run arms the fault (arm) just before the call it faults, and
		// cleans up as an adapter would.
		run func(ctx context.Context, db *sql.DB, arm func()) error
		// noContext: the call takes no context (database/sql's COMMIT), so
		// its caller cannot give up on a slow reply, which comes late.
		noContext bool
	}{
		{"query", func(ctx context.Context, db *sql.DB, arm func()) error {
			arm()
			rows, err := db.QueryContext(ctx, "SELECT n")
			if err == nil {
				rows.Close()
			}
			return err
		}, false},
		{"query on a pinned sql.Conn", func(ctx context.Context, db *sql.DB, arm func()) error {
			conn, err := db.Conn(ctx)
			if err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			defer conn.Close()
			arm()
			rows, err := conn.QueryContext(ctx, "SELECT n")
			if err == nil {
				rows.Close()
				return nil
			}
			// The pinned connection is broken: the next call says so at
			// once, and sends nothing.
			if _, again := conn.QueryContext(ctx, "SELECT n"); !errors.Is(again, driver.ErrBadConn) {
				return fmt.Errorf("query again on the pinned connection: %v, want driver.ErrBadConn", again)
			}
			return err
		}, false},
		{"exec in a transaction with a prepared statement open", func(ctx context.Context, db *sql.DB, arm func()) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			defer tx.Rollback()
			st, err := tx.PrepareContext(ctx, "INSERT")
			if err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			defer st.Close()
			rows, err := tx.QueryContext(ctx, "SELECT n") // left open across the fault
			if err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			defer rows.Close()
			arm()
			if _, err := st.ExecContext(ctx); err != nil {
				if rows.Next() {
					return errors.New("rows of the broken connection still read")
				}
				return err
			}
			return tx.Commit()
		}, false},
		{"prepare", func(ctx context.Context, db *sql.DB, arm func()) error {
			arm()
			st, err := db.PrepareContext(ctx, "SELECT n")
			if err == nil {
				st.Close()
			}
			return err
		}, false},
		{"begin", func(ctx context.Context, db *sql.DB, arm func()) error {
			arm()
			tx, err := db.BeginTx(ctx, nil)
			if err == nil {
				tx.Rollback()
			}
			return err
		}, false},
		{"commit", func(ctx context.Context, db *sql.DB, arm func()) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, "INSERT"); err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			arm()
			return tx.Commit()
		}, true},
	}
	kinds := []conformance.FaultKind{conformance.DropReply, conformance.CutRequest, conformance.CancelAfterSend, conformance.SlowReply}
	for _, c := range calls {
		for _, kind := range kinds {
			t.Run(c.name+"/"+kind.String(), func(t *testing.T) {
				log := &strictLog{}
				f := new(conformance.Faults)
				f.SetSlowReply(hold)
				db := sql.OpenDB(f.SQLConnector(strictDriver{log}))
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := db.PingContext(ctx); err != nil { // a connection in the pool: the fault lands on the call
					t.Fatal(err)
				}
				cctx, ccancel := context.WithCancel(ctx)
				defer ccancel()
				arm := func() {
					n := f.RoundTrips() + 1
					switch kind {
					case conformance.CancelAfterSend:
						f.Arm(n, kind, ccancel)
					case conformance.SlowReply: // the caller gives up on the held reply
						f.Arm(n, kind, nil)
						time.AfterFunc(50*time.Millisecond, ccancel)
					default:
						f.Arm(n, kind, nil)
					}
				}
				start := time.Now()
				err := c.run(cctx, db, arm)
				switch {
				case !f.Fired():
					t.Fatalf("the fault did not fire (%v)", err)
				case kind == conformance.SlowReply && c.noContext:
					if err != nil || time.Since(start) < hold {
						t.Errorf("a slow reply to a call with no context: %v after %v, want the reply, no sooner than %v", err, time.Since(start), hold)
					}
				case err == nil:
					t.Fatal("the faulted call returned no error")
				case errors.Is(err, driver.ErrBadConn):
					t.Errorf("the faulted call returned %v: database/sql would repeat it", err)
				}
				if err := db.PingContext(ctx); err != nil {
					t.Errorf("a call after the fault: %v, want it to work on a new connection", err)
				}
				var n int
				if err := db.QueryRowContext(ctx, "SELECT n").Scan(&n); err != nil {
					t.Errorf("a query after the fault: %v", err)
				}
				if err := db.Close(); err != nil {
					t.Errorf("db.Close: %v", err)
				}
				log.check(t)
				if log.open != 0 {
					t.Errorf("%d connections left open after db.Close", log.open)
				}
			})
		}
	}
}

// TestSQLConnectorSeverWithRowsOpen: severing the Faults (a crashed
// process) while a query's rows are open ends the connection, rows
// first: reading them reports ErrSevered, closing them touches nothing,
// and new connections are refused.
func TestSQLConnectorSeverWithRowsOpen(t *testing.T) {
	log := &strictLog{}
	f := new(conformance.Faults)
	db := sql.OpenDB(f.SQLConnector(strictDriver{log}))
	defer db.Close()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tx.QueryContext(ctx, "SELECT n")
	if err != nil {
		t.Fatal(err)
	}
	if !rows.Next() {
		t.Fatalf("first row: %v", rows.Err())
	}
	f.Sever()
	if rows.Next() {
		t.Error("a row read after Sever")
	}
	if err := rows.Err(); !errors.Is(err, conformance.ErrSevered) {
		t.Errorf("rows.Err after Sever: %v, want ErrSevered", err)
	}
	rows.Close()
	tx.Rollback()
	if err := db.PingContext(ctx); !errors.Is(err, conformance.ErrSevered) {
		t.Errorf("Ping after Sever: %v, want ErrSevered", err)
	}
	log.check(t)
	if log.open != 0 {
		t.Errorf("%d connections open after Sever", log.open)
	}
}

// TestSQLConnectorErrSkipIsNoRoundTrip: a driver whose Exec and Query
// with arguments answer driver.ErrSkip (database/sql then prepares the
// statement and executes it) reaches the server twice per call, and
// SQLConnector counts two round trips, not three: the ErrSkip is neither
// counted nor faulted, the first time a query is met and after. A fault
// armed on the round trip after connecting lands on the Prepare, one on
// the next round trip on the statement's execution.
func TestSQLConnectorErrSkipIsNoRoundTrip(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func(db *sql.DB, query string) error
	}{
		{"exec", func(db *sql.DB, query string) error {
			_, err := db.ExecContext(ctx, query, 1)
			return err
		}},
		{"query", func(db *sql.DB, query string) error {
			rows, err := db.QueryContext(ctx, query, 1)
			if err == nil {
				rows.Close()
			}
			return err
		}},
	} {
		query := "SKIP " + tc.name + " " + t.Name()
		for round := range 2 { // the first meeting of the query, and one after
			log := &strictLog{skipArgs: true}
			f := new(conformance.Faults)
			db := sql.OpenDB(f.SQLConnector(strictDriver{log}))
			if err := tc.call(db, query); err != nil {
				t.Fatalf("%s (round %d): %v", tc.name, round, err)
			}
			// Connect, Prepare, the statement's Exec or Query.
			if n := f.RoundTrips(); n != 3 || log.prepares != 1 || log.queries != 1 {
				t.Errorf("%s (round %d): %d round trips, %d prepares, %d executions; want 3, 1, 1", tc.name, round, n, log.prepares, log.queries)
			}
			db.Close()

			log = &strictLog{skipArgs: true}
			f = new(conformance.Faults)
			f.Arm(2, conformance.DropReply, nil)
			db = sql.OpenDB(f.SQLConnector(strictDriver{log}))
			err := tc.call(db, query)
			if !f.Fired() || !errors.Is(err, conformance.ErrInjected) || log.prepares != 1 || log.queries != 0 {
				t.Errorf("%s (round %d): lost reply of round trip 2: fired %v, %v, %d prepares, %d executions; want it fired on the Prepare (ErrInjected, 1, 0)",
					tc.name, round, f.Fired(), err, log.prepares, log.queries)
			}
			db.Close()
			log.check(t)

			// A cut request on round trip 3 lands on the statement's
			// execution: the Prepare ran, the execution never did.
			log = &strictLog{skipArgs: true}
			f = new(conformance.Faults)
			f.Arm(3, conformance.CutRequest, nil)
			db = sql.OpenDB(f.SQLConnector(strictDriver{log}))
			err = tc.call(db, query)
			if !f.Fired() || !errors.Is(err, conformance.ErrInjected) || log.prepares != 1 || log.queries != 0 {
				t.Errorf("%s (round %d): cut request on round trip 3: fired %v, %v, %d prepares, %d executions; want it fired on the execution (ErrInjected, 1, 0)",
					tc.name, round, f.Fired(), err, log.prepares, log.queries)
			}
			db.Close()
			log.check(t)
		}
	}
}
