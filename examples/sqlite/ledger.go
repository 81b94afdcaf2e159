// Package sqlite is an effectively-once adapter on an embedded SQLite
// database, written as a team outside effectively would write one: a
// ledger entry and its key's record are written in one SQLite
// transaction, so the entry commits exactly once per key. It is the
// worked example of an adapter over database/sql and a file database;
// README.md explains the recipe, and its conformance harness
// (conformance_test.go) faults every driver call through
// conformance.Faults.SQLConnector and crashes the database by copying its files.
//
// The adapter takes any *sql.DB; it uses no driver API. The harness opens
// the database with modernc.org/sqlite (pure Go).
package sqlite

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"effectively.dev/effects"
)

// Schema creates the adapter's key table and the ledger the effect writes.
// effectively_keys holds one row per applied key: the payload's
// fingerprint (key reuse) and when it was written (for an application's
// pruning). entries is the application's own table: it has no unique
// index, so a duplicate would show.
const Schema = `
CREATE TABLE IF NOT EXISTS effectively_keys (
	id          INTEGER PRIMARY KEY,
	key         BLOB NOT NULL UNIQUE,
	fingerprint BLOB NOT NULL,
	created_at  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS entries (
	id      INTEGER PRIMARY KEY,
	key     BLOB NOT NULL,
	account TEXT NOT NULL,
	amount  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_key ON entries (key);`

// Entry is the input of one Apply: a ledger entry.
type Entry struct {
	Account string
	Amount  int64
}

// Option configures [New].
type Option func(*Ledger)

// WithTimeout gives every Apply a deadline of its own, d (default: none,
// the caller's context only). Running out of it before COMMIT applied
// nothing (the transaction rolls back); a COMMIT that fails is an unknown
// outcome, whatever the cause.
func WithTimeout(d time.Duration) Option { return func(l *Ledger) { l.timeout = d } }

// Ledger is the effect: it implements effects.Effect[Entry] and
// effects.Checker.
type Ledger struct {
	db      *sql.DB
	timeout time.Duration
}

var (
	_ effects.Effect[Entry] = (*Ledger)(nil)
	_ effects.Checker       = (*Ledger)(nil)
)

// New returns a Ledger over db, which must hold [Schema]. Open db with
// transactions that take the write lock at BEGIN (modernc.org/sqlite's
// _txlock=immediate), a busy timeout, and synchronous=FULL; [Ledger.Check]
// verifies what it can. A nil db or a negative timeout is a
// *effects.ConfigError.
func New(db *sql.DB, opts ...Option) (*Ledger, error) {
	if db == nil {
		return nil, &effects.ConfigError{Op: "sqlite.New", Option: "db", Reason: "is nil"}
	}
	l := &Ledger{db: db}
	for _, o := range opts {
		o(l)
	}
	if l.timeout < 0 {
		return nil, &effects.ConfigError{Op: "sqlite.New", Option: "WithTimeout", Reason: fmt.Sprintf("%v: must not be negative", l.timeout)}
	}
	return l, nil
}

// Contract: the key's row commits with the entry, and is kept until the
// application prunes it.
func (l *Ledger) Contract() effects.Contract {
	return effects.Contract{
		Guarantee:       effects.EffectivelyOnce,
		Enforcer:        "sqlite: key row committed with the entry (effectively_keys)",
		DetectsKeyReuse: true,
	}
}

// Apply writes in under key once: BEGIN, claim the key (or read its row:
// a replay, or a reuse with another payload), insert the entry, COMMIT.
// Every error before COMMIT left nothing applied, because SQLite commits
// nothing of an unfinished transaction: it is transient. A failed COMMIT
// is an unknown outcome (ErrAmbiguous): retry the key.
func (l *Ledger) Apply(ctx context.Context, key effects.Key, in Entry) (effects.Result, error) {
	const op = "sqlite.Apply"
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return effects.Result{}, effects.Transient(op, key, err)
	}
	defer tx.Rollback()
	fp := fingerprint(in)
	var id int64
	err = tx.QueryRowContext(ctx,
		`INSERT INTO effectively_keys (key, fingerprint, created_at) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING RETURNING id`,
		[]byte(key), fp, time.Now().UnixNano()).Scan(&id)
	switch {
	case errors.Is(err, sql.ErrNoRows): // the key has a row: replay it
		var first []byte
		if err := tx.QueryRowContext(ctx, `SELECT id, fingerprint FROM effectively_keys WHERE key = ?`, []byte(key)).Scan(&id, &first); err != nil {
			return effects.Result{}, effects.Transient(op, key, err)
		}
		if string(first) != string(fp) {
			return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Op: op, Key: key}
		}
		return effects.Result{Status: effects.Replayed, Ref: strconv.FormatInt(id, 10)}, nil
	case err != nil:
		return effects.Result{}, effects.Transient(op, key, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO entries (key, account, amount) VALUES (?, ?, ?)`, []byte(key), in.Account, in.Amount); err != nil {
		return effects.Result{}, effects.Transient(op, key, err)
	}
	if err := tx.Commit(); err != nil {
		return effects.Result{}, effects.Ambiguous(op, key, err)
	}
	return effects.Result{Status: effects.Applied, Ref: strconv.FormatInt(id, 10)}, nil
}

// fingerprint identifies a payload: a key applied with another one is
// reused.
func fingerprint(in Entry) []byte {
	h := sha256.New()
	h.Write(binary.AppendUvarint(nil, uint64(len(in.Account))))
	h.Write([]byte(in.Account))
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(in.Amount)))
	return h.Sum(nil)
}

// Check verifies, changing nothing, that the schema is there and that the
// connection's durability settings keep an acknowledged commit: a
// synchronous level below FULL (a commit acknowledged before it reached
// the disk) or a journal_mode of OFF or MEMORY (no atomic commit through a
// crash) is a *effects.ConfigError naming the setting. A database that
// cannot be reached is a retryable error.
func (l *Ledger) Check(ctx context.Context) error {
	const op = "sqlite.Check"
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return effects.Transient(op, "", err)
	}
	defer conn.Close()
	var sync int
	if err := conn.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&sync); err != nil {
		return effects.Transient(op, "", err)
	}
	if sync < 2 {
		return &effects.ConfigError{Op: op, Option: "PRAGMA synchronous",
			Reason: fmt.Sprintf("is %d: a commit may be acknowledged before it is on disk; set synchronous=FULL", sync)}
	}
	var mode string
	if err := conn.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return effects.Transient(op, "", err)
	}
	if m := strings.ToLower(mode); m == "off" || m == "memory" {
		return &effects.ConfigError{Op: op, Option: "PRAGMA journal_mode",
			Reason: "is " + m + ": a crash during a commit can leave it half applied; use WAL"}
	}
	for _, table := range []string{"effectively_keys", "entries"} {
		var n int
		err := conn.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?`, table).Scan(&n)
		if err != nil {
			return effects.Transient(op, "", err)
		}
		if n == 0 {
			return &effects.ConfigError{Op: op, Option: "table " + table, Reason: "is missing: run sqlite.Schema"}
		}
	}
	return nil
}
