package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"effectively.dev/effects"
)

// probeSQL looks the key up with the settings that decide whether a replay
// may be acknowledged, in one statement that always returns one row (found
// false for a new key). Sent right after BEGIN, in the round trip that
// carries the writes, it lets an attempt that did not look the key up
// first replay a key committed before without another round trip; sent
// alone (with BEGIN) it is the lookup of an attempt that looks first, and
// after a failed attempt the lookup that replays a duplicate. It takes no
// lock: a concurrent Apply of the same key that it did not see is settled
// by the key's INSERT (see insertKeySQL).
const probeSQL = `SELECT k.key IS NOT NULL, k.fingerprint, k.ref, s.sync_commit, s.sync_rep
FROM (SELECT current_setting('synchronous_commit') AS sync_commit,
		current_setting('synchronous_standby_names') <> '' AS sync_rep) AS s
	LEFT JOIN effectively_keys AS k ON k.scope = $1 AND k.key = $2`

// probe is what probeSQL found.
type probe struct {
	found bool   // the key was committed before
	fp    []byte // its fingerprint, if found
	ref   string // its ref, if found
	commitSettings
}

// scan reads the probe's row.
func (p *probe) scan(row pgx.Row) error {
	var ref *string
	if err := row.Scan(&p.found, &p.fp, &ref, &p.syncCommit, &p.syncRep); err != nil {
		return err
	}
	if ref != nil {
		p.ref = *ref
	}
	return nil
}

// queueProbe queues the probe of key on b, read into p when b's results
// are closed: the lookup of an attempt that looks its key up first.
func queueProbe(b *pgx.Batch, scope string, key effects.Key, p *probe) {
	b.Queue(probeSQL, scope, string(key)).Fn = func(br pgx.BatchResults) error {
		return p.scan(br.QueryRow())
	}
}

// queueKeyInsert queues the key's INSERT on b, with the commit guard when
// guard (guardedInsertKeySQL); when it finds the key taken, or the guard
// refuses, pgx is told nothing of the failure's statements (see
// keepStatements).
func queueKeyInsert(b *pgx.Batch, scope string, key effects.Key, fp []byte, ref string, guard bool) {
	sql := insertKeySQL
	if guard {
		sql = guardedInsertKeySQL
	}
	qq := b.Queue(sql, scope, string(key), fp, ref)
	qq.Fn = func(br pgx.BatchResults) error {
		_, err := br.Exec()
		return keepStatements(b, err)
	}
}

// keepStatements returns err, after emptying b's queue when err is a
// failure that says nothing about b's statements: the key taken, another
// constraint violated (SQLSTATE class 23), the commit guard's refusal.
// pgx forgets (deallocates, and prepares again on the next use) every
// statement of a batch that failed, in case a cached statement went stale;
// it finds the statements in the batch's queue when its results are
// closed, so an empty queue keeps them prepared, and a duplicate costs no
// round trip to prepare them again. b's results must be read to the point
// of the failure already (Close reads no further after one).
func keepStatements(b *pgx.Batch, err error) error {
	if err != nil && keptAfter(err) {
		b.QueuedQueries = nil
	}
	return err
}

// keptAfter reports whether err leaves the failed batch's statements valid.
func keptAfter(err error) bool {
	var pgErr *pgconn.PgError
	return guardRefused(err) || (errors.As(err, &pgErr) && isError(pgErr) && len(pgErr.Code) == 5 && pgErr.Code[:2] == "23")
}

// replayFound ends an attempt whose probe found the key committed before:
// it rolls back what the attempt ran (if conn is in a transaction) and,
// under synchronous replication, passes the replay barrier (see
// replayBarrierSQL) in a transaction of its own, in the same round trip:
// one simple-protocol query, whose statements run one after the other, so
// that BEGIN is parsed only once ROLLBACK has ended a failed transaction
// (in which PostgreSQL would refuse to prepare it).
func replayFound(ctx context.Context, conn *pgx.Conn, key effects.Key, fp []byte, p *probe) (effects.Result, classified) {
	inTx := inTx(conn)
	switch {
	case !bytes.Equal(p.fp, fp):
		if inTx {
			rollbackConn(ctx, conn)
		}
		return effects.Result{}, classified{err: reused(opApply, key)}
	case !p.replayNeedsBarrier():
		if inTx {
			rollbackConn(ctx, conn)
		}
		return effects.Result{Status: effects.Replayed, Ref: p.ref}, classified{}
	}
	sql := "BEGIN; " + replayBarrierSQL + "; COMMIT"
	if inTx {
		sql = "ROLLBACK; " + sql
	}
	tag, err := conn.Exec(ctx, sql) // no arguments: the simple protocol
	if err == nil {
		err = commitTag(tag)
	}
	if err != nil {
		return effects.Result{}, classify(ctx, opApply, key, err, true, conn.IsClosed())
	}
	if c := waitCut(ctx, key); c.err != nil {
		return effects.Result{}, c
	}
	return effects.Result{Status: effects.Replayed, Ref: p.ref}, classified{}
}

// waitCut reports ErrAmbiguous when ctx ended by the time a COMMIT
// returned success: PostgreSQL ends a commit's wait for the synchronous
// standby when the query is cancelled (pgx's
// CancelRequestContextWatcherHandler cancels it when ctx ends), keeps the
// commit locally and only warns, so the standby a failover promotes may
// not have it. A retry with the same key replays, once the standby has it.
func waitCut(ctx context.Context, key effects.Key) classified {
	if err := ctx.Err(); err != nil {
		return classified{err: effects.Ambiguous(opApply, key,
			fmt.Errorf("the context ended while COMMIT waited, so the synchronous standby may not have the commit: %w", err))}
	}
	return classified{}
}
