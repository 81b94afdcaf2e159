package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// TestApplyWriteCommitsAsSQLOnADuplicate: a write that commits through
// tx.Conn() on a duplicate fails the attempt, as it
// does on a new key; it is not reported as a replay.
func TestApplyWriteCommitsAsSQLOnADuplicate(t *testing.T) {
	url := newDB(t)
	pool := newPool(t, url, nil)
	ctx := testCtx(t)
	fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		_, err := tx.Conn().Exec(ctx, "INSERT INTO ledger (event_id, amount) VALUES ('"+p.EventID+"', 1); COMMIT")
		return "x", err
	})
	if err != nil {
		t.Fatal(err)
	}
	key := effects.MustKey("evt_conn", "ledger")
	mustExec(t, pool, `INSERT INTO effectively_keys (scope, key, fingerprint, ref) VALUES ('billing', $1, $2, 'old')`, string(key), mustFP(t, payment{EventID: "evt_conn", Amount: 1}))
	res, err := fx.Apply(ctx, key, payment{EventID: "evt_conn", Amount: 1})
	t.Logf("Apply: %+v, %v; ledger rows %d", res, err, count(t, pool, `SELECT count(*) FROM ledger`))
	if err == nil || effects.ClassOf(err) == effects.Retryable {
		t.Fatalf("Apply of a write that committed with SQL on a duplicate = %+v, %v; want a permanent error, not a replay", res, err)
	}
}

func mustFP(t *testing.T, p payment) []byte {
	fp, err := effects.FingerprintJSON(p)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}
