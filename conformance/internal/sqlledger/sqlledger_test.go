// Package sqlledger_test holds the conformance suite to
// [conformance.Faults.SQLConnector]: a small database/sql adapter (a ledger entry
// and its dedup row in one transaction), faulted at every driver call
// (BEGIN, each statement, COMMIT, ROLLBACK), with no fake wire, is fully
// verified; the same adapter with a classic mistake is caught.
package sqlledger_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// Entry is the ledger's input.
type Entry struct{ Payload string }

// Ledger writes an entry and its key's dedup row in one transaction of a
// *sql.DB: effectively once.
type Ledger struct {
	db *sql.DB
	// commitTransient is the mistake of reporting a failed COMMIT as
	// ErrTransient (nothing applied), when the COMMIT may have been applied.
	commitTransient bool
}

const schema = `
CREATE TABLE dedup (key text PRIMARY KEY, fp text NOT NULL, ref text NOT NULL, created timestamptz NOT NULL DEFAULT now());
CREATE TABLE entries (id bigserial PRIMARY KEY, key text NOT NULL, payload text NOT NULL);`

// Contract: the dedup row commits with the entry.
func (l *Ledger) Contract() effects.Contract {
	return effects.Contract{
		Guarantee:       effects.EffectivelyOnce,
		Enforcer:        "dedup row committed with the entry (database/sql)",
		DetectsKeyReuse: true,
	}
}

// Apply writes in under key once. Every error before COMMIT left nothing
// applied (the transaction rolls back, or its connection is gone): it is
// transient. A failed COMMIT is an unknown outcome.
func (l *Ledger) Apply(ctx context.Context, key effects.Key, in Entry) (effects.Result, error) {
	const op = "Ledger.Apply"
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return effects.Result{}, effects.Transient(op, key, err)
	}
	defer tx.Rollback()
	var b [8]byte
	_, _ = rand.Read(b[:])
	ref := hex.EncodeToString(b[:])
	var got string
	err = tx.QueryRowContext(ctx, `INSERT INTO dedup (key, fp, ref) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING RETURNING ref`,
		string(key), in.Payload, ref).Scan(&got)
	switch {
	case errors.Is(err, sql.ErrNoRows): // recorded before: replay it
		var fp string
		if err := tx.QueryRowContext(ctx, `SELECT fp, ref FROM dedup WHERE key = $1`, string(key)).Scan(&fp, &got); err != nil {
			return effects.Result{}, effects.Transient(op, key, err)
		}
		if fp != in.Payload {
			return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Op: op, Key: key}
		}
		return effects.Result{Status: effects.Replayed, Ref: got}, nil
	case err != nil:
		return effects.Result{}, effects.Transient(op, key, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO entries (key, payload) VALUES ($1, $2)`, string(key), in.Payload); err != nil {
		return effects.Result{}, effects.Transient(op, key, err)
	}
	if err := tx.Commit(); err != nil {
		if l.commitTransient {
			return effects.Result{}, effects.Transient(op, key, err)
		}
		return effects.Result{}, effects.Ambiguous(op, key, err)
	}
	return effects.Result{Status: effects.Applied, Ref: ref}, nil
}

// harness opens each instance's *sql.DB through conformance.Faults.SQLConnector;
// counts come from a connection of its own, outside the faults.
type harness struct {
	cfg     *pgx.ConnConfig
	count   *sql.DB
	restart pgtest.RestartFunc
	buggy   bool
}

func newHarness(t testing.TB, buggy bool) *harness {
	url, restart, _ := pgtest.DedicatedDB(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(schema); err != nil {
		t.Fatal(err)
	}
	return &harness{cfg: cfg, count: db, restart: restart, buggy: buggy}
}

func (h *harness) Make(_ context.Context, f *conformance.Faults) (effects.Effect[Entry], func(), error) {
	db := sql.OpenDB(f.SQLConnector(stdlib.GetConnector(*h.cfg)))
	return &Ledger{db: db, commitTransient: h.buggy}, func() { db.Close() }, nil
}

func (h *harness) Input(key effects.Key, variant int) Entry {
	return Entry{Payload: fmt.Sprintf("%s/%d", key, variant)}
}

func (h *harness) Count(ctx context.Context, key effects.Key) (int, error) {
	var n int
	err := h.count.QueryRowContext(ctx, `SELECT count(*) FROM entries WHERE key = $1`, string(key)).Scan(&n)
	return n, err
}

func (h *harness) Total(ctx context.Context) (int, error) {
	var n int
	err := h.count.QueryRowContext(ctx, `SELECT count(*) FROM entries`).Scan(&n)
	return n, err
}

func (h *harness) CountBatch(ctx context.Context, keys []effects.Key) ([]int, error) {
	ks := make([]string, len(keys))
	for i, k := range keys {
		ks[i] = string(k)
	}
	rows, err := h.count.QueryContext(ctx, `SELECT k, (SELECT count(*) FROM entries e WHERE e.key = k) FROM unnest($1::text[]) AS k`, ks)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	byKey := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			return nil, err
		}
		byKey[k] = n
	}
	out := make([]int, len(keys))
	for i, k := range ks {
		out[i] = byKey[k]
	}
	return out, rows.Err()
}

// Age moves every dedup row back by d: the ledger keeps keys until
// pruned, whatever their age.
func (h *harness) Age(ctx context.Context, d time.Duration) error {
	_, err := h.count.ExecContext(ctx, `UPDATE dedup SET created = created - $1::interval`, fmt.Sprintf("%d microseconds", d.Microseconds()))
	return err
}

// Restart restarts the cluster. The counting pool drops its idle
// connections first, which the restart would end under it.
func (h *harness) Restart(ctx context.Context) error {
	h.count.SetMaxIdleConns(0)
	defer h.count.SetMaxIdleConns(2)
	return h.restart(ctx)
}

// TestSQLConnectorConformance: every driver call of the adapter's *sql.DB
// is a swept round trip, so the suite verifies every field of the
// contract with no wire of the harness's own.
func TestSQLConnectorConformance(t *testing.T) {
	t.Setenv("CONFORMANCE_REPORT", "") // a test adapter, not a product
	rep := conformance.Run(t, "sqlledger", func(t testing.TB) conformance.Harness[Entry] { return newHarness(t, false) },
		conformance.WithLateRedelivery(time.Second), conformance.WithSlowReply(300*time.Millisecond),
		conformance.AllowUnverified("a test adapter for SQLConnector's sweeps on the shared cluster: the postgres adapter's harness crashes "+
			"its own cluster and attaches a child process", conformance.ScenarioCrashRestart, conformance.ScenarioProcess))
	for _, f := range rep.Fields {
		if f.Status != conformance.Verified && f.Allowed == "" {
			t.Errorf("field %s", f)
		}
	}
	for _, s := range []string{conformance.ScenarioLostReply, conformance.ScenarioCut, conformance.ScenarioCancel} {
		row, _ := rep.Row(s)
		if !slices.ContainsFunc(row.Notes, func(n string) bool { return strings.Contains(n, "round trips of a clean Apply") }) {
			t.Errorf("%s: notes %v, want the sweep over the driver calls", s, row.Notes)
		}
	}
}

// TestSQLConnectorCatchesTransientCommit: a failed COMMIT reported as
// ErrTransient is caught where the COMMIT's reply is lost.
func TestSQLConnectorCatchesTransientCommit(t *testing.T) {
	t.Setenv("CONFORMANCE_REPORT", "")
	rep := conformance.Run(t, "sqlledger: failed COMMIT as ErrTransient",
		func(t testing.TB) conformance.Harness[Entry] { return newHarness(t, true) },
		conformance.Only(conformance.ScenarioLostReply), conformance.ReportOnly())
	row, _ := rep.Row(conformance.ScenarioLostReply)
	if row.Verdict != conformance.Fail || !strings.Contains(strings.Join(row.Failures, "\n"), "promises that nothing was applied") {
		t.Errorf("lost-reply: %s %v, want FAIL for an ErrTransient whose COMMIT landed", row.Verdict, row.Failures)
	}
}
