package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
)

// errWriteEndedTx is the error of a WriteFunc's Commit or Rollback: Apply
// ends the transaction itself, with the key's row.
var errWriteEndedTx = errors.New("postgres: a write function must not commit or roll back the transaction: Apply ends it, with the key's row")

// errBatchBegins refuses a write's batch that begins a transaction, as
// pgx does inside one.
var errBatchBegins = errors.New("postgres: Batch.BeginTx cannot be used within a transaction")

// writeTx is the pgx.Tx a write gets when Apply has begun the
// transaction: pgx's own, but Commit and Rollback refuse
// (errWriteEndedTx).
type writeTx struct{ pgx.Tx }

func (writeTx) Commit(context.Context) error   { return errWriteEndedTx }
func (writeTx) Rollback(context.Context) error { return errWriteEndedTx }

// deferredTx is the pgx.Tx that Apply hands a write when it does not look
// the key up first. BEGIN is not sent in a round trip of its own: it goes
// in one pipeline with the write's first statement (Exec with arguments,
// Query, QueryRow or SendBatch), or, if the write runs none, with the
// key's row and COMMIT.
// Any other method, and a statement that a batch cannot carry, begins the
// transaction first, in a round trip of its own, then does what a pgx.Tx
// does. Commit and Rollback refuse (errWriteEndedTx): Apply ends the
// transaction.
type deferredTx struct {
	ctx  context.Context // Apply's, for the methods that take none
	conn *pgx.Conn
	opts pgx.TxOptions
	tx   pgx.Tx // the transaction, once BEGIN ran; nil before
	// failed is the error of a first batch that failed before its BEGIN
	// ran (pgx could not prepare or encode the first statement, or the
	// connection broke): the attempt fails with it whatever the write
	// returns, as a statement that failed in the transaction would make
	// it fail.
	failed error
	// recovering is set while fail begins the transaction on its own.
	recovering bool
}

var _ pgx.Tx = (*deferredTx)(nil)

// begun reports whether BEGIN ran.
func (t *deferredTx) begun() bool { return t.tx != nil }

// queueBegin queues BEGIN as the first statement of b, a batch that has
// none yet.
func (t *deferredTx) queueBegin(b *pgx.Batch) { b.BeginTx(t.opts) }

// send sends b, whose first statement queueBegin queued, and reads BEGIN's
// result: on success the next result of the returned BatchResults is the
// write's first statement's. On failure the batch is closed already.
func (t *deferredTx) send(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	br := t.conn.SendBatch(ctx, b)
	tx := br.Tx()
	if _, err := br.Exec(); err != nil { // BEGIN
		// Nothing ran: pgx refused the batch, or the connection broke.
		_ = br.Close()
		return nil, t.fail(err)
	}
	t.tx = tx
	return br, nil
}

// fail records err, the error of a batch whose BEGIN did not run, and
// returns it as the statement's error (pgx's, unwrapped, when pgx could
// not prepare or encode the statement, as the statement alone would have
// failed). It then begins the transaction on its own, so that whatever the
// write runs next runs inside it (and is rolled back), or, if it cannot,
// closes the connection, so that nothing the write runs next can commit
// outside a transaction.
func (t *deferredTx) fail(err error) error {
	var pre pgx.ErrPreprocessingBatch
	if errors.As(err, &pre) {
		if inner := errors.Unwrap(pre); inner != nil {
			err = inner
		}
	}
	if t.failed == nil {
		t.failed = err
	}
	if !t.recovering && !t.conn.IsClosed() {
		t.recovering = true
		if t.begin(t.ctx) != nil && !inTx(t.conn) {
			closeConn(t.ctx, t.conn)
		}
		t.recovering = false
	}
	return err
}

// begin sends BEGIN alone, if it has not run yet.
func (t *deferredTx) begin(ctx context.Context) error {
	if t.begun() {
		return nil
	}
	var b pgx.Batch
	t.queueBegin(&b)
	br, err := t.send(ctx, &b)
	if err != nil {
		return err
	}
	return br.Close()
}

// mustBegin begins for a method that returns no error (Conn,
// LargeObjects): if it cannot, the connection is closed, so that nothing
// runs on it outside the transaction.
func (t *deferredTx) mustBegin() {
	if t.begin(t.ctx) != nil && !inTx(t.conn) {
		closeConn(t.ctx, t.conn)
	}
}

// pipelinable reports whether a statement with these arguments can be
// queued in a batch as it is: a batch takes QueryRewriters (pgx.NamedArgs)
// before the arguments, but no other pgx option (a QueryExecMode, result
// formats). Exec without arguments is not: pgx runs it with the simple
// protocol, which allows several statements in one string, and a batch
// does not.
func pipelinable(exec bool, args []any) bool {
	for _, a := range args {
		switch a.(type) {
		case pgx.QueryRewriter:
			continue
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return false
		}
		return true
	}
	return !exec // no arguments, or only rewriters
}

// Exec runs sql, with BEGIN if BEGIN has not run yet.
func (t *deferredTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.begun() || t.failed != nil || !pipelinable(true, args) {
		if err := t.begin(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return t.tx.Exec(ctx, sql, args...)
	}
	var b pgx.Batch
	t.queueBegin(&b)
	b.Queue(sql, args...)
	br, err := t.send(ctx, &b)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	err = keepStatements(&b, err) // a duplicate's write often fails on a constraint
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query runs sql, with BEGIN if BEGIN has not run yet. As with any
// pgx.Rows, the rows must be closed (or read to the end) before the
// transaction is used again. On failure the rows carry the error too.
func (t *deferredTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.begun() || t.failed != nil || !pipelinable(false, args) {
		if err := t.begin(ctx); err != nil {
			return errRows{err: err, conn: t.conn}, err
		}
		return t.tx.Query(ctx, sql, args...)
	}
	var b pgx.Batch
	t.queueBegin(&b)
	b.Queue(sql, args...)
	br, err := t.send(ctx, &b)
	if err != nil {
		return errRows{err: err, conn: t.conn}, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return errRows{err: err, conn: t.conn}, err
	}
	return &batchRows{Rows: rows, br: br, b: &b}, nil
}

// QueryRow runs sql as Query does and returns its first row.
func (t *deferredTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return &firstRow{rows: rows, err: err}
}

// SendBatch sends b, after BEGIN, in the same round trip, if BEGIN has not
// run yet. A batch that begins a transaction is refused, as
// pgx refuses it in one.
func (t *deferredTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if pgx.FailedBatchResults(b, nil).Tx() != nil {
		return failedBatch{err: errBatchBegins, conn: t.conn}
	}
	if t.begun() || t.failed != nil {
		if err := t.begin(ctx); err != nil {
			return failedBatch{err: err, conn: t.conn}
		}
		return t.tx.SendBatch(ctx, b)
	}
	var all pgx.Batch
	t.queueBegin(&all)
	all.QueuedQueries = append(all.QueuedQueries, b.QueuedQueries...)
	br, err := t.send(ctx, &all)
	if err != nil {
		return failedBatch{err: err, conn: t.conn}
	}
	return userBatch{BatchResults: br, b: &all}
}

// Begin begins a pseudo nested transaction (a savepoint), as pgx.Tx does.
func (t *deferredTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

// Commit refuses: Apply commits, with the key's row.
func (t *deferredTx) Commit(context.Context) error { return errWriteEndedTx }

// Rollback refuses: Apply rolls back when the write fails.
func (t *deferredTx) Rollback(context.Context) error { return errWriteEndedTx }

// CopyFrom begins the transaction and copies, as pgx.Tx does.
func (t *deferredTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

// Prepare begins the transaction and prepares, as pgx.Tx does.
func (t *deferredTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

// LargeObjects begins the transaction (with Apply's context, as the method
// takes none) and returns its large objects. If BEGIN fails, the
// connection is closed and every large object call fails.
func (t *deferredTx) LargeObjects() pgx.LargeObjects {
	t.mustBegin()
	if t.tx == nil {
		return closedTx().LargeObjects() // its calls fail with pgx.ErrTxClosed
	}
	return t.tx.LargeObjects()
}

// Conn begins the transaction (with Apply's context, as the method takes
// none: statements run on the connection must be inside it) and returns
// the connection. If BEGIN fails, the connection is closed and every
// statement on it fails.
func (t *deferredTx) Conn() *pgx.Conn {
	t.mustBegin()
	return t.conn
}

// rollback ends the transaction if BEGIN ran (see rollback).
func (t *deferredTx) rollback(ctx context.Context) {
	if t.begun() {
		rollback(ctx, t.tx)
	}
}

// closedTx is a pgx.Tx whose every call fails with pgx.ErrTxClosed.
func closedTx() pgx.Tx {
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(&b, pgx.ErrTxClosed).Tx()
}

// closeConn closes conn, even when ctx is done.
func closeConn(ctx context.Context, conn *pgx.Conn) {
	cctx, cancel := retry.Detached(ctx, rollbackTimeout)
	defer cancel()
	_ = conn.Close(cctx)
}

// inTx reports whether conn is open and inside a transaction, failed or
// not.
func inTx(conn *pgx.Conn) bool {
	if conn.IsClosed() {
		return false
	}
	s := conn.PgConn().TxStatus()
	return s == 'T' || s == 'E'
}

// inTransaction reports whether the batch that ends an attempt with the
// key's row and COMMIT may be sent on conn: it is inside a transaction,
// failed or not, or closed (the batch then fails). Outside one (the write
// ran COMMIT or ROLLBACK as SQL), that batch would commit the key alone.
func inTransaction(conn *pgx.Conn) bool { return conn.IsClosed() || inTx(conn) }

// errNoTransaction fails an attempt whose transaction the write ended.
func errNoTransaction(key effects.Key) error {
	return fmt.Errorf("%s key %q: %w: nothing is committed with the key, and what the write committed stays", opApply, key, errWriteEndedTx)
}

// batchRows are the rows of a statement sent in a batch: closing them,
// or reading them to the end, closes the batch, which frees the
// connection.
type batchRows struct {
	pgx.Rows
	br       pgx.BatchResults
	b        *pgx.Batch // the batch br's results are of
	closeErr error
	closed   bool
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	// Keeps the batch's other statements prepared after a constraint
	// failure; the failed statement itself pgx's Rows forget
	// on any error.
	keepStatements(r.b, r.Rows.Err()) //nolint:errcheck // Err reports it
	r.closeErr = r.br.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}

// firstRow is the pgx.Row of QueryRow: the first row of rows, as pgx's
// own.
type firstRow struct {
	rows pgx.Rows
	err  error
}

func (r *firstRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	for _, d := range dest {
		if _, ok := d.(*pgtype.DriverBytes); ok {
			return errors.New("cannot scan into *pgtype.DriverBytes from QueryRow")
		}
	}
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// errRows are the rows of a query that failed before it returned any: as
// with pgx's own, the error is also the rows' (pgx.CollectRows takes
// them).
type errRows struct {
	err  error
	conn *pgx.Conn
}

func (r errRows) Close()                                       {}
func (r errRows) Err() error                                   { return r.err }
func (r errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                            { return r.err }
func (r errRows) Values() ([]any, error)                       { return nil, r.err }
func (r errRows) RawValues() [][]byte                          { return nil }
func (r errRows) Conn() *pgx.Conn                              { return r.conn }
func (r errRows) TypeMap() *pgtype.Map                         { return nil }

// userBatch is the BatchResults of a write's batch sent with BEGIN: its
// Tx is nil, as for any batch sent inside a transaction (the write must
// not end it).
type userBatch struct {
	pgx.BatchResults
	b *pgx.Batch // the batch the results are of
}

func (userBatch) Tx() pgx.Tx { return nil }

// Exec reads the next statement's result, keeping the batch's statements
// prepared when it failed on a constraint (see keepStatements).
func (u userBatch) Exec() (pgconn.CommandTag, error) {
	tag, err := u.BatchResults.Exec()
	return tag, keepStatements(u.b, err)
}

// failedBatch is the BatchResults of a write's batch that could not be
// sent, or whose BEGIN failed.
type failedBatch struct {
	err  error
	conn *pgx.Conn
}

func (f failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, f.err }
func (f failedBatch) Query() (pgx.Rows, error)         { return errRows{err: f.err, conn: f.conn}, f.err }
func (f failedBatch) QueryRow() pgx.Row                { return &firstRow{err: f.err} }
func (f failedBatch) Close() error                     { return f.err }
func (f failedBatch) Tx() pgx.Tx                       { return nil }
