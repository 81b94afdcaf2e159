// Package pgharness_test is the Postgres adapter's conformance harness
// exactly as effectively's docs/writing-an-adapter.md prints it (from the
// package clause to the end of the file), compiled and run from outside
// the effectively module: proof that the public kits (postgres/pgtest) and
// the suite are all a team needs. Keep it identical to the guide.
package pgharness_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// TestMain stops the clusters pgtest started (pgtest.DedicatedDB's).
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestConformance holds the adapter to its declared contract in every
// scenario of the suite, and requires every field of the contract to be
// verified: the harness ages the dedup rows (the horizon), restarts and
// crashes its own cluster, lets a child process attach to the database,
// makes the server answer application errors (appFault), and the suite
// holds replies late (the adapter sets no deadline of its own, so it
// waits for them).
func TestConformance(t *testing.T) {
	opts := []conformance.EffectOption{conformance.WithSlowReply(300 * time.Millisecond), conformance.WithSuccessorProcess(attach)}
	if os.Getenv("DATABASE_URL") != "" {
		opts = append(opts, conformance.AllowUnverified("DATABASE_URL's server is not the test's to restart or crash",
			conformance.ScenarioRestart, conformance.ScenarioCrashRestart))
	}
	rep := conformance.Run(t, "postgres", newConfHarness, opts...)
	for _, f := range rep.Fields {
		if f.Status != conformance.Verified && f.Allowed == "" {
			t.Errorf("contract field %s", f)
		}
	}
}

// attach is the harness in a successor process: it connects to the test
// process's database (conformance.WithSuccessorProcess).
func attach(ctx context.Context, url string) (conformance.Harness[confCharge], error) {
	db, err := pgxpool.New(ctx, url)
	return &confHarness{url: url, db: db}, err
}

// Attachment is the database's URL (conformance.Attacher).
func (h *confHarness) Attachment() string { return h.url }

// confCharge is the suite's input: one ledger row per key.
type confCharge struct {
	EventID string
	Cents   int64
}

// confHarness keeps its own pool (db) to count effects in the backend.
type confHarness struct {
	url string
	db  *pgxpool.Pool
	af  *pgtest.AppFaults // nil in a successor process
}

func newConfHarness(t testing.TB) conformance.Harness[confCharge] {
	url, restart, crash := pgtest.DedicatedDB(t) // a fresh database per scenario, on a server the suite may restart
	db, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if err := postgres.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	// No unique index on event_id: only the adapter can keep duplicates out.
	if _, err := db.Exec(context.Background(), `CREATE TABLE conf_ledger (id bigserial PRIMARY KEY, event_id text NOT NULL, cents bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	af, err := pgtest.InstallAppFaults(context.Background(), db, "conf_ledger", "effectively_keys")
	if err != nil {
		t.Fatal(err)
	}
	h := &confHarness{url: url, db: db, af: af}
	if restart == nil {
		return h // DATABASE_URL is set: its server is not ours to restart
	}
	// The embedded RestartFunc's Restart method lets the backend-restart
	// scenario run, CrashRestartFunc's the crash-restart one (an immediate
	// stop, crash recovery on start); Reset then drops db's connections to
	// the stopped server.
	return struct {
		*confHarness
		pgtest.RestartFunc
		pgtest.CrashRestartFunc
	}{h, func(ctx context.Context) error { defer db.Reset(); return restart(ctx) },
		func(ctx context.Context) error { defer db.Reset(); return crash(ctx) }}
}

// Make builds a new adapter instance whose every connection goes through the suite's faults.
func (h *confHarness) Make(ctx context.Context, f *conformance.Faults) (effects.Effect[confCharge], func(), error) {
	cfg, err := pgxpool.ParseConfig(h.url)
	if err != nil {
		return nil, nil, err
	}
	cfg.ConnConfig.DialFunc = f.DialContext // an HTTP adapter uses &http.Client{Transport: f.Transport(nil)}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	if h.af != nil {
		f.SetAppFaulter(h.appFault)
	}
	eff, err := postgres.New(pool, "conformance", func(ctx context.Context, tx pgx.Tx, in confCharge) (id string, err error) {
		err = tx.QueryRow(ctx, `INSERT INTO conf_ledger (event_id, cents) VALUES ($1, $2) RETURNING id::text`, in.EventID, in.Cents).Scan(&id)
		return id, err
	})
	return eff, pool.Close, err
}

// Input embeds the key so that Count can find the effect; variant 1 changes the payload.
func (h *confHarness) Input(key effects.Key, variant int) confCharge {
	return confCharge{EventID: string(key), Cents: int64(1000 + variant)}
}

// AppFaultCodes are the SQLSTATEs appFault makes the server answer
// (conformance.AppFaultCodes).
func (h *confHarness) AppFaultCodes() []string {
	return []string{conformance.AppSerialization, conformance.AppDeadlock, conformance.AppLockTimeout}
}

// appFault makes the real server fail the Apply whose round trip is about
// to start (conformance.Faults.SetAppFaulter): 40001 at the COMMIT of a transaction
// that wrote, 40P01 and 55P03 at its next write. PostgreSQL rolls the
// transaction back either way and reports no ERROR for one it committed,
// so a fault after the request was applied is refused.
func (h *confHarness) appFault(e *conformance.AppError) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch {
	case e.Applied:
		return errors.New("PostgreSQL reports no ERROR for a transaction it committed")
	case e.Code == conformance.AppSerialization:
		return h.af.FailNextCommit(ctx, e.Code)
	}
	return h.af.FailNextWrite(ctx, e.Code)
}

// Count and Total read the backend itself, never the adapter's
// bookkeeping. Count first disarms a fault that did not fire (an Apply
// that wrote nothing), so that it fails no later Apply.
func (h *confHarness) Count(ctx context.Context, key effects.Key) (n int, err error) {
	if h.af != nil {
		if err := h.af.Disarm(ctx); err != nil {
			return 0, err
		}
	}
	err = h.db.QueryRow(ctx, `SELECT count(*) FROM conf_ledger WHERE event_id = $1`, string(key)).Scan(&n)
	return n, err
}

func (h *confHarness) Total(ctx context.Context) (n int, err error) {
	err = h.db.QueryRow(ctx, `SELECT count(*) FROM conf_ledger`).Scan(&n)
	return n, err
}

// CountBatch counts the ledger rows of many keys in one query
// (conformance.BatchCounter: the replay storm counts all of its keys).
func (h *confHarness) CountBatch(ctx context.Context, keys []effects.Key) ([]int, error) {
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = string(k)
	}
	rows, err := h.db.Query(ctx, `SELECT count(l.id) FROM unnest($1::text[]) WITH ORDINALITY AS k(id, i)
		LEFT JOIN conf_ledger l ON l.event_id = k.id GROUP BY k.i ORDER BY k.i`, ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// Age makes every dedup row d older (conformance.Ager: the horizon
// scenario redelivers "400 days later"). Pruning is not run: Horizon 0
// means the application decides when.
func (h *confHarness) Age(ctx context.Context, d time.Duration) error {
	return pgtest.Age(ctx, h.url, d)
}
