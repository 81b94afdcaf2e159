package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
)

// errVanished is the cause when a key conflicted but could not be read back:
// it was pruned in between. Retrying claims it afresh.
var errVanished = errors.New("key conflicted but was gone when read back (pruned concurrently?)")

// commitSettings are the session's settings that decide whether its commit
// can be acknowledged safely.
type commitSettings struct {
	syncCommit string // synchronous_commit in effect
	syncRep    bool   // synchronous_standby_names is set: commits wait for a standby
}

// unsafeCommit reports whether a commit under these settings can be
// acknowledged and then lost: synchronous_commit = off always; local when a
// synchronous standby is configured, because the commit does not wait for
// the standby that a failover promotes.
func (s commitSettings) unsafeCommit() bool {
	return s.syncCommit == "off" || (s.syncRep && s.syncCommit == "local")
}

// replayNeedsBarrier reports whether a replay in this session must pass
// the replay barrier before it is reported: see replayBarrierSQL.
func (s commitSettings) replayNeedsBarrier() bool { return s.syncRep && !s.unsafeCommit() }

// claimOutcome is what claimKey found.
type claimOutcome struct {
	inserted bool   // the key is new and now claimed in tx
	ref      string // stored ref when !inserted
	commitSettings
}

// needsBarrier reports whether a replay must wait for the standby before it
// is reported: see replayBarrierSQL.
func (o claimOutcome) needsBarrier() bool { return !o.inserted && o.replayNeedsBarrier() }

// claimKey runs the claim and the lookup in tx, in one round trip, and
// compares fingerprints when the key was taken. Errors are raw; the caller
// classifies them. A different fingerprint returns an ErrKeyReused
// *effects.Error.
func claimKey(ctx context.Context, tx pgx.Tx, op, scope string, key effects.Key, fp []byte) (claimOutcome, error) {
	var (
		out      claimOutcome
		storedFP []byte
		batch    pgx.Batch
	)
	batch.Queue(claimSQL, scope, string(key), fp).QueryRow(func(row pgx.Row) error {
		return row.Scan(&out.inserted, &out.syncCommit, &out.syncRep)
	})
	batch.Queue(lookupSQL, scope, string(key)).QueryRow(func(row pgx.Row) error {
		return row.Scan(&storedFP, &out.ref)
	})
	if err := tx.SendBatch(ctx, &batch).Close(); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return out, errVanished
		}
		return out, err
	}
	if out.inserted {
		out.ref = ""
		return out, nil
	}
	if !bytes.Equal(storedFP, fp) {
		return out, reused(op, key)
	}
	return out, nil
}

func reused(op string, key effects.Key) error {
	return &effects.Error{Kind: effects.ErrKeyReused, Op: op, Key: key,
		Err: errors.New("the stored fingerprint differs; nothing was written")}
}

func asyncCommit(op string, key effects.Key) error {
	return fmt.Errorf("%s key %q: %w", op, key, ErrAsyncCommit)
}

// Claim claims key under scope inside tx, a transaction the caller owns, so
// that the caller's own writes and the claim commit or roll back together:
// the guarantee of [Effect.Apply] for code that already has a transaction
// (several effects in one transaction, a framework that hands you a
// pgx.Tx). It inserts the key first, with ON CONFLICT DO NOTHING, so that a
// concurrent duplicate waits on the primary key from the start. (Apply,
// which owns its transaction, inserts the key last, with its ref, in the
// round trip of COMMIT, and looks it up only after a failed attempt or
// with [WithLookupFirst]; see [Effect.Apply].)
//
// It returns Status [effects.Applied] when the key is new and now claimed in
// tx: do the effect in tx, optionally [SetRef], then commit. "Applied" takes
// effect only when tx commits; a rollback releases the key. It returns
// [effects.Replayed] with the stored Ref when the key was committed before
// with the same fingerprint: do nothing. tx stays usable in both cases (no
// error is raised inside the transaction, so no savepoint is needed).
//
// The caller must commit tx, and must ack the message only after the commit
// returned nil, also after a replay: under synchronous replication a
// replayed claim makes tx wait, at commit, for the standby to hold the
// earlier commit (see [New]); rolling back instead skips that wait. If Commit
// fails with an error other than a PostgreSQL ERROR (a lost connection),
// the outcome is unknown: redeliver with the same key, which replays or
// applies. So it is if the commit's context ended by the time Commit
// returned nil: with pgx's CancelRequestContextWatcherHandler PostgreSQL
// ends the wait for a synchronous standby, keeps the commit locally and
// only warns (Apply reports that as [effects.ErrAmbiguous]).
//
// Errors: [effects.ErrInvalidKey] before any I/O; [effects.ErrKeyReused]
// when the stored fingerprint differs (roll back); [ErrAsyncCommit] (roll
// back); [effects.ErrTransient] on a serialization failure, deadlock or
// broken connection: roll back and retry the whole transaction. At REPEATABLE
// READ or SERIALIZABLE, a duplicate that commits while Claim waits for it
// makes Claim fail with 40001 (ErrTransient), and the retry replays.
//
// A nil fingerprint is stored as an empty one. Its only
// [Option] is [AllowAsyncCommit].
func Claim(ctx context.Context, tx pgx.Tx, scope string, key effects.Key, fingerprint []byte, opts ...Option) (effects.Result, error) {
	const op = "postgres.Claim"
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	if err := validateScope(op, scope); err != nil {
		return effects.Result{}, err
	}
	cfg := newTxConfig(opts)
	out, err := claimKey(ctx, tx, op, scope, key, nonNil(fingerprint))
	switch {
	case errors.Is(err, effects.ErrKeyReused):
		return effects.Result{}, err
	case errors.Is(err, errVanished):
		return effects.Result{}, effects.Transient(op, key, err)
	case err != nil:
		return effects.Result{}, classify(ctx, op, key, err, false, tx.Conn().IsClosed()).err
	case out.unsafeCommit() && !cfg.allowAsyncCommit:
		return effects.Result{}, asyncCommit(op, key)
	case out.inserted:
		return effects.Result{Status: effects.Applied}, nil
	case out.needsBarrier():
		if _, err := tx.Exec(ctx, replayBarrierSQL); err != nil {
			return effects.Result{}, classify(ctx, op, key, err, false, tx.Conn().IsClosed()).err
		}
	}
	return effects.Result{Status: effects.Replayed, Ref: out.ref}, nil
}

// SetRef stores ref, the backend's reference to the effect (a ledger row
// id, say), for a key that [Claim] returned as Applied in the same tx;
// replays then return it. Call it only after Applied: on a replayed key it
// would overwrite the reference of the earlier effect. It fails if no such
// key is visible to tx. It costs one UPDATE of the row just inserted.
func SetRef(ctx context.Context, tx pgx.Tx, scope string, key effects.Key, ref string) error {
	const op = "postgres.SetRef"
	if err := key.Validate(); err != nil {
		return err
	}
	if err := validateScope(op, scope); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, setRefSQL, scope, string(key), ref)
	if err != nil {
		return classify(ctx, op, key, err, false, tx.Conn().IsClosed()).err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%s key %q: no such key in scope %q: claim it first, in the same transaction", op, key, scope)
	}
	return nil
}

// nonNil returns s, or an empty slice for nil: pgx sends a nil slice as
// NULL, and the fingerprint column is NOT NULL ("= ANY(NULL)" is NULL, not
// false, for the lost-lease tokens of beginSQL).
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
