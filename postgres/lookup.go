package postgres

import (
	"bytes"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
)

// keyLookup is what keyLookupSQL found.
type keyLookup struct {
	found bool   // the key was committed before
	fp    []byte // its fingerprint, if found
	ref   string // its ref, if found
	commitSettings
}

// scan reads the lookup's row.
func (p *keyLookup) scan(row pgx.Row) error {
	var ref *string
	if err := row.Scan(&p.found, &p.fp, &ref, &p.syncCommit, &p.syncRep); err != nil {
		return err
	}
	if ref != nil {
		p.ref = *ref
	}
	return nil
}

// queueLookup queues the lookup of key on b, read into p when b's results
// are closed: the lookup of an attempt that looks its key up first.
func queueLookup(b *pgx.Batch, scope string, key effects.Key, p *keyLookup) {
	b.Queue(keyLookupSQL, scope, string(key)).Fn = func(br pgx.BatchResults) error {
		return p.scan(br.QueryRow())
	}
}

// queueKeyInsert queues the key's INSERT on b, with the commit guard when
// guard (guardedInsertKeySQL). When it finds the key taken, pgx forgets
// the batch's prepared statements, as after any failed batch: the
// connection's next use of them prepares them again.
func queueKeyInsert(b *pgx.Batch, scope string, key effects.Key, fp []byte, ref string, guard bool) {
	sql := insertKeySQL
	if guard {
		sql = guardedInsertKeySQL
	}
	b.Queue(sql, scope, string(key), fp, ref)
}

// replayFound ends an attempt whose lookup found the key committed before:
// it rolls back what the attempt ran (if conn is in a transaction) and,
// under synchronous replication, passes the replay barrier (see
// replayBarrierSQL) in a transaction of its own, in the same round trip:
// one simple-protocol query, whose statements run one after the other, so
// that BEGIN is parsed only once ROLLBACK has ended a failed transaction
// (in which PostgreSQL would refuse to prepare it).
func replayFound(ctx context.Context, conn *pgx.Conn, key effects.Key, fp []byte, p *keyLookup) (effects.Result, classified) {
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
