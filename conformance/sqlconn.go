package conformance

import (
	"context"
	"database/sql/driver"
	"errors"
	"sync"
)

// SQLConnector wraps a database/sql driver connector so that every driver
// call the adapter's *sql.DB makes is one round trip of f, faulted by the
// suite as a network round trip would be ([Faults.RoundTrip]): opening a
// connection, BEGIN, each Prepare, Exec and Query (of a connection or of a
// prepared statement), Ping, COMMIT and ROLLBACK. Use it for a backend
// behind a database/sql driver that has no network of its own to hook (an
// embedded database such as SQLite), or whose dialer the harness cannot
// reach:
//
//	db := sql.OpenDB(conformance.SQLConnector(base, f)) // base: the driver's Connector
//
// A fault leaves the connection as a lost network connection would: a
// lost reply (DropReply), a cut request (CutRequest) or a cancelled
// attempt (CancelAfterSend) breaks it, and so does a slow reply
// (SlowReply) the caller stopped waiting for. A broken connection is
// closed at once (its open transaction rolls back, as a server rolls back
// the transaction of a connection that dropped) and reports
// driver.ErrBadConn to every later call, so database/sql discards it;
// the failing call itself returns [ErrInjected] (or the context's error),
// never driver.ErrBadConn, because database/sql would silently repeat a
// call that returned ErrBadConn, and this one may have been applied.
// [Faults.Sever] closes every connection as it finishes its current call
// and refuses new ones: the process crashed.
//
// Rows are the driver's own: reading them is part of the Query's round
// trip. Closing a statement or a connection is not a round trip. The base
// connector's optional interfaces (ExecerContext, QueryerContext,
// ConnBeginTx, ConnPrepareContext, Pinger, SessionResetter, Validator,
// NamedValueChecker) are used when it has them, else database/sql's
// fall-backs apply.
func SQLConnector(base driver.Connector, f *Faults) driver.Connector {
	return &sqlConnector{base: base, f: f}
}

type sqlConnector struct {
	base driver.Connector
	f    *Faults
}

// Connect opens a connection of the base connector as one round trip.
func (c *sqlConnector) Connect(ctx context.Context) (driver.Conn, error) {
	var conn driver.Conn
	_, err := c.f.roundTrip(ctx, func() error {
		var err error
		conn, err = c.base.Connect(ctx)
		return err
	})
	if err != nil {
		if conn != nil {
			conn.Close() // opened, and lost on the way back
		}
		return nil, err
	}
	sc := &sqlConn{base: conn, f: c.f}
	if !c.f.register(sc) {
		conn.Close()
		return nil, ErrSevered
	}
	return sc, nil
}

// Driver returns the base connector's driver.
func (c *sqlConnector) Driver() driver.Driver { return c.base.Driver() }

// sqlConn is one driver connection whose calls are round trips of f.
type sqlConn struct {
	base driver.Conn
	f    *Faults

	mu         sync.Mutex
	busy       int   // calls in flight
	broken     error // why the connection is unusable (ErrInjected, ErrSevered, a timeout)
	closed     bool  // base was closed
	closeAfter bool  // close base once the calls in flight return
}

var (
	_ driver.Conn               = (*sqlConn)(nil)
	_ driver.ConnBeginTx        = (*sqlConn)(nil)
	_ driver.ConnPrepareContext = (*sqlConn)(nil)
	_ driver.ExecerContext      = (*sqlConn)(nil)
	_ driver.QueryerContext     = (*sqlConn)(nil)
	_ driver.Pinger             = (*sqlConn)(nil)
	_ driver.SessionResetter    = (*sqlConn)(nil)
	_ driver.Validator          = (*sqlConn)(nil)
	_ driver.NamedValueChecker  = (*sqlConn)(nil)
)

// call runs fn as one round trip on the connection. A fault that fired
// breaks the connection.
func (c *sqlConn) call(ctx context.Context, fn func() error) error {
	c.mu.Lock()
	if c.broken != nil {
		c.mu.Unlock()
		return driver.ErrBadConn // nothing is sent on a broken connection
	}
	c.busy++
	c.mu.Unlock()
	kind, err := c.f.roundTrip(ctx, fn)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.busy--
	switch {
	case kind != NoFault:
		c.breakLocked(ErrInjected)
	case errors.Is(err, ErrSevered):
		c.breakLocked(ErrSevered)
	}
	if c.closeAfter && c.busy == 0 {
		c.closeBaseLocked()
	}
	return err
}

// breakLocked marks the connection unusable and closes it unless a call
// is in flight (then the last one closes it). c.mu must be held.
func (c *sqlConn) breakLocked(why error) {
	if c.broken == nil {
		c.broken = why
	}
	if c.busy > 0 {
		c.closeAfter = true
		return
	}
	c.closeBaseLocked()
}

func (c *sqlConn) closeBaseLocked() {
	if !c.closed {
		c.closed = true
		c.closeAfter = false
		_ = c.base.Close()
	}
}

// sever breaks the connection: the process that held it crashed.
func (c *sqlConn) sever() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.broken = ErrSevered
	c.breakLocked(ErrSevered)
}

// Close closes the connection (not a round trip).
func (c *sqlConn) Close() error {
	c.f.untrack(c)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if c.busy > 0 {
		c.closeAfter = true
		return nil
	}
	c.closed = true
	return c.base.Close()
}

// Prepare implements driver.Conn.
func (c *sqlConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext prepares query as one round trip.
func (c *sqlConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	var st driver.Stmt
	err := c.call(ctx, func() error {
		var err error
		if pc, ok := c.base.(driver.ConnPrepareContext); ok {
			st, err = pc.PrepareContext(ctx, query)
		} else {
			st, err = c.base.Prepare(query)
		}
		return err
	})
	if err != nil {
		if st != nil {
			st.Close()
		}
		return nil, err
	}
	return &sqlStmt{base: st, conn: c}, nil
}

// Begin implements driver.Conn.
func (c *sqlConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx begins a transaction as one round trip.
func (c *sqlConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	var tx driver.Tx
	err := c.call(ctx, func() error {
		var err error
		if bt, ok := c.base.(driver.ConnBeginTx); ok {
			tx, err = bt.BeginTx(ctx, opts)
		} else {
			//lint:ignore SA1019 the fall-back database/sql itself uses
			tx, err = c.base.Begin() //nolint:staticcheck
		}
		return err
	})
	if err != nil {
		return nil, err // a lost BEGIN: the connection is closed, which ends the transaction
	}
	return &sqlTx{base: tx, conn: c}, nil
}

// ExecContext runs query as one round trip, or returns driver.ErrSkip when
// the base connection has no ExecerContext (database/sql then prepares).
func (c *sqlConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	ec, ok := c.base.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	var res driver.Result
	err := c.call(ctx, func() error {
		var err error
		res, err = ec.ExecContext(ctx, query, args)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// QueryContext runs query as one round trip, or returns driver.ErrSkip
// when the base connection has no QueryerContext.
func (c *sqlConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	qc, ok := c.base.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	var rows driver.Rows
	err := c.call(ctx, func() error {
		var err error
		rows, err = qc.QueryContext(ctx, query, args)
		return err
	})
	if err != nil {
		if rows != nil {
			rows.Close()
		}
		return nil, err
	}
	return rows, nil
}

// Ping pings the base connection, if it can, as one round trip.
func (c *sqlConn) Ping(ctx context.Context) error {
	p, ok := c.base.(driver.Pinger)
	if !ok {
		return c.ResetSession(ctx)
	}
	return c.call(ctx, func() error { return p.Ping(ctx) })
}

// ResetSession reports a broken connection as driver.ErrBadConn.
func (c *sqlConn) ResetSession(ctx context.Context) error {
	c.mu.Lock()
	broken := c.broken != nil
	c.mu.Unlock()
	if broken {
		return driver.ErrBadConn
	}
	if r, ok := c.base.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

// IsValid reports false for a broken connection.
func (c *sqlConn) IsValid() bool {
	c.mu.Lock()
	broken := c.broken != nil
	c.mu.Unlock()
	if broken {
		return false
	}
	if v, ok := c.base.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// CheckNamedValue defers to the base connection, or to database/sql's
// default conversion.
func (c *sqlConn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := c.base.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// sqlTx is a transaction whose COMMIT and ROLLBACK are round trips.
type sqlTx struct {
	base driver.Tx
	conn *sqlConn
}

// Commit commits as one round trip. A lost reply leaves the transaction
// committed and the caller not knowing it.
func (t *sqlTx) Commit() error {
	return t.conn.call(context.Background(), t.base.Commit)
}

// Rollback rolls back as one round trip.
func (t *sqlTx) Rollback() error {
	return t.conn.call(context.Background(), t.base.Rollback)
}

// sqlStmt is a prepared statement whose executions are round trips.
type sqlStmt struct {
	base driver.Stmt
	conn *sqlConn
}

var (
	_ driver.StmtExecContext   = (*sqlStmt)(nil)
	_ driver.StmtQueryContext  = (*sqlStmt)(nil)
	_ driver.NamedValueChecker = (*sqlStmt)(nil)
)

// Close closes the statement (not a round trip).
func (s *sqlStmt) Close() error { return s.base.Close() }

// NumInput returns the base statement's.
func (s *sqlStmt) NumInput() int { return s.base.NumInput() }

// Exec implements driver.Stmt.
func (s *sqlStmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), named(args))
}

// Query implements driver.Stmt.
func (s *sqlStmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), named(args))
}

// ExecContext executes the statement as one round trip.
func (s *sqlStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	var res driver.Result
	err := s.conn.call(ctx, func() error {
		var err error
		if ec, ok := s.base.(driver.StmtExecContext); ok {
			res, err = ec.ExecContext(ctx, args)
			return err
		}
		vals, err := values(args)
		if err != nil {
			return err
		}
		//lint:ignore SA1019 the fall-back database/sql itself uses
		res, err = s.base.Exec(vals) //nolint:staticcheck
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// QueryContext queries with the statement as one round trip.
func (s *sqlStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	var rows driver.Rows
	err := s.conn.call(ctx, func() error {
		var err error
		if qc, ok := s.base.(driver.StmtQueryContext); ok {
			rows, err = qc.QueryContext(ctx, args)
			return err
		}
		vals, err := values(args)
		if err != nil {
			return err
		}
		//lint:ignore SA1019 the fall-back database/sql itself uses
		rows, err = s.base.Query(vals) //nolint:staticcheck
		return err
	})
	if err != nil {
		if rows != nil {
			rows.Close()
		}
		return nil, err
	}
	return rows, nil
}

// CheckNamedValue defers to the base statement, then to its connection.
func (s *sqlStmt) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := s.base.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return s.conn.CheckNamedValue(nv)
}

// named turns positional values into ordinal named values.
func named(args []driver.Value) []driver.NamedValue {
	out := make([]driver.NamedValue, len(args))
	for i, v := range args {
		out[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return out
}

// errNamedArgs is returned for named arguments to a statement whose driver
// takes positional ones only.
var errNamedArgs = errors.New("conformance: the driver does not support named arguments")

// values turns named values into positional ones, refusing names.
func values(args []driver.NamedValue) ([]driver.Value, error) {
	out := make([]driver.Value, len(args))
	for i, a := range args {
		if a.Name != "" {
			return nil, errNamedArgs
		}
		out[i] = a.Value
	}
	return out, nil
}
