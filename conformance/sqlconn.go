package conformance

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"reflect"
	"sync"
)

// SQLConnector wraps base, a database/sql driver connector, so that every driver
// call the adapter's *sql.DB makes is one round trip of f, faulted by the
// suite as a network round trip would be ([Faults.RoundTrip]): opening a
// connection, BEGIN, each Prepare, Exec and Query (of a connection or of a
// prepared statement), Ping, COMMIT and ROLLBACK. Use it for a backend
// behind a database/sql driver that has no network of its own to hook (an
// embedded database such as SQLite), or whose dialer the harness cannot
// reach:
//
//	db := sql.OpenDB(f.SQLConnector(base)) // base: the driver's Connector
//
// A fault leaves the connection as a lost network connection would: a
// lost reply (DropReply), a cut request (CutRequest) or a cancelled
// attempt (CancelAfterSend) breaks it, and so does a slow reply
// (SlowReply) the caller stopped waiting for. The failing call returns
// [ErrInjected] (or the context's error), never driver.ErrBadConn,
// because database/sql would silently repeat a call that returned
// ErrBadConn, and this one may have been applied; what the call produced
// (the rows of a lost query's reply, a prepared statement) is closed
// first. Then the connection is ended in the order database/sql itself
// ends one, which every driver tolerates: the rows still open on it are
// closed, then its prepared statements, then the driver connection
// (which ends its open transaction, as a server rolls back the
// transaction of a connection that dropped). From then on the
// connection's calls report driver.ErrBadConn without reaching the
// driver (nothing is sent, so database/sql may retry them on another
// connection), its rows report the fault from Next, and closing its rows,
// statements or itself again does nothing, so database/sql discards it.
// [Faults.Sever] ends every connection so, each once the driver call it
// is in (if any) returns, and refuses new ones: the process crashed.
//
// A connection's Exec or Query that the base driver answers with
// driver.ErrSkip (go-sql-driver/mysql does for a call with arguments,
// and database/sql then prepares the statement) reached no server, so it
// is not a round trip either: it is not counted, and a fault armed on it
// moves to the next round trip. The same query (with arguments or
// without, as then) on a connection of the same driver is afterwards
// answered ErrSkip without calling the driver, so that a sweep's faulted
// runs, which follow its clean count, never arm a fault on it.
//
// Reading a query's rows and closing rows, statements or connections are
// not round trips: the suite never faults them, and they reach the driver
// as they are (an embedded database may do the query's work as its rows
// are read). The base connector's optional interfaces (ExecerContext,
// QueryerContext, ConnBeginTx, ConnPrepareContext, Pinger,
// SessionResetter, Validator, NamedValueChecker, and the rows' column
// types and further result sets) are used when it has them, else
// database/sql's fall-backs apply.
func (f *Faults) SQLConnector(base driver.Connector) driver.Connector {
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
	}, nil)
	if err != nil {
		if conn != nil {
			conn.Close() // opened, and lost on the way back
		}
		return nil, err
	}
	sc := &sqlConn{base: conn, f: c.f, rows: map[*sqlRows]struct{}{}, stmts: map[*sqlStmt]struct{}{}}
	if !c.f.register(sc) {
		conn.Close()
		return nil, ErrSevered
	}
	return sc, nil
}

// Driver returns the base connector's driver.
func (c *sqlConnector) Driver() driver.Driver { return c.base.Driver() }

// sqlConn is one driver connection whose calls are round trips of f. It
// tracks the rows and statements open on it, to close them before the
// driver connection when it ends.
type sqlConn struct {
	base driver.Conn
	f    *Faults

	mu      sync.Mutex
	busy    int   // uses of the driver in progress (calls, rows read, closes)
	broken  error // why the connection is unusable (ErrInjected, ErrSevered)
	ended   bool  // the driver connection (and all on it) was closed
	endSoon bool  // end it once the uses in progress return
	rows    map[*sqlRows]struct{}
	stmts   map[*sqlStmt]struct{}
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

// enter starts a use of the driver: it reports false (and starts none)
// once the connection is broken or ended.
func (c *sqlConn) enter() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil || c.ended {
		return false
	}
	c.busy++
	return true
}

// leave ends a use of the driver, and ends the connection if it broke
// meanwhile.
func (c *sqlConn) leave() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.busy--
	if c.endSoon && c.busy == 0 {
		_ = c.endLocked()
	}
}

// call runs fn as one round trip on the connection. settle (if not nil)
// then gets fn's outcome while the connection is still open: on an error
// it closes what fn produced (the rows of a lost reply), on success it
// tracks it. A fault that fired then breaks the connection.
func (c *sqlConn) call(ctx context.Context, fn func() error, settle func(error)) error {
	return c.callSkippable(ctx, fn, settle, nil)
}

// callSkippable is call for a base call that may answer driver.ErrSkip
// (skip, if not nil, then learns it): such an answer reached nothing, so
// it is no round trip ([Faults.roundTrip]).
func (c *sqlConn) callSkippable(ctx context.Context, fn func() error, settle func(error), skip func()) error {
	if !c.enter() {
		return driver.ErrBadConn // nothing is sent on a broken connection
	}
	var skipped func(error) bool
	if skip != nil {
		skipped = func(err error) bool {
			if errors.Is(err, driver.ErrSkip) {
				skip()
				return true
			}
			return false
		}
	}
	kind, err := c.f.roundTrip(ctx, fn, skipped)
	if settle != nil {
		settle(err)
	}
	c.mu.Lock()
	switch {
	case kind != NoFault:
		c.breakLocked(ErrInjected)
	case errors.Is(err, ErrSevered):
		c.breakLocked(ErrSevered)
	}
	c.mu.Unlock()
	c.leave()
	return err
}

// breakLocked marks the connection unusable and ends it, at once or, if
// the driver is in use, once the use returns. c.mu must be held.
func (c *sqlConn) breakLocked(why error) {
	if c.broken == nil {
		c.broken = why
	}
	c.endSoon = true
	if c.busy == 0 {
		_ = c.endLocked()
	}
}

// endLocked closes the rows open on the connection, then its statements,
// then the driver connection, once, and returns the driver connection's
// Close error. c.mu must be held.
func (c *sqlConn) endLocked() error {
	if c.ended {
		return nil
	}
	c.ended, c.endSoon = true, false
	for r := range c.rows {
		_ = r.base.Close()
	}
	for s := range c.stmts {
		_ = s.base.Close()
	}
	c.rows, c.stmts = nil, nil
	return c.base.Close()
}

// sever breaks the connection: the process that held it crashed.
func (c *sqlConn) sever() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.broken = ErrSevered
	c.breakLocked(ErrSevered)
}

// Close ends the connection (not a round trip).
func (c *sqlConn) Close() error {
	c.f.untrack(c)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return nil
	}
	if c.busy > 0 {
		c.endSoon = true
		return nil
	}
	return c.endLocked()
}

// fault is the error a use of a broken or ended connection reports.
func (c *sqlConn) fault() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return c.broken
	}
	return driver.ErrBadConn
}

// Prepare implements driver.Conn.
func (c *sqlConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext prepares query as one round trip.
func (c *sqlConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	var (
		st driver.Stmt
		ss *sqlStmt
	)
	err := c.call(ctx, func() error {
		var err error
		if pc, ok := c.base.(driver.ConnPrepareContext); ok {
			st, err = pc.PrepareContext(ctx, query)
		} else {
			st, err = c.base.Prepare(query)
		}
		return err
	}, func(err error) {
		switch {
		case st == nil:
		case err != nil:
			st.Close() // prepared, and lost on the way back
		default:
			ss = &sqlStmt{base: st, conn: c, numInput: st.NumInput()}
			c.mu.Lock()
			c.stmts[ss] = struct{}{}
			c.mu.Unlock()
		}
	})
	if err != nil {
		return nil, err
	}
	return ss, nil
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
	}, nil)
	if err != nil {
		return nil, err // a lost BEGIN: the connection is ended, which ends the transaction
	}
	return &sqlTx{base: tx, conn: c}, nil
}

// ExecContext runs query as one round trip, or returns driver.ErrSkip when
// the base connection has no ExecerContext or answers ErrSkip (database/sql
// then prepares). A base ErrSkip reached no server, so it is no round
// trip: it is neither counted nor faulted, and a call of the same query
// (with or without arguments, as this one) on a connection of the same
// driver then returns ErrSkip without calling the base connection, so that
// no fault, CutRequest included, lands on it.
func (c *sqlConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	ec, ok := c.base.(driver.ExecerContext)
	sk := c.skipKey("exec", query, args)
	if !ok || knownSkip(sk) {
		return nil, driver.ErrSkip
	}
	var res driver.Result
	err := c.callSkippable(ctx, func() error {
		var err error
		res, err = ec.ExecContext(ctx, query, args)
		return err
	}, nil, func() { learnSkip(sk) })
	if err != nil {
		return nil, err
	}
	return res, nil
}

// QueryContext runs query as one round trip, or returns driver.ErrSkip
// when the base connection has no QueryerContext or answers ErrSkip, which
// is no round trip (as for [sqlConn.ExecContext]).
func (c *sqlConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	qc, ok := c.base.(driver.QueryerContext)
	sk := c.skipKey("query", query, args)
	if !ok || knownSkip(sk) {
		return nil, driver.ErrSkip
	}
	var (
		rows driver.Rows
		sr   *sqlRows
	)
	err := c.callSkippable(ctx, func() error {
		var err error
		rows, err = qc.QueryContext(ctx, query, args)
		return err
	}, func(err error) {
		if !errors.Is(err, driver.ErrSkip) {
			sr = c.settleRows(rows, err)
		}
	}, func() { learnSkip(sk) })
	if err != nil {
		return nil, err
	}
	return sr, nil
}

// skipCall names a connection call by the base connection's type, the
// method, the query and whether it has arguments: what decides whether a
// driver answers driver.ErrSkip (go-sql-driver/mysql does for a call with
// arguments unless it interpolates them).
type skipCall struct {
	conn   reflect.Type
	method string
	query  string
	args   bool
}

// skips holds the calls a base connection answered driver.ErrSkip, for
// every SQLConnector of the process: a sweep's faulted instances meet them
// after its clean count learned them.
var skips sync.Map

func (c *sqlConn) skipKey(method, query string, args []driver.NamedValue) skipCall {
	return skipCall{conn: reflect.TypeOf(c.base), method: method, query: query, args: len(args) > 0}
}

func knownSkip(k skipCall) bool { _, ok := skips.Load(k); return ok }

func learnSkip(k skipCall) { skips.Store(k, struct{}{}) }

// settleRows settles the rows a query's round trip returned, inside its
// use of the connection: the rows of a failed one (a lost reply) are
// closed, before the connection can end; the others are tracked, so that
// the connection closes them before itself if it ends first.
func (c *sqlConn) settleRows(rows driver.Rows, err error) *sqlRows {
	switch {
	case rows == nil:
		return nil
	case err != nil:
		rows.Close()
		return nil
	}
	r := &sqlRows{base: rows, conn: c, cols: rows.Columns()}
	c.mu.Lock()
	c.rows[r] = struct{}{}
	c.mu.Unlock()
	return r
}

// closeChild closes one of the connection's rows or statements, which
// remove takes off its list (reporting whether it was there), as a use of
// the driver. On a connection that ended it does nothing: the end closed
// it; on one that broke and ends once a use in progress returns, that end
// closes it.
func (c *sqlConn) closeChild(remove func() bool, close func() error) error {
	if !c.enter() {
		return nil
	}
	defer c.leave()
	c.mu.Lock()
	open := remove()
	c.mu.Unlock()
	if !open {
		return nil
	}
	return close()
}

// use runs fn, a use of the driver that is not a round trip, unless the
// connection is broken or ended: then it returns the connection's fault.
func (c *sqlConn) use(fn func() error) error {
	if !c.enter() {
		return c.fault()
	}
	defer c.leave()
	return fn()
}

// Ping pings the base connection, if it can, as one round trip.
func (c *sqlConn) Ping(ctx context.Context) error {
	p, ok := c.base.(driver.Pinger)
	if !ok {
		return c.ResetSession(ctx)
	}
	return c.call(ctx, func() error { return p.Ping(ctx) }, nil)
}

// ResetSession reports a broken connection as driver.ErrBadConn.
func (c *sqlConn) ResetSession(ctx context.Context) error {
	if !c.enter() {
		return driver.ErrBadConn
	}
	defer c.leave()
	if r, ok := c.base.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

// IsValid reports false for a broken connection.
func (c *sqlConn) IsValid() bool {
	if !c.enter() {
		return false
	}
	defer c.leave()
	if v, ok := c.base.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// CheckNamedValue defers to the base connection, or to database/sql's
// default conversion.
func (c *sqlConn) CheckNamedValue(nv *driver.NamedValue) error {
	ch, ok := c.base.(driver.NamedValueChecker)
	if !ok || !c.enter() {
		return driver.ErrSkip // on a broken connection the call that follows fails
	}
	defer c.leave()
	return ch.CheckNamedValue(nv)
}

// sqlTx is a transaction whose COMMIT and ROLLBACK are round trips.
type sqlTx struct {
	base driver.Tx
	conn *sqlConn
}

// Commit commits as one round trip. A lost reply leaves the transaction
// committed and the caller not knowing it.
func (t *sqlTx) Commit() error {
	return t.conn.call(context.Background(), t.base.Commit, nil)
}

// Rollback rolls back as one round trip.
func (t *sqlTx) Rollback() error {
	return t.conn.call(context.Background(), t.base.Rollback, nil)
}

// sqlStmt is a prepared statement whose executions are round trips.
type sqlStmt struct {
	base     driver.Stmt
	conn     *sqlConn
	numInput int
}

var (
	_ driver.StmtExecContext   = (*sqlStmt)(nil)
	_ driver.StmtQueryContext  = (*sqlStmt)(nil)
	_ driver.NamedValueChecker = (*sqlStmt)(nil)
)

// Close closes the statement (not a round trip), unless its connection
// ended, which closed it.
func (s *sqlStmt) Close() error {
	c := s.conn
	return c.closeChild(func() bool {
		_, open := c.stmts[s]
		delete(c.stmts, s)
		return open
	}, s.base.Close)
}

// NumInput returns the base statement's, read when it was prepared.
func (s *sqlStmt) NumInput() int { return s.numInput }

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
	}, nil)
	if err != nil {
		return nil, err
	}
	return res, nil
}

// QueryContext queries with the statement as one round trip.
func (s *sqlStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	var (
		rows driver.Rows
		sr   *sqlRows
	)
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
	}, func(err error) { sr = s.conn.settleRows(rows, err) })
	if err != nil {
		return nil, err
	}
	return sr, nil
}

// CheckNamedValue defers to the base statement, then to its connection.
func (s *sqlStmt) CheckNamedValue(nv *driver.NamedValue) error {
	ch, ok := s.base.(driver.NamedValueChecker)
	if !ok {
		return s.conn.CheckNamedValue(nv)
	}
	if !s.conn.enter() {
		return driver.ErrSkip // on a broken connection the call that follows fails
	}
	defer s.conn.leave()
	return ch.CheckNamedValue(nv)
}

// sqlRows are the rows of a query, read from the driver as they are
// (reading them is not a round trip); once their connection ended, Next
// reports its fault.
type sqlRows struct {
	base driver.Rows
	conn *sqlConn
	cols []string
}

var (
	_ driver.RowsNextResultSet              = (*sqlRows)(nil)
	_ driver.RowsColumnTypeScanType         = (*sqlRows)(nil)
	_ driver.RowsColumnTypeDatabaseTypeName = (*sqlRows)(nil)
	_ driver.RowsColumnTypeLength           = (*sqlRows)(nil)
	_ driver.RowsColumnTypeNullable         = (*sqlRows)(nil)
	_ driver.RowsColumnTypePrecisionScale   = (*sqlRows)(nil)
)

// Columns returns the base rows' columns, read when the query returned.
func (r *sqlRows) Columns() []string { return r.cols }

// Next reads the next row from the driver.
func (r *sqlRows) Next(dest []driver.Value) error {
	return r.conn.use(func() error { return r.base.Next(dest) })
}

// Close closes the rows, unless their connection ended, which closed
// them.
func (r *sqlRows) Close() error {
	c := r.conn
	return c.closeChild(func() bool {
		_, open := c.rows[r]
		delete(c.rows, r)
		return open
	}, r.base.Close)
}

// HasNextResultSet implements driver.RowsNextResultSet.
func (r *sqlRows) HasNextResultSet() bool {
	nrs, ok := r.base.(driver.RowsNextResultSet)
	if !ok {
		return false
	}
	has := false
	_ = r.conn.use(func() error { has = nrs.HasNextResultSet(); return nil })
	return has
}

// NextResultSet implements driver.RowsNextResultSet.
func (r *sqlRows) NextResultSet() error {
	nrs, ok := r.base.(driver.RowsNextResultSet)
	if !ok {
		return io.EOF
	}
	return r.conn.use(func() error {
		err := nrs.NextResultSet()
		if err == nil {
			r.cols = r.base.Columns()
		}
		return err
	})
}

// ColumnTypeScanType implements driver.RowsColumnTypeScanType.
func (r *sqlRows) ColumnTypeScanType(i int) reflect.Type {
	t := reflect.TypeFor[any]()
	if ct, ok := r.base.(driver.RowsColumnTypeScanType); ok {
		_ = r.conn.use(func() error { t = ct.ColumnTypeScanType(i); return nil })
	}
	return t
}

// ColumnTypeDatabaseTypeName implements driver.RowsColumnTypeDatabaseTypeName.
func (r *sqlRows) ColumnTypeDatabaseTypeName(i int) string {
	var name string
	if ct, ok := r.base.(driver.RowsColumnTypeDatabaseTypeName); ok {
		_ = r.conn.use(func() error { name = ct.ColumnTypeDatabaseTypeName(i); return nil })
	}
	return name
}

// ColumnTypeLength implements driver.RowsColumnTypeLength.
func (r *sqlRows) ColumnTypeLength(i int) (length int64, ok bool) {
	if ct, is := r.base.(driver.RowsColumnTypeLength); is {
		_ = r.conn.use(func() error { length, ok = ct.ColumnTypeLength(i); return nil })
	}
	return length, ok
}

// ColumnTypeNullable implements driver.RowsColumnTypeNullable.
func (r *sqlRows) ColumnTypeNullable(i int) (nullable, ok bool) {
	if ct, is := r.base.(driver.RowsColumnTypeNullable); is {
		_ = r.conn.use(func() error { nullable, ok = ct.ColumnTypeNullable(i); return nil })
	}
	return nullable, ok
}

// ColumnTypePrecisionScale implements driver.RowsColumnTypePrecisionScale.
func (r *sqlRows) ColumnTypePrecisionScale(i int) (precision, scale int64, ok bool) {
	if ct, is := r.base.(driver.RowsColumnTypePrecisionScale); is {
		_ = r.conn.use(func() error { precision, scale, ok = ct.ColumnTypePrecisionScale(i); return nil })
	}
	return precision, scale, ok
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
