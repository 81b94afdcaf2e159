package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
)

// maxGrouped bounds how many Applies share one transaction. Each member
// that writes gets a subtransaction (its savepoint); PostgreSQL keeps the
// ids of up to 64 of them per transaction in shared memory, and beyond
// that every snapshot in the database pays for a lookup. Half of it
// leaves room for savepoints the writes take themselves.
const maxGrouped = 32

// The savepoint of each member of a group. Members never release it: each
// SAVEPOINT pushes a new one under the same name, and ROLLBACK TO undoes
// the latest member only.
const (
	savepointSQL         = "SAVEPOINT effectively_apply"
	rollbackSavepointSQL = "ROLLBACK TO SAVEPOINT effectively_apply"
)

// groupReq is one Apply that runs, alone or in a group, in the grouped
// shape.
type groupReq[In any] struct {
	ctx context.Context // the caller's: its values reach the write; it leaves the group when it ends
	key effects.Key
	fp  []byte
	in  In
}

// groupRes is one member's outcome. failed is set, and res and c are
// not, when the member's write or key's INSERT failed on its own and was
// rolled back to its savepoint: Apply then looks the key up alone
// (settleFailed), since the key may have been committed meanwhile.
type groupRes struct {
	res    effects.Result
	c      classified
	failed error
}

// newGroup returns the coalescer of e's grouped shape: as many
// transactions in flight at once as pool has connections, at most
// maxGrouped members each, distinct keys in each group. An Apply waits
// for a group only when the Effect's transactions hold as many connections
// as the pool can open, when it would otherwise wait for a connection.
// (Fewer slots make Applies wait while connections are free: a member's
// statements run one after the other on its group's connection, so a
// group's transaction takes longer than each of its members' would have
// alone, and the next group waits for it; on a 2-core machine under load,
// half the pool's slots cost a third of the throughput, in
// cmd/e2ebench.)
func newGroup[In any](e *Effect[In], pool *pgxpool.Pool) *coalescer[groupReq[In], groupRes] {
	return &coalescer[groupReq[In], groupRes]{
		limit: int(pool.Config().MaxConns),
		size:  maxGrouped,
		key:   func(r groupReq[In]) string { return string(r.key) },
		exec:  e.runGroup,
	}
}

// attemptGrouped runs one attempt of the grouped shape: alone, as
// attempt does, when a slot is free; else in the next group.
func (e *Effect[In]) attemptGrouped(ctx context.Context, key effects.Key, fp []byte, in In) (effects.Result, classified) {
	r, end := e.group.do(ctx, groupReq[In]{ctx: ctx, key: key, fp: fp, in: in})
	switch {
	case end != callDone:
		return effects.Result{}, classified{err: ended(ctx, opApply, key, end)}
	case r.failed != nil:
		return e.settleFailed(ctx, key, fp, r.failed)
	}
	return r.res, r.c
}

// runGroup is the group's exec: a lone Apply runs attempt on its caller's
// context; two or more run as one transaction (applyGroup).
func (e *Effect[In]) runGroup(ctx context.Context, reqs []groupReq[In]) []groupRes {
	out := make([]groupRes, len(reqs))
	if len(reqs) == 1 {
		r := reqs[0]
		out[0].res, out[0].c = e.attempt(ctx, r.key, r.fp, r.in, nil, false)
		return out
	}
	g := &group[In]{e: e, ctx: ctx, reqs: reqs, out: out}
	g.run()
	return out
}

// settleFailed ends the Apply of a member whose own write or key's
// INSERT failed, after its group: if the key was committed meanwhile, by
// a concurrent Apply or before, it replays (as failedBeforeCommit does);
// a key taken that the lookup could not see is retried with the lookup
// first (as endFailed does); anything else is failed's error.
func (e *Effect[In]) settleFailed(ctx context.Context, key effects.Key, fp []byte, failed error) (effects.Result, classified) {
	if conn, err := e.pool.Acquire(ctx); err == nil {
		res, c, ok := e.replayIfCommitted(ctx, conn.Conn(), func() {}, key, fp)
		conn.Release()
		if ok {
			return res, c
		}
	}
	if keyTaken(failed) {
		return effects.Result{}, classified{err: effects.Transient(opApply, key, failed), retry: true, lookUp: true}
	}
	return effects.Result{}, classify(ctx, opApply, key, failed, false, false)
}

// group is one transaction of two or more Applies (see Apply, "grouped"):
// BEGIN with the first member's savepoint; for each member its write,
// then its key's INSERT with the next member's savepoint, the last
// member's with COMMIT. A member whose write or key's INSERT fails is
// rolled back to its savepoint and the others go on; a connection lost,
// or any failure of the transaction itself, is every pending member's.
type group[In any] struct {
	e    *Effect[In]
	ctx  context.Context // the group's: ends when every member's caller has gone
	reqs []groupReq[In]
	out  []groupRes

	conn    *pgxpool.Conn
	tx      pgx.Tx
	pending []int // members written, their keys inserted, waiting for COMMIT
	ending  bool  // COMMIT was sent, or the transaction ended otherwise
}

// run runs the group and fills out.
func (g *group[In]) run() {
	conn, err := g.e.pool.Acquire(g.ctx)
	if err != nil {
		g.failRest(0, func(key effects.Key) classified { return classify(g.ctx, opApply, key, err, false, false) })
		return
	}
	g.conn = conn
	defer conn.Release() // destroys the connection unless it is idle, outside a transaction
	if !g.begin() {
		return
	}
	defer func() {
		if !g.ending {
			rollback(g.ctx, g.tx)
		}
	}()
	for i := range g.reqs {
		if !g.member(i) {
			return
		}
	}
	if len(g.pending) > 0 && !g.ending {
		// The last member failed: COMMIT the others alone.
		var b pgx.Batch
		b.Queue("COMMIT").Exec(commitTag)
		g.ending = true
		g.committed(g.conn.SendBatch(g.ctx, &b).Close())
	}
}

// begin sends BEGIN with the first member's savepoint, in one round
// trip, and reports whether the transaction is open.
func (g *group[In]) begin() bool {
	var b pgx.Batch
	b.BeginTx(g.e.txOptions)
	b.Queue(savepointSQL)
	br := g.conn.SendBatch(g.ctx, &b)
	g.tx = br.Tx()
	if err := br.Close(); err != nil {
		rollback(g.ctx, g.tx) // a no-op if BEGIN failed
		g.broken(0, err)
		return false
	}
	return true
}

// member runs member i: its write, then insertKey. It reports whether
// the transaction goes on.
func (g *group[In]) member(i int) bool {
	r := g.reqs[i]
	if err := r.ctx.Err(); err != nil {
		// Its caller has gone: nothing of it was sent.
		g.out[i].c = classified{err: canceled(r.ctx, opApply, r.key, err)}
		return true
	}
	wctx, done := memberContext(g.ctx, r.ctx)
	ref, err := g.e.write(wctx, writeTx{g.tx}, r.in)
	done()
	conn := g.conn.Conn()
	switch {
	case err != nil:
		return g.rollbackMember(i, err)
	case !inTransaction(conn):
		// The write ended the transaction with SQL: what the pending
		// members wrote committed or rolled back with it.
		g.ending = true
		g.out[i].c = classified{err: errNoTransaction(r.key)}
		g.endPending(func(key effects.Key) classified {
			return classified{err: effects.Ambiguous(opApply, key, errWriteEndedTx)}
		})
		g.failRest(i+1, func(key effects.Key) classified {
			return classified{err: effects.Transient(opApply, key, errWriteEndedTx), retry: true}
		})
		return false
	}
	return g.insertKey(i, ref)
}

// insertKey sends member i's key's INSERT, with ref, and the next
// member's savepoint (or, for the last member, COMMIT), and settles what
// it can. It reports whether the transaction goes on.
func (g *group[In]) insertKey(i int, ref string) bool {
	r, conn := g.reqs[i], g.conn.Conn()
	last := i == len(g.reqs)-1
	var b pgx.Batch
	queueKeyInsert(&b, g.e.scope, r.key, r.fp, ref, !g.e.cfg.allowAsyncCommit)
	if last {
		b.Queue("COMMIT").Exec(commitTag)
	} else {
		b.Queue(savepointSQL)
	}
	err := conn.SendBatch(g.ctx, &b).Close()
	if err == nil {
		g.out[i].res = effects.Result{Status: effects.Applied, Ref: ref}
		g.pending = append(g.pending, i)
		if last {
			g.ending = true
			g.committed(nil)
		}
		return true
	}
	if serverError(err) && !conn.IsClosed() {
		if last && !inTx(conn) {
			// The key's INSERT went through and COMMIT failed with an
			// ERROR: the whole transaction rolled back.
			g.ending = true
			g.pending = append(g.pending, i)
			g.committed(err)
			return false
		}
		// The key's INSERT (or the savepoint after it) failed: this
		// member only; its COMMIT, if it carried one, was skipped.
		if guardRefused(err) {
			if !g.rollbackTo(i, err) {
				return false
			}
			g.out[i] = groupRes{c: classified{err: asyncCommit(opApply, r.key)}}
			return true
		}
		return g.rollbackMember(i, err)
	}
	if last {
		g.ending = true
		g.pending = append(g.pending, i)
		g.committed(err)
		return false
	}
	g.broken(i, err)
	return false
}

// rollbackMember rolls member i back to its savepoint after its own
// failure, err, and reports whether the transaction goes on.
func (g *group[In]) rollbackMember(i int, err error) bool {
	if !g.rollbackTo(i, err) {
		return false
	}
	g.out[i] = groupRes{failed: err}
	return true
}

// rollbackTo rolls back to the latest savepoint, the failed member i's,
// in the simple protocol (a failed transaction accepts nothing else), and
// reports whether it did; if not, the transaction is lost (broken).
func (g *group[In]) rollbackTo(i int, cause error) bool {
	conn := g.conn.Conn()
	if !conn.IsClosed() && inTx(conn) {
		if _, err := conn.Exec(g.ctx, rollbackSavepointSQL); err == nil {
			return true
		}
	}
	g.broken(i, cause)
	return false
}

// broken settles every member from i on, and the pending ones, when the
// transaction was lost before COMMIT was sent: nothing was committed.
func (g *group[In]) broken(i int, err error) {
	closed := g.conn.Conn().IsClosed()
	c := func(key effects.Key) classified { return classify(g.ctx, opApply, key, err, false, closed) }
	g.endPending(c)
	g.failRest(i, c)
}

// committed settles the pending members once COMMIT returned err.
func (g *group[In]) committed(err error) {
	switch {
	case err == nil && g.ctx.Err() == nil:
		return
	case err == nil:
		g.endPending(func(key effects.Key) classified { return waitCut(g.ctx, key) })
		return
	}
	closed := g.conn.Conn().IsClosed()
	if _, ok := preprocessingFailed(g.ctx, opApply, "", err, closed); ok {
		// pgx refused to send the batch: COMMIT was never sent.
		g.endPending(func(key effects.Key) classified {
			c, _ := preprocessingFailed(g.ctx, opApply, key, err, closed)
			return c
		})
		return
	}
	if failedTx(g.conn.Conn()) {
		rollback(g.ctx, g.tx)
	}
	if serverError(err) && !raceLost(err) && g.ctx.Err() == nil {
		// COMMIT failed with an ERROR (a deferred constraint, say):
		// nothing was committed, and which member's write caused it is
		// unknown. Each retries alone, looking its key up first, so that
		// the error ends only the Apply that caused it.
		g.endPending(func(key effects.Key) classified {
			return classified{err: effects.Transient(opApply, key, fmt.Errorf("its group's COMMIT failed, nothing was committed: %w", err)), retry: true, lookUp: true}
		})
		return
	}
	g.endPending(func(key effects.Key) classified { return classify(g.ctx, opApply, key, err, true, false) })
}

// endPending replaces the pending members' outcome with c(key).
func (g *group[In]) endPending(c func(effects.Key) classified) {
	for _, i := range g.pending {
		g.out[i] = groupRes{c: c(g.reqs[i].key)}
	}
	g.pending = nil
}

// failRest gives every member from i on the verdict c(key).
func (g *group[In]) failRest(i int, c func(effects.Key) classified) {
	for ; i < len(g.reqs); i++ {
		g.out[i] = groupRes{c: c(g.reqs[i].key)}
	}
}

// memberContext is the context of a member's write: its caller's values,
// ended with the group's context rather than the caller's, since the
// statements run on the group's connection (a statement cancelled by one
// caller would break the transaction of all).
func memberContext(group, member context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(member))
	stop := context.AfterFunc(group, cancel)
	return ctx, func() { stop(); cancel() }
}
