package postgres_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// TestConformance holds the adapter to its declared contract in every
// scenario of the suite, and requires every field of the contract to be
// verified (the harness can age the dedup rows, so the horizon is too;
// it restarts and crashes its own cluster, attaches a child process and
// holds replies late), key-capacity at full size on the default shape:
// every shape of Apply (New and NewPipelined, each by default, where the
// key's INSERT finds duplicates, and with WithLookupFirst), so that every
// round trip of every shape is faulted.
func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    confHarness
	}{
		{"postgres", confHarness{}},
		{"postgres (WithLookupFirst)", confHarness{lookupFirst: true}},
		{"postgres.NewPipelined", confHarness{pipelined: true}},
		{"postgres.NewPipelined (WithLookupFirst)", confHarness{pipelined: true, lookupFirst: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []conformance.EffectOption{conformance.WithSuccessorProcess(func(ctx context.Context, url string) (conformance.Harness[confCharge], error) {
				db, err := pgxpool.New(ctx, url) // the test process's database, from a child process
				return &confHarness{url: url, db: db, pipelined: tc.h.pipelined, lookupFirst: tc.h.lookupFirst}, err
			}), conformance.WithSlowReply(300 * time.Millisecond)} // the adapter sets no deadline of its own: it waits for the held reply
			var why, left []string
			if tc.name != "postgres" {
				// One dedup table for every shape: key-capacity runs at
				// full size on the first, smaller here to save CI time.
				opts = append(opts, conformance.WithCapacity(1000))
				why = append(why, "one dedup table (effectively_keys) for every shape: key-capacity runs at full size on the default shape")
				left = append(left, conformance.ScenarioKeyCapacity)
			}
			if os.Getenv("DATABASE_URL") != "" {
				why = append(why, "DATABASE_URL's server is not the test's to restart or crash")
				left = append(left, conformance.ScenarioRestart, conformance.ScenarioCrashRestart)
			}
			if len(why) > 0 {
				opts = append(opts, conformance.AllowUnverified(strings.Join(why, "; "), left...))
			}
			rep := conformance.Run(t, tc.name, func(t testing.TB) conformance.Harness[confCharge] { return newConfHarness(t, tc.h) }, opts...)
			for _, f := range rep.Fields {
				if f.Status != conformance.Verified && f.Allowed == "" {
					t.Errorf("contract field %s", f)
				}
			}
		})
	}
}

// confCharge is the suite's input: one ledger row per key.
type confCharge struct {
	EventID string
	Cents   int64
}

// confHarness keeps its own pool (db) to count effects in the backend.
type confHarness struct {
	url         string
	db          *pgxpool.Pool
	pipelined   bool                                                        // Make uses NewPipelined
	lookupFirst bool                                                        // with WithLookupFirst
	liar        func(effects.Effect[confCharge]) effects.Effect[confCharge] // wraps the adapter (TestConformanceCatchesAppFaultLiars)
	af          *pgtest.AppFaults                                           // makes the server answer the suite's application faults
	armed       *atomic.Bool                                                // an application fault was armed since Count last ran
}

// newConfHarness returns a harness like shape (its pipelined and
// lookupFirst) on a database of its own.
func newConfHarness(t testing.TB, shape confHarness) conformance.Harness[confCharge] {
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
	if _, err := db.Exec(context.Background(), `CREATE TABLE conf_ledger (id bigserial PRIMARY KEY, event_id text NOT NULL, cents bigint NOT NULL, entry text)`); err != nil {
		t.Fatal(err)
	}
	af, err := pgtest.InstallAppFaults(context.Background(), db, "conf_ledger", "effectively_keys")
	if err != nil {
		t.Fatal(err)
	}
	h := &confHarness{url: url, db: db, pipelined: shape.pipelined, lookupFirst: shape.lookupFirst, liar: shape.liar, af: af, armed: new(atomic.Bool)}
	if restart == nil {
		return h // DATABASE_URL is set: its server is not ours to restart
	}
	// The embedded RestartFunc's Restart method lets the backend-restart scenario
	// run, CrashRestartFunc's the crash-restart one (an immediate stop);
	// Reset then drops db's connections to the stopped server.
	return struct {
		*confHarness
		pgtest.RestartFunc
		pgtest.CrashRestartFunc
	}{h, func(ctx context.Context) error { defer db.Reset(); return restart(ctx) },
		func(ctx context.Context) error { defer db.Reset(); return crash(ctx) }}
}

// Attachment is the database's URL (conformance.Attacher): the
// successor-process scenario applies keys from a child process connected
// to it.
func (h *confHarness) Attachment() string { return h.url }

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
	var opts []postgres.EffectOption
	if h.lookupFirst {
		opts = append(opts, postgres.WithLookupFirst())
	}
	if h.pipelined {
		eff, err := postgres.NewPipelined(pool, "conformance", func(_ context.Context, _ effects.Key, in confCharge) (string, []postgres.Statement, error) {
			entry := rand.Text() // the ref, made before the write runs
			return entry, []postgres.Statement{{SQL: `INSERT INTO conf_ledger (event_id, cents, entry) VALUES ($1, $2, $3)`, Args: []any{in.EventID, in.Cents, entry}}}, nil
		}, opts...)
		return eff, pool.Close, err
	}
	if h.liar != nil {
		opts = append(opts, postgres.WithMaxRetries(0)) // the liar sees the server's error
	}
	eff, err := postgres.New(pool, "conformance", func(ctx context.Context, tx pgx.Tx, in confCharge) (id string, err error) {
		err = tx.QueryRow(ctx, `INSERT INTO conf_ledger (event_id, cents) VALUES ($1, $2) RETURNING id::text`, in.EventID, in.Cents).Scan(&id)
		return id, err
	}, opts...)
	if err != nil || h.liar == nil {
		return eff, pool.Close, err
	}
	return h.liar(eff), pool.Close, nil
}

// Input embeds the key so that Count can find the effect; variant 1 changes the payload.
func (h *confHarness) Input(key effects.Key, variant int) confCharge {
	return confCharge{EventID: string(key), Cents: int64(1000 + variant)}
}

// AppFaultCodes are the application errors appFault makes the server
// answer with (conformance.AppFaultCodes).
func (h *confHarness) AppFaultCodes() []string {
	return []string{conformance.AppSerialization, conformance.AppDeadlock, conformance.AppLockTimeout}
}

// appFault makes the real server answer the Apply whose round trip is
// about to start with e's SQLSTATE (conformance.Faults.SetAppFaulter), through the
// triggers pgtest.InstallAppFaults put on the ledger and the dedup table:
// a serialization failure (40001) at the next COMMIT of a transaction
// that wrote, as SERIALIZABLE reports one; a deadlock (40P01) or a lock
// timeout (55P03) at the next statement that writes. The server rolls
// the transaction back either way: PostgreSQL reports no ERROR for a
// transaction it committed, so a fault after the request was applied
// (e.Applied) is refused. The fault fires on a later round trip of the
// same Apply when the armed one writes nothing (BEGIN, a lookup); one
// that never fires (a duplicate that writes nothing) is disarmed by the
// next Count, so it cannot fail another Apply than the suite's retry.
func (h *confHarness) appFault(e *conformance.AppError) error {
	if e.Applied {
		return errors.New("PostgreSQL reports no ERROR for a transaction it committed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h.armed.Store(true)
	switch e.Code {
	case conformance.AppSerialization:
		return h.af.FailNextCommit(ctx, e.Code)
	case conformance.AppDeadlock, conformance.AppLockTimeout:
		return h.af.FailNextWrite(ctx, e.Code)
	}
	return fmt.Errorf("PostgreSQL answers SQLSTATEs, not %q", e.Code)
}

// Count and Total read the backend itself, never the adapter's
// bookkeeping. Count first disarms an application fault that has not
// fired (see appFault).
func (h *confHarness) Count(ctx context.Context, key effects.Key) (n int, err error) {
	if h.af != nil && h.armed.Swap(false) {
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

// TestConformanceCatchesAppFaultLiars: app-faults, with the real server
// answering 40001, 40P01 and 55P03, catches a client that misreads them:
// one that calls a lost race a permanent failure (a consumer dead-letters
// a message it could have applied), one that takes a serialization
// failure for a concurrent duplicate that won and reports a replay of an
// effect that never happened.
func TestConformanceCatchesAppFaultLiars(t *testing.T) {
	for _, tc := range []struct {
		name string
		lie  func(effects.Result, error) (effects.Result, error)
	}{
		{"race-lost-permanent", func(res effects.Result, err error) (effects.Result, error) {
			if sqlstate(err) != "" {
				return res, fmt.Errorf("postgres: the transaction failed: %v", err) // %v: ErrTransient is lost
			}
			return res, err
		}},
		{"serialization-failure-replayed", func(res effects.Result, err error) (effects.Result, error) {
			if sqlstate(err) == conformance.AppSerialization {
				return effects.Result{Status: effects.Replayed}, nil // "a concurrent duplicate won"
			}
			return res, err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shape := confHarness{liar: func(e effects.Effect[confCharge]) effects.Effect[confCharge] { return lyingEffect{e, tc.lie} }}
			rep := conformance.Run(t, "postgres/"+tc.name, func(t testing.TB) conformance.Harness[confCharge] { return newConfHarness(t, shape) },
				conformance.Only(conformance.ScenarioAppFaults), conformance.WithMaxSweep(2), conformance.ReportOnly()) // the first two round trips show either lie
			row, _ := rep.Row(conformance.ScenarioAppFaults)
			if row.Verdict != conformance.Fail {
				t.Fatalf("app-faults: %s, want FAIL (notes %v)", row.Verdict, row.Notes)
			}
			t.Logf("caught: %s", row.Failures[0])
		})
	}
}

// sqlstate returns the SQLSTATE of a lost race in err (40001, 40P01,
// 55P03), or "".
func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01", "55P03":
			return pgErr.Code
		}
	}
	return ""
}

// lyingEffect is the adapter with its outcome rewritten by lie.
type lyingEffect struct {
	effects.Effect[confCharge]
	lie func(effects.Result, error) (effects.Result, error)
}

func (e lyingEffect) Apply(ctx context.Context, key effects.Key, in confCharge) (effects.Result, error) {
	return e.lie(e.Effect.Apply(ctx, key, in))
}
