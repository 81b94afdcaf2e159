package mysql_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/mysql"
	"effectively.dev/mysql/mysqltest"
)

// TestConformance holds the adapter to its declared contract in every
// scenario of the suite, through conformance.Faults.SQLConnector over
// go-sql-driver/mysql (every driver call a faulted round trip), and
// requires every field of the contract to be verified: a crash restart by
// SIGKILL of mysqld, a successor process, slow replies and key capacity at
// full size included.
func TestConformance(t *testing.T) {
	opts := []conformance.EffectOption{
		conformance.WithSlowReply(300 * time.Millisecond), // the adapter sets no deadline of its own: it waits for the held reply
		conformance.WithSuccessorProcess(func(ctx context.Context, dsn string) (conformance.Harness[confCharge], error) {
			db, err := sql.Open("mysql", dsn) // the test process's database, from a child process
			return &confHarness{dsn: dsn, db: db}, err
		}),
	}
	external := os.Getenv("MYSQL_DSN") != ""
	if external {
		opts = append(opts, conformance.AllowUnverified("MYSQL_DSN's server is not the test's to restart or crash",
			conformance.ScenarioRestart, conformance.ScenarioCrashRestart))
	}
	rep := conformance.Run(t, "mysql", func(t testing.TB) conformance.Harness[confCharge] {
		return newConfHarness(t, "")
	}, opts...)
	for _, f := range rep.Fields {
		if f.Status != conformance.Verified && !(external && f.Allowed != "") {
			t.Errorf("contract field %s", f)
		}
	}
}

// confCharge is the suite's input: one ledger row per key.
type confCharge struct {
	EventID string
	Cents   int64
}

// confHarness keeps its own *sql.DB (db), outside the faults, to count
// effects in the backend.
type confHarness struct {
	dsn string
	db  *sql.DB
}

// newConfHarness returns a harness on a database of its own, on the
// top-level test's own server, which the suite may restart and crash.
// alter, when not empty, is run after Migrate (ALTER TABLE
// effectively_keys alter): a counterexample's schema.
func newConfHarness(t testing.TB, alter string) conformance.Harness[confCharge] {
	dsn, restart, crash := mysqltest.DedicatedDB(t)
	db := openPlain(t, dsn)
	ctx := testCtx(t)
	if err := mysql.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if alter != "" {
		if _, err := db.ExecContext(ctx, "ALTER TABLE effectively_keys "+alter); err != nil {
			t.Fatal(err)
		}
	}
	// No unique index on event_id: only the adapter can keep duplicates
	// out. VARBINARY, so that Count tells keys apart byte by byte.
	if _, err := db.ExecContext(ctx, `CREATE TABLE conf_ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY,
		event_id VARBINARY(255) NOT NULL, cents BIGINT NOT NULL, KEY (event_id)) ENGINE=InnoDB`); err != nil {
		t.Fatal(err)
	}
	h := &confHarness{dsn: dsn, db: db}
	if restart == nil {
		return h // MYSQL_DSN is set: its server is not ours to restart
	}
	return struct {
		*confHarness
		mysqltest.RestartFunc
		mysqltest.CrashRestartFunc
	}{h, restart, crash}
}

// Attachment is the database's DSN (conformance.Attacher): the
// successor-process scenario applies keys from a child process connected
// to it.
func (h *confHarness) Attachment() string { return h.dsn }

// Make builds a new adapter instance whose every driver call goes through
// the suite's faults (conformance.Faults.SQLConnector).
func (h *confHarness) Make(ctx context.Context, f *conformance.Faults) (effects.Effect[confCharge], func(), error) {
	db, err := faultedDB(h.dsn, f)
	if err != nil {
		return nil, nil, err
	}
	eff, err := mysql.New(db, "conformance", func(ctx context.Context, tx *sql.Tx, in confCharge) (string, error) {
		res, err := tx.ExecContext(ctx, `INSERT INTO conf_ledger (event_id, cents) VALUES (?, ?)`, []byte(in.EventID), in.Cents)
		if err != nil {
			return "", err
		}
		id, err := res.LastInsertId()
		return "conf_ledger:" + itoa(id), err
	})
	return eff, func() { db.Close() }, err
}

// faultedDB opens dsn with every driver call through f
// (conformance.Faults.SQLConnector over go-sql-driver/mysql's connector).
func faultedDB(dsn string, f *conformance.Faults) (*sql.DB, error) {
	cfg, err := driver.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	base, err := driver.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(f.SQLConnector(base)), nil
}

// Input embeds the key so that Count can find the effect; variant 1
// changes the payload.
func (h *confHarness) Input(key effects.Key, variant int) confCharge {
	return confCharge{EventID: string(key), Cents: int64(1000 + variant)}
}

// Count and Total read the backend itself, never the adapter's bookkeeping.
func (h *confHarness) Count(ctx context.Context, key effects.Key) (n int, err error) {
	err = h.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM conf_ledger WHERE event_id = ?`, []byte(key)).Scan(&n)
	return n, err
}

func (h *confHarness) Total(ctx context.Context) (n int, err error) {
	err = h.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM conf_ledger`).Scan(&n)
	return n, err
}

// CountBatch counts the ledger rows of many keys in one query
// (conformance.BatchCounter: the replay storm counts all of its keys).
func (h *confHarness) CountBatch(ctx context.Context, keys []effects.Key) ([]int, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = []byte(k)
	}
	rows, err := h.db.QueryContext(ctx, `SELECT event_id, COUNT(*) FROM conf_ledger WHERE event_id IN (?`+
		strings.Repeat(", ?", len(keys)-1)+`) GROUP BY event_id`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	counts := make(map[string]int, len(keys))
	for rows.Next() {
		var id []byte
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		counts[string(id)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]int, len(keys))
	for i, k := range keys {
		out[i] = counts[string(k)]
	}
	return out, nil
}

// Age makes every dedup row d older (conformance.Ager: the horizon
// scenario redelivers "400 days later"). Pruning is not run: Horizon 0
// means the application decides when.
func (h *confHarness) Age(ctx context.Context, d time.Duration) error {
	return mysqltest.Age(ctx, h.dsn, d)
}
