package postgres

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/internal/sqlkeys"
)

// maxGrouped bounds how many Applies share one transaction: its members'
// writes run one after the other on one connection, so a larger group
// makes its first member wait longer for the COMMIT.
const maxGrouped = 32

// groupReq is one Apply that runs, alone or in a group, in the grouped
// shape.
type groupReq[In any] struct {
	ctx context.Context // the caller's: its values reach the write; it leaves the group when it ends
	key effects.Key
	fp  []byte
	in  In
}

// groupRes is one member's outcome. failed is set, and res and c are
// not, when the member's own write or key's INSERT failed: Apply then
// looks the key up alone (settleFailed), since the key may have been
// committed meanwhile. alone is set when the group rolled back for
// another member's failure: nothing of this member was committed, and
// Apply runs it again at once, alone (attempt).
type groupRes struct {
	res    effects.Result
	c      classified
	failed error
	alone  bool
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
	case r.alone:
		return e.attempt(ctx, key, fp, in, nil, false)
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
// BEGIN; each member's write, one after the other; then every member's
// key's INSERT, in key order, with COMMIT, in one round trip. A member
// whose write or key's INSERT fails fails the transaction: it rolls back,
// the member settles alone (settleFailed) and every other runs again
// alone. A connection lost, or any failure of the transaction itself, is
// every member's.
type group[In any] struct {
	e    *Effect[In]
	ctx  context.Context // the group's: ends when every member's caller has gone
	reqs []groupReq[In]
	out  []groupRes

	conn    *pgxpool.Conn
	tx      pgx.Tx
	pending []int // members written, waiting for their keys' INSERTs and COMMIT
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
	if g.tx, err = conn.BeginTx(g.ctx, g.e.txOptions); err != nil {
		g.broken(0, err)
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
	if len(g.pending) > 0 {
		g.commit()
	}
}

// member runs member i's write. It reports whether the transaction goes
// on.
func (g *group[In]) member(i int) bool {
	r := g.reqs[i]
	if err := r.ctx.Err(); err != nil {
		// Its caller has gone: nothing of it was sent.
		g.out[i].c = classified{err: sqlkeys.Canceled(r.ctx, opApply, r.key, err)}
		return true
	}
	wctx, done := memberContext(g.ctx, r.ctx)
	ref, err := g.e.write(wctx, writeTx{g.tx}, r.in)
	done()
	conn := g.conn.Conn()
	switch {
	case err != nil && (conn.IsClosed() || g.ctx.Err() != nil):
		g.broken(i, err)
		return false
	case err != nil:
		g.out[i] = groupRes{failed: err}
		g.againAlone(i)
		return false
	case !inTransaction(conn):
		// The write ended the transaction with SQL: what the pending
		// members wrote committed or rolled back with it, without their
		// keys.
		g.ending = true
		g.out[i].c = classified{err: errNoTransaction(r.key)}
		g.endPending(func(key effects.Key) classified { return classified{err: errNoTransaction(key)} })
		g.failRest(i+1, func(key effects.Key) classified {
			return classified{err: effects.Transient(opApply, key, errWriteEndedTx), retry: true}
		})
		return false
	}
	if failedTx(conn) {
		// A statement of the write failed and the write returned no
		// error: its own failure, which would otherwise fail the first
		// key's INSERT, another member's.
		g.out[i] = groupRes{failed: errWriteIgnoredFailure}
		g.againAlone(i)
		return false
	}
	g.out[i].res = effects.Result{Status: effects.Applied, Ref: ref}
	g.pending = append(g.pending, i)
	return true
}

// commit sends the pending members' keys' INSERTs, in key order (so that
// two groups with keys in common take their rows in one order and do not
// deadlock), with COMMIT, and settles every member.
func (g *group[In]) commit() {
	slices.SortFunc(g.pending, func(a, b int) int { return cmp.Compare(g.reqs[a].key, g.reqs[b].key) })
	var b pgx.Batch
	for _, i := range g.pending {
		r := g.reqs[i]
		queueKeyInsert(&b, g.e.scope, r.key, r.fp, g.out[i].res.Ref, !g.e.cfg.allowAsyncCommit)
	}
	b.Queue("COMMIT").Exec(commitTag)
	g.ending = true
	conn := g.conn.Conn()
	br := conn.SendBatch(g.ctx, &b)
	culprit := -1
	for j := range g.pending {
		if _, err := br.Exec(); err != nil {
			if serverError(err) {
				culprit = g.pending[j]
			}
			break
		}
	}
	err := br.Close()
	if culprit < 0 || conn.IsClosed() {
		g.committed(err)
		return
	}
	// A key's INSERT failed: the transaction failed, and COMMIT was
	// skipped.
	rollback(g.ctx, g.tx)
	if guardRefused(err) {
		// The commit settings were unsafe at the first key's INSERT,
		// whichever member's write changed them (SET LOCAL, say): each
		// member runs again alone and gets its own verdict.
		g.againAlone(-1)
		return
	}
	g.out[culprit] = groupRes{failed: err}
	g.againAlone(culprit)
}

// againAlone sends every member but the culprit (none if it is -1),
// which settles alone, to run again alone: the transaction failed, and
// nothing of theirs was committed.
func (g *group[In]) againAlone(culprit int) {
	for i := range g.reqs {
		if i != culprit && g.out[i].c.err == nil {
			g.out[i] = groupRes{alone: true}
		}
	}
	g.pending = nil
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
