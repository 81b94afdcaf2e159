package postgres_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// inTx runs f in a transaction on pool and commits if f returns nil.
func inTx(t testing.TB, pool *pgxpool.Pool, f func(tx pgx.Tx) error) error {
	t.Helper()
	ctx := testCtx(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func TestClaim(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	fp := effects.Fingerprint([]byte("payload"))

	// handle is a caller-owned transaction: claim, write, set ref, commit.
	handle := func(key effects.Key, event string, fp []byte) (effects.Result, error) {
		var res effects.Result
		err := inTx(t, pool, func(tx pgx.Tx) error {
			ctx := testCtx(t)
			var err error
			if res, err = postgres.Claim(ctx, tx, "billing", key, fp); err != nil || res.Replayed() {
				return err
			}
			ref, err := writeLedger(ctx, tx, payment{EventID: event})
			if err != nil {
				return err
			}
			res.Ref = ref
			return postgres.SetRef(ctx, tx, "billing", key, ref)
		})
		return res, err
	}

	t.Run("new key is claimed, redelivery replays the stored ref", func(t *testing.T) {
		key := effects.MustKey("evt_claim", "ledger")
		first, err := handle(key, "evt_claim", fp)
		if err != nil || first.Status != effects.Applied {
			t.Fatalf("first = %+v, %v; want applied", first, err)
		}
		again, err := handle(key, "evt_claim", fp)
		if err != nil || again != (effects.Result{Status: effects.Replayed, Ref: first.Ref}) {
			t.Fatalf("again = %+v, %v; want replayed %s", again, err, first.Ref)
		}
		if n := rows(t, pool, "evt_claim"); n != 1 {
			t.Fatalf("ledger rows = %d, want 1", n)
		}
	})

	t.Run("transaction stays usable after a replay", func(t *testing.T) {
		key := effects.MustKey("evt_usable", "ledger")
		if _, err := handle(key, "evt_usable", fp); err != nil {
			t.Fatal(err)
		}
		err := inTx(t, pool, func(tx pgx.Tx) error {
			res, err := postgres.Claim(testCtx(t), tx, "billing", key, fp)
			if err != nil || !res.Replayed() {
				t.Fatalf("Claim = %+v, %v; want replayed", res, err)
			}
			_, err = tx.Exec(testCtx(t), `SELECT 1`)
			return err
		})
		if err != nil {
			t.Fatalf("transaction after a replayed claim: %v", err)
		}
	})

	t.Run("rollback releases the key", func(t *testing.T) {
		key := effects.MustKey("evt_rollback", "ledger")
		errAbort := errors.New("abort")
		err := inTx(t, pool, func(tx pgx.Tx) error {
			if res, err := postgres.Claim(testCtx(t), tx, "billing", key, fp); err != nil || res.Status != effects.Applied {
				t.Fatalf("Claim = %+v, %v", res, err)
			}
			return errAbort
		})
		if !errors.Is(err, errAbort) {
			t.Fatal(err)
		}
		if res, err := handle(key, "evt_rollback", fp); err != nil || res.Status != effects.Applied {
			t.Fatalf("after rollback = %+v, %v; want applied", res, err)
		}
	})

	t.Run("another fingerprint is ErrKeyReused", func(t *testing.T) {
		key := effects.MustKey("evt_claim_reuse", "ledger")
		if _, err := handle(key, "evt_claim_reuse", fp); err != nil {
			t.Fatal(err)
		}
		_, err := handle(key, "evt_claim_reuse", effects.Fingerprint([]byte("other")))
		if !errors.Is(err, effects.ErrKeyReused) {
			t.Fatalf("Claim = %v; want ErrKeyReused", err)
		}
	})

	t.Run("nil fingerprint is stored as empty", func(t *testing.T) {
		key := effects.MustKey("evt_nilfp", "ledger")
		for _, want := range []effects.Status{effects.Applied, effects.Replayed} {
			if res, err := handle(key, "evt_nilfp", nil); err != nil || res.Status != want {
				t.Fatalf("Claim = %+v, %v; want %v", res, err, want)
			}
		}
	})

	t.Run("invalid key fails before any I/O", func(t *testing.T) {
		err := inTx(t, pool, func(tx pgx.Tx) error {
			_, err := postgres.Claim(testCtx(t), tx, "billing", "bad\x00key", fp)
			return err
		})
		if !errors.Is(err, effects.ErrInvalidKey) {
			t.Fatalf("Claim = %v; want ErrInvalidKey", err)
		}
	})

	t.Run("SET LOCAL synchronous_commit = off is refused", func(t *testing.T) {
		key := effects.MustKey("evt_claim_async", "ledger")
		err := inTx(t, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(testCtx(t), `SET LOCAL synchronous_commit = off`); err != nil {
				return err
			}
			_, err := postgres.Claim(testCtx(t), tx, "billing", key, fp)
			return err
		})
		if !errors.Is(err, postgres.ErrAsyncCommit) {
			t.Fatalf("Claim = %v; want ErrAsyncCommit", err)
		}
		if n := count(t, pool, `SELECT count(*) FROM effectively_keys WHERE key = $1`, string(key)); n != 0 {
			t.Fatalf("%d keys stored", n)
		}
	})

	t.Run("SetRef without a claim fails", func(t *testing.T) {
		err := inTx(t, pool, func(tx pgx.Tx) error {
			return postgres.SetRef(testCtx(t), tx, "billing", "never-claimed", "x")
		})
		if err == nil {
			t.Fatal("SetRef succeeded")
		}
	})
}

// statementCounter is a pgx.QueryTracer that counts the statements sent,
// other than transaction control, and the DELETEs among them.
type statementCounter struct{ statements, deletes atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	word, _, _ := strings.Cut(strings.TrimSpace(d.SQL), " ")
	switch strings.ToUpper(word) {
	case "BEGIN", "COMMIT", "ROLLBACK":
	case "DELETE":
		c.deletes.Add(1)
		c.statements.Add(1)
	default:
		c.statements.Add(1)
	}
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestClaimBatch(t *testing.T) {
	url := newDB(t)
	tracer := new(statementCounter)
	pool := newPool(t, url, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	fp1, fp2 := effects.Fingerprint([]byte("one")), effects.Fingerprint([]byte("two"))
	claim := func(items ...postgres.BatchItem) ([]postgres.BatchResult, error) {
		var res []postgres.BatchResult
		err := inTx(t, pool, func(tx pgx.Tx) error {
			var err error
			res, err = postgres.ClaimBatch(testCtx(t), tx, "billing", items)
			return err
		})
		return res, err
	}

	// Seed: "seen" and "taken" committed with fp1, "seen" with a ref.
	err := inTx(t, pool, func(tx pgx.Tx) error {
		if _, err := postgres.ClaimBatch(testCtx(t), tx, "billing", []postgres.BatchItem{{Key: "seen", Fingerprint: fp1}, {Key: "taken", Fingerprint: fp1}}); err != nil {
			return err
		}
		return postgres.SetRef(testCtx(t), tx, "billing", "seen", "ledger:7")
	})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("all new keys cost one statement", func(t *testing.T) {
		before := tracer.statements.Load()
		res, err := claim(postgres.BatchItem{Key: "fresh1", Fingerprint: fp1}, postgres.BatchItem{Key: "fresh2", Fingerprint: fp2})
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.Status != effects.Applied || r.Err != nil {
				t.Errorf("item %d = %+v, want applied", i, r)
			}
		}
		if n := tracer.statements.Load() - before; n != 1 {
			t.Errorf("%d statements, want 1", n)
		}
	})

	t.Run("mix of new, seen, reused and repeated keys", func(t *testing.T) {
		items := []postgres.BatchItem{
			{Key: "new1", Fingerprint: fp1},  // 0: new
			{Key: "seen", Fingerprint: fp1},  // 1: committed earlier, same payload
			{Key: "taken", Fingerprint: fp2}, // 2: committed earlier, other payload
			{Key: "new2", Fingerprint: fp2},  // 3: new
			{Key: "new1", Fingerprint: fp1},  // 4: repeat of 0, same payload
			{Key: "new2", Fingerprint: fp1},  // 5: repeat of 3, other payload
			{Key: "seen", Fingerprint: fp1},  // 6: repeat of 1
		}
		res, err := claim(items...)
		if err != nil {
			t.Fatal(err)
		}
		want := []struct {
			status effects.Status
			ref    string
			reused bool
		}{
			{effects.Applied, "", false},
			{effects.Replayed, "ledger:7", false},
			{0, "", true},
			{effects.Applied, "", false},
			{effects.Replayed, "", false},
			{0, "", true},
			{effects.Replayed, "ledger:7", false},
		}
		for i, w := range want {
			r := res[i]
			if r.Status != w.status || r.Ref != w.ref || errors.Is(r.Err, effects.ErrKeyReused) != w.reused || (r.Err != nil) != w.reused {
				t.Errorf("item %d (%s) = %+v; want status %v ref %q reused %t", i, items[i].Key, r, w.status, w.ref, w.reused)
			}
		}
		if n := count(t, pool, `SELECT count(*) FROM effectively_keys WHERE key IN ('new1', 'new2')`); n != 2 {
			t.Errorf("%d new keys stored, want 2", n)
		}
		var stored []byte
		if err := pool.QueryRow(testCtx(t), `SELECT fingerprint FROM effectively_keys WHERE key = 'taken'`).Scan(&stored); err != nil || string(stored) != string(fp1) {
			t.Errorf("the reused key's fingerprint changed: %x, %v", stored, err)
		}
	})

	t.Run("one invalid key fails the batch before any I/O", func(t *testing.T) {
		before := tracer.statements.Load()
		_, err := claim(postgres.BatchItem{Key: "fine", Fingerprint: fp1}, postgres.BatchItem{Key: "", Fingerprint: fp1})
		if !errors.Is(err, effects.ErrInvalidKey) || !strings.Contains(err.Error(), "item 1") {
			t.Fatalf("ClaimBatch = %v; want ErrInvalidKey naming item 1", err)
		}
		if n := tracer.statements.Load() - before; n != 0 {
			t.Errorf("%d statements, want none", n)
		}
		if n := count(t, pool, `SELECT count(*) FROM effectively_keys WHERE key = 'fine'`); n != 0 {
			t.Errorf("key stored")
		}
	})

	t.Run("empty batch does nothing", func(t *testing.T) {
		if res, err := claim(); err != nil || len(res) != 0 {
			t.Fatalf("ClaimBatch() = %v, %v", res, err)
		}
	})

	t.Run("synchronous_commit off is refused", func(t *testing.T) {
		err := inTx(t, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(testCtx(t), `SET LOCAL synchronous_commit = off`); err != nil {
				return err
			}
			_, err := postgres.ClaimBatch(testCtx(t), tx, "billing", []postgres.BatchItem{{Key: "async", Fingerprint: fp1}})
			return err
		})
		if !errors.Is(err, postgres.ErrAsyncCommit) {
			t.Fatalf("ClaimBatch = %v; want ErrAsyncCommit", err)
		}
	})
}
