package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
)

// beginSQL takes the key in one statement: a new key is inserted pending
// with a lease; an existing one is taken over (attempt + 1, new lease) only
// if it is not done, has the same fingerprint and no live lease. RETURNING
// gives a row exactly when the caller now holds the lease. Leases use the
// database's clock, so the callers' clocks do not matter.
const beginSQL = `INSERT INTO effectively_journal AS j (scope, key, fingerprint, lease_until)
VALUES ($1, $2, $3, now() + $4 * interval '1 microsecond')
ON CONFLICT (scope, key) DO UPDATE
	SET attempt = j.attempt + 1, lease_until = excluded.lease_until, updated_at = now()
	WHERE NOT j.done AND j.fingerprint = excluded.fingerprint
		AND (j.lease_until IS NULL OR j.lease_until <= now())
RETURNING j.attempt`

// journalLookupSQL explains why beginSQL took nothing.
const journalLookupSQL = `SELECT fingerprint, done, ref, attempt, coalesce(lease_until > now(), false)
FROM effectively_journal WHERE scope = $1 AND key = $2`

const completeSQL = `UPDATE effectively_journal SET done = true, ref = $3, lease_until = NULL, updated_at = now()
WHERE scope = $1 AND key = $2 AND NOT done`

const releaseSQL = `UPDATE effectively_journal SET lease_until = NULL, updated_at = now()
WHERE scope = $1 AND key = $2 AND NOT done AND attempt = $3`

// beginTries bounds Begin's retries when the record changes between its
// statement and the follow-up read (a lease expiring, a record pruned).
const beginTries = 3

// Journal is an [effects.Journal] in the effectively_journal table: the
// sent-record for effects outside the database (an email, a message to a
// broker without transactions, a call to an API past its key horizon). Each
// call is one autocommit statement (two when Begin finds the key taken or
// Complete finds it done). It is safe for concurrent use.
//
// A journal does not make an outside effect effectively once: a crash
// between the effect and Complete leaves the record pending, and once the
// lease expires the next attempt (Record.Attempt > 1) repeats the effect.
// Adapters that use it declare AtLeastOnce with that window.
type Journal struct {
	pool  *pgxpool.Pool
	scope string
}

var _ effects.Journal = (*Journal)(nil)

// NewJournal returns a Journal for keys in scope. The table must exist: see
// [Migrate]. It returns an [*effects.ConfigError] if pool is nil or scope
// is empty, not UTF-8 or contains NUL.
func NewJournal(pool *pgxpool.Pool, scope string) (*Journal, error) {
	const op = "postgres.NewJournal"
	if pool == nil {
		return nil, &effects.ConfigError{Op: op, Option: "pool", Reason: "nil"}
	}
	if err := validateScope(op, scope); err != nil {
		return nil, err
	}
	return &Journal{pool: pool, scope: scope}, nil
}

// Begin claims key for one attempt lasting at most lease (at least 1 µs),
// measured by the database's clock. See [effects.Journal]: it returns a
// done Record, [effects.ErrInFlight], [effects.ErrKeyReused], or a Record
// whose lease the caller now holds, with Attempt 1 for a new key and one
// more for each takeover of an expired or released lease. A failure whose
// reply was lost is [effects.ErrAmbiguous]: the caller may hold the lease,
// so a retry may see ErrInFlight until it expires.
func (j *Journal) Begin(ctx context.Context, key effects.Key, fingerprint []byte, lease time.Duration) (effects.Record, error) {
	const op = "postgres.Journal.Begin"
	if err := key.Validate(); err != nil {
		return effects.Record{}, err
	}
	if lease <= 0 {
		return effects.Record{}, fmt.Errorf("%s key %q: lease %v is not positive", op, key, lease)
	}
	fp := nonNil(fingerprint)
	micros := max(lease.Microseconds(), 1)
	for range beginTries {
		var attempt int
		err := j.pool.QueryRow(ctx, beginSQL, j.scope, string(key), fp, micros).Scan(&attempt)
		if err == nil {
			return effects.Record{Attempt: attempt}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return effects.Record{}, classify(ctx, op, key, err, true, false).err
		}
		var (
			storedFP []byte
			rec      effects.Record
			live     bool
		)
		err = j.pool.QueryRow(ctx, journalLookupSQL, j.scope, string(key)).Scan(&storedFP, &rec.Done, &rec.Ref, &rec.Attempt, &live)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // deleted in between: try again
		case err != nil:
			return effects.Record{}, classify(ctx, op, key, err, false, false).err
		case !bytes.Equal(storedFP, fp):
			return effects.Record{}, reused(op, key)
		case rec.Done:
			return rec, nil
		case live:
			return effects.Record{}, &effects.Error{Kind: effects.ErrInFlight, Op: op, Key: key,
				Err: fmt.Errorf("attempt %d holds the lease", rec.Attempt)}
		}
		// The lease expired between the two statements: try again.
	}
	return effects.Record{}, &effects.Error{Kind: effects.ErrInFlight, Op: op, Key: key,
		Err: errors.New("the record kept changing under concurrent attempts")}
}

// Complete marks key done with ref, the backend's reference to the effect,
// and drops the lease. Completing a done key again succeeds and keeps the
// first reference. It fails if key was never begun. A lost reply is
// [effects.ErrAmbiguous]; Complete is idempotent, so retry it.
func (j *Journal) Complete(ctx context.Context, key effects.Key, ref string) error {
	const op = "postgres.Journal.Complete"
	if err := key.Validate(); err != nil {
		return err
	}
	tag, err := j.pool.Exec(ctx, completeSQL, j.scope, string(key), ref)
	if err != nil {
		return classify(ctx, op, key, err, true, false).err
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var done bool
	err = j.pool.QueryRow(ctx, `SELECT done FROM effectively_journal WHERE scope = $1 AND key = $2`, j.scope, string(key)).Scan(&done)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%s key %q: not begun in scope %q", op, key, j.scope)
	case err != nil:
		return classify(ctx, op, key, err, false, false).err
	case !done: // released and re-begun concurrently? should not happen: the UPDATE saw it
		return effects.Transient(op, key, errors.New("record changed concurrently"))
	}
	return nil
}

// Release drops attempt's lease on key if it is not done, so the next Begin
// takes over at once (with Attempt one higher) instead of waiting for the
// lease to expire. Call it only after a failure that definitely did not do
// the effect. Releasing a done or unknown key, or with an attempt that is
// no longer the latest (its lease expired and another attempt took over),
// does nothing.
func (j *Journal) Release(ctx context.Context, key effects.Key, attempt int) error {
	const op = "postgres.Journal.Release"
	if err := key.Validate(); err != nil {
		return err
	}
	if _, err := j.pool.Exec(ctx, releaseSQL, j.scope, string(key), attempt); err != nil {
		return classify(ctx, op, key, err, true, false).err
	}
	return nil
}
