package mysql

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
)

// Journal is a [journal.DoneJournal] in the effectively_journal table: the
// sent-record for effects outside the database (an email, a message to a
// broker without transactions, a call to an API past its key horizon), so
// that the stripe, httpkey, email and kafka adapters can keep their
// records in MySQL. Begin and MarkDone are an INSERT ... ON DUPLICATE KEY
// UPDATE and a read of the record; Complete and Release one UPDATE (and a
// read when Complete updated nothing); Lookup one SELECT. Each is an
// autocommit statement. It is safe for concurrent use.
//
// A journal does not make an outside effect effectively once: a crash
// between the effect and Complete leaves the record pending, and once the
// lease expires the next attempt (Record.Attempt > 1) repeats the effect.
// Adapters that use it declare AtLeastOnce with that window.
//
// A Begin whose reply was lost ([effects.ErrAmbiguous]) may have taken the
// lease: the key is then in flight ([effects.ErrInFlight]) for every
// caller until the lease expires.
type Journal struct {
	db    *sql.DB
	scope string
	cfg   durability
}

var _ journal.DoneJournal = (*Journal)(nil)

// NewJournal returns a Journal for keys in scope over db, a *sql.DB of
// github.com/go-sql-driver/mysql. The table must exist: see [Migrate].
// It does no I/O. It returns an [*effects.ConfigError] if db is nil, scope
// is invalid (see [New]). Its options are for [Journal.Check].
func NewJournal(db *sql.DB, scope string, opts ...Option) (*Journal, error) {
	const op = "mysql.NewJournal"
	if db == nil {
		return nil, effects.ConfigErrorf(op, "db", "nil")
	}
	if err := validateScope(op, scope); err != nil {
		return nil, err
	}
	return &Journal{db: db, scope: scope, cfg: newDurability(opts)}, nil
}

const (
	opBegin    = "mysql.Journal.Begin"
	opComplete = "mysql.Journal.Complete"
	opLookup   = "mysql.Journal.Lookup"
	opMarkDone = "mysql.Journal.MarkDone"
	opRelease  = "mysql.Journal.Release"
)

// beginTries bounds Begin's and MarkDone's retries when the record changes
// between their statement and the read that follows (a lease expiring, a
// record pruned).
const beginTries = 3

// Begin claims key for one attempt lasting at most lease (at least 1 µs),
// measured by the database's clock. See [journal.Journal]: it returns a
// done Record, [effects.ErrInFlight] (whose [effects.RetryAfter] is what
// is left of the holder's lease), [effects.ErrKeyReused], or a Record
// whose lease the caller now holds, with Attempt 1 for a new key and one
// more for each takeover of an expired or released lease. A failure whose
// reply was lost is [effects.ErrAmbiguous]: the lease may have been taken,
// and the caller must not do the effect.
func (j *Journal) Begin(ctx context.Context, key effects.Key, fingerprint []byte, lease time.Duration) (journal.Record, error) {
	if err := key.Validate(); err != nil {
		return journal.Record{}, err
	}
	if lease <= 0 {
		return journal.Record{}, fmt.Errorf("%s key %q: lease %v is not positive", opBegin, key, lease)
	}
	fp := nonNil(fingerprint)
	for range beginTries {
		token := newLeaseToken()
		if _, err := j.db.ExecContext(ctx, beginSQL, []byte(j.scope), []byte(key), fp, []byte(token), max(lease.Microseconds(), 1)); err != nil {
			return journal.Record{}, classify(ctx, opBegin, key, err, true, false).err
		}
		row, found, err := j.readRow(ctx, key)
		switch {
		case err != nil:
			// The statement committed: if it took the lease, nobody can
			// use it now, as after a lost reply.
			return journal.Record{}, effects.Ambiguous(opBegin, key, err)
		case !found:
			continue // pruned in between: begin again
		case !row.done && row.ref == token:
			return journal.Record{Attempt: row.attempt}, nil
		}
		if rec, err, again := row.verdict(key, fp); !again {
			return rec, err
		}
		// The lease expired between the two statements: begin again.
	}
	return journal.Record{}, &effects.Error{Kind: effects.ErrInFlight, Op: opBegin, Key: key,
		Err: errors.New("the record kept changing under concurrent attempts")}
}

// newLeaseToken returns a lease's holder token: 64 random bits in hex,
// which tell the Begin that took a lease from every other.
func newLeaseToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return hex.EncodeToString(b[:])
}

// journalRow is a record as journalLookupSQL reads it.
type journalRow struct {
	fp      []byte
	done    bool
	ref     string
	attempt int
	// leftMicros is what is left of its lease: positive while it is live.
	leftMicros int64
}

// verdict explains why a Begin took nothing: the key is done, in flight,
// begun with another fingerprint, or its lease expired since (again:
// begin once more).
func (row journalRow) verdict(key effects.Key, fp []byte) (rec journal.Record, err error, again bool) {
	switch {
	case !bytes.Equal(row.fp, fp):
		return journal.Record{}, reused(opBegin, key), false
	case row.done:
		return journal.Record{Done: true, Ref: row.ref, Attempt: row.attempt}, nil, false
	case row.leftMicros > 0:
		return journal.Record{}, &effects.Error{Kind: effects.ErrInFlight, Op: opBegin, Key: key,
			RetryAfter: time.Duration(row.leftMicros) * time.Microsecond,
			Err:        fmt.Errorf("attempt %d holds the lease", row.attempt)}, false
	}
	return journal.Record{}, nil, true
}

// readRow reads key's record; found is false when there is none.
func (j *Journal) readRow(ctx context.Context, key effects.Key) (row journalRow, found bool, err error) {
	var ref []byte
	err = j.db.QueryRowContext(ctx, journalLookupSQL, []byte(j.scope), []byte(key)).
		Scan(&row.fp, &row.done, &ref, &row.attempt, &row.leftMicros)
	if errors.Is(err, sql.ErrNoRows) {
		return row, false, nil
	}
	row.ref = string(ref)
	return row, err == nil, err
}

// Complete marks key done with ref, the backend's reference to the effect,
// and drops the lease. Completing a done key again succeeds and keeps the
// first reference. It fails if key was never begun. A lost reply is
// [effects.ErrAmbiguous]; Complete is idempotent, so retry it.
func (j *Journal) Complete(ctx context.Context, key effects.Key, ref string) error {
	if err := key.Validate(); err != nil {
		return err
	}
	res, err := j.db.ExecContext(ctx, completeSQL, []byte(ref), []byte(j.scope), []byte(key))
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		return classify(ctx, opComplete, key, err, true, false).err
	}
	if n == 1 {
		return nil
	}
	var done bool
	switch err := j.db.QueryRowContext(ctx, journalDoneSQL, []byte(j.scope), []byte(key)).Scan(&done); {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%s key %q: not begun in scope %q", opComplete, key, j.scope)
	case err != nil:
		return classify(ctx, opComplete, key, err, false, false).err
	case !done:
		return effects.Transient(opComplete, key, errors.New("record changed concurrently"))
	}
	return nil
}

// Release drops attempt's lease on key if it is not done, so the next Begin
// takes over at once (with Attempt one higher) instead of waiting for the
// lease to expire. Call it only after a failure that definitely did not do
// the effect. Releasing a done or unknown key, or with an attempt that is
// not the latest (its lease expired and another attempt took over),
// does nothing.
func (j *Journal) Release(ctx context.Context, key effects.Key, attempt int) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if _, err := j.db.ExecContext(ctx, releaseSQL, []byte(j.scope), []byte(key), attempt); err != nil {
		return classify(ctx, opRelease, key, err, true, false).err
	}
	return nil
}

// Lookup reads key without writing: a done Record with its first ref, a
// zero Record when key is unknown or pending (begun, not done), or
// [effects.ErrKeyReused] when key was recorded with another fingerprint.
// One SELECT. See [journal.DoneJournal].
func (j *Journal) Lookup(ctx context.Context, key effects.Key, fingerprint []byte) (journal.Record, error) {
	if err := key.Validate(); err != nil {
		return journal.Record{}, err
	}
	row, found, err := j.readRow(ctx, key)
	switch {
	case err != nil:
		return journal.Record{}, classify(ctx, opLookup, key, err, false, false).err
	case !found:
		return journal.Record{}, nil
	case !bytes.Equal(row.fp, nonNil(fingerprint)):
		return journal.Record{}, reused(opLookup, key)
	case row.done:
		return journal.Record{Done: true, Ref: row.ref, Attempt: row.attempt}, nil
	}
	return journal.Record{}, nil
}

// MarkDone records key done with ref in one statement, whether or not it
// was begun: a new record is created with fingerprint, a pending one is
// completed and its lease dropped. A key already done keeps its first ref
// and MarkDone returns nil; a key recorded with another fingerprint is
// [effects.ErrKeyReused] and stays as it was. A lost reply is
// [effects.ErrAmbiguous]; MarkDone is idempotent, so retry it. See
// [journal.DoneJournal].
func (j *Journal) MarkDone(ctx context.Context, key effects.Key, fingerprint []byte, ref string) error {
	if err := key.Validate(); err != nil {
		return err
	}
	fp := nonNil(fingerprint)
	for range beginTries {
		if _, err := j.db.ExecContext(ctx, markDoneSQL, []byte(j.scope), []byte(key), fp, []byte(ref)); err != nil {
			return classify(ctx, opMarkDone, key, err, true, false).err
		}
		row, found, err := j.readRow(ctx, key)
		switch {
		case err != nil:
			return effects.Ambiguous(opMarkDone, key, err)
		case !found:
			continue // pruned in between: insert it again
		case !bytes.Equal(row.fp, fp):
			return reused(opMarkDone, key)
		case row.done:
			return nil
		}
	}
	return effects.Transient(opMarkDone, key, errors.New("the record kept changing under concurrent calls"))
}
