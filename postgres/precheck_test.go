package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// txCounter is a pgx tracer that counts the transactions begun (BEGIN sent
// alone or at the head of a batch) and the statements sent.
type txCounter struct{ begins, statements atomic.Int64 }

func (c *txCounter) count(sql string) {
	c.statements.Add(1)
	if word, _, _ := strings.Cut(strings.TrimSpace(sql), " "); strings.EqualFold(word, "begin") {
		c.begins.Add(1)
	}
}

func (c *txCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.count(d.SQL)
	return ctx
}

func (c *txCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *txCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *txCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.count(d.SQL)
}

func (c *txCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// keySet is a postgres.KeyFilter that holds exactly the keys added: no
// false positives unless a test adds a key that was never committed.
type keySet struct {
	mu   sync.Mutex
	keys map[effects.Key]bool
}

func (s *keySet) MaybeSeen(k effects.Key) bool { s.mu.Lock(); defer s.mu.Unlock(); return s.keys[k] }

func (s *keySet) Add(k effects.Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[effects.Key]bool{}
	}
	s.keys[k] = true
}

// TestApplyBatchPrecheck: with WithPrecheck, the keys the filter holds are
// looked up with one query and replayed without a transaction; only the
// rest are claimed, in one transaction, and added to the filter once it
// committed.
func TestApplyBatchPrecheck(t *testing.T) {
	tracer := new(txCounter)
	pool := newPool(t, newDB(t), func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	ctx := testCtx(t)
	ids := eventIDs("pre", 10)
	items, pays := batchOf(t, ids)
	var writes atomic.Int64
	write := func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
		writes.Add(1)
		return writeLedger(ctx, tx, pays[i])
	}
	filter := new(keySet)
	// Apply the first 6 with the filter: all new, so no pre-check query.
	before := tracer.statements.Load()
	first, err := postgres.ApplyBatch(ctx, pool, "billing", items[:6], write, postgres.WithPrecheck(filter))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range first {
		if r.Status != effects.Applied || r.Err != nil || !filter.MaybeSeen(items[i].Key) {
			t.Fatalf("item %d = %+v (in filter: %v), want applied and added to the filter", i, r, filter.MaybeSeen(items[i].Key))
		}
	}
	// begin, claim, ledger inserts, ref update, commit: no lookup.
	if n := tracer.statements.Load() - before; n != 6+4 {
		t.Errorf("%d statements for 6 new keys, want 10 (no pre-check query)", n)
	}

	t.Run("all seen: one query, no transaction", func(t *testing.T) {
		begins, stmts, w := tracer.begins.Load(), tracer.statements.Load(), writes.Load()
		res, err := postgres.ApplyBatch(ctx, pool, "billing", items[:6], write, postgres.WithPrecheck(filter))
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r != (postgres.BatchResult{Status: effects.Replayed, Ref: first[i].Ref}) {
				t.Errorf("item %d = %+v, want replayed with %q", i, r, first[i].Ref)
			}
		}
		if b, s := tracer.begins.Load()-begins, tracer.statements.Load()-stmts; b != 0 || s != 1 || writes.Load() != w {
			t.Errorf("%d transactions, %d statements, %d writes; want 0, 1, 0", b, s, writes.Load()-w)
		}
	})

	t.Run("mixed: seen, reused, new, a false positive and a repeat", func(t *testing.T) {
		filter.Add(items[6].Key) // a false positive: never committed
		reusedItem := postgres.BatchItem{Key: items[1].Key, Fingerprint: effects.Fingerprint([]byte("another payload"))}
		batch := []postgres.BatchItem{items[0], reusedItem, items[6], items[7], items[0], items[8]}
		idx := []int{0, 1, 6, 7, 0, 8} // index in pays of each batch item
		begins, w := tracer.begins.Load(), writes.Load()
		res, err := postgres.ApplyBatch(ctx, pool, "billing", batch, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
			return write(ctx, tx, idx[i])
		}, postgres.WithPrecheck(filter))
		if err != nil {
			t.Fatal(err)
		}
		if res[0] != (postgres.BatchResult{Status: effects.Replayed, Ref: first[0].Ref}) || res[4] != res[0] {
			t.Errorf("seen key and its repeat: %+v, %+v; want replayed with %q", res[0], res[4], first[0].Ref)
		}
		if !errors.Is(res[1].Err, effects.ErrKeyReused) {
			t.Errorf("reused key: %+v, want ErrKeyReused from the pre-check", res[1])
		}
		for _, i := range []int{2, 3, 5} {
			if res[i].Status != effects.Applied || res[i].Err != nil || !filter.MaybeSeen(batch[i].Key) {
				t.Errorf("item %d = %+v, want applied and in the filter", i, res[i])
			}
		}
		if b, n := tracer.begins.Load()-begins, writes.Load()-w; b != 1 || n != 3 {
			t.Errorf("%d transactions and %d writes, want 1 and 3", b, n)
		}
		rows := ledgerRows(t, pool)
		for _, id := range ids[:9] {
			if rows[id] != 1 {
				t.Errorf("%s: %d ledger rows, want 1", id, rows[id])
			}
		}
	})

	t.Run("a cold filter sends every key through the transaction, same results", func(t *testing.T) {
		begins := tracer.begins.Load()
		res, err := postgres.ApplyBatch(ctx, pool, "billing", items[:6], write, postgres.WithPrecheck(new(keySet)))
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r != (postgres.BatchResult{Status: effects.Replayed, Ref: first[i].Ref}) {
				t.Errorf("item %d = %+v, want replayed with %q", i, r, first[i].Ref)
			}
		}
		if b := tracer.begins.Load() - begins; b != 1 {
			t.Errorf("%d transactions, want 1", b)
		}
	})

	t.Run("a write that fails is not added to the filter", func(t *testing.T) {
		f := new(keySet)
		bad := errors.New("bad item")
		res, err := postgres.ApplyBatch(ctx, pool, "billing", items[9:10], func(context.Context, pgx.Tx, int) (string, error) {
			return "", bad
		}, postgres.WithPrecheck(f))
		if err != nil || !errors.Is(res[0].Err, bad) || f.MaybeSeen(items[9].Key) {
			t.Fatalf("ApplyBatch = %+v, %v, in filter %v; want the write's error and not in the filter", res, err, f.MaybeSeen(items[9].Key))
		}
	})
}

// TestPrecheckReplayBarrier: under synchronous replication a key found by
// the pre-check (Seen, ApplyBatch with WithPrecheck) is reported
// only once the standby has it, as Apply's replays are: while the standby
// link is stalled the key is visible on the primary, yet none of them
// reports it; once the link resumes, all do.
func TestPrecheckReplayBarrier(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fp := startFailoverPair(t, ctx, true)
	pool := newPool(t, fp.primary.URL(failoverDB), nil)
	items, pays := batchOf(t, []string{"barrier-1"})
	applied, err := postgres.ApplyBatch(ctx, pool, failoverScope, items, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
		return writeLedger(ctx, tx, pays[i])
	})
	if err != nil {
		t.Fatal(err)
	}
	filter := new(keySet)
	filter.Add(items[0].Key)
	checks := map[string]func(context.Context) (effects.Result, error){
		"Seen": func(ctx context.Context) (effects.Result, error) {
			res, found, err := postgres.Seen(ctx, pool, failoverScope, items[0].Key, items[0].Fingerprint)
			if err == nil && !found {
				err = errors.New("not found")
			}
			return res, err
		},
		"ApplyBatch with WithPrecheck": func(ctx context.Context) (effects.Result, error) {
			res, err := postgres.ApplyBatch(ctx, pool, failoverScope, items, func(context.Context, pgx.Tx, int) (string, error) {
				return "", errors.New("write called for a committed key")
			}, postgres.WithPrecheck(filter))
			if err != nil {
				return effects.Result{}, err
			}
			return effects.Result{Status: res[0].Status, Ref: res[0].Ref}, res[0].Err
		},
	}

	fp.link.Stall()
	if n := count(t, fp.admin, "SELECT count(*) FROM effectively_keys WHERE key = $1", string(items[0].Key)); n != 1 {
		t.Fatalf("the committed key is not visible on the primary (%d rows)", n)
	}
	for name, check := range checks {
		sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		res, err := check(sctx)
		cancel()
		if err == nil {
			t.Errorf("%s reported %+v while the synchronous standby was stalled", name, res)
		} else {
			t.Logf("%s while the standby is stalled: %v", name, err)
		}
	}
	fp.link.Resume()
	for name, check := range checks {
		res, err := check(ctx)
		if err != nil || res != (effects.Result{Status: effects.Replayed, Ref: applied[0].Ref}) {
			t.Errorf("%s after the standby caught up = %+v, %v; want replayed with %q", name, res, err, applied[0].Ref)
		}
	}
}

// TestApplyBatchPrecheckLostReplyAtEveryRoundTrip drops the server's reply
// to the n-th message the client writes, for every n until a batch with a
// pre-check (two keys seen, two new) needs fewer writes, and checks that
// the outcome is one the caller can act on (an error for the whole batch
// that is retryable, or results) and that retrying the same batch leaves
// exactly one ledger row per event.
func TestApplyBatchPrecheckLostReplyAtEveryRoundTrip(t *testing.T) {
	var f faults
	pool := newPool(t, newDB(t), func(c *pgxpool.Config) { f.configure(c); c.MaxConns = 1 })
	ctx := testCtx(t)
	for n := int64(1); ; n++ {
		if n > 40 {
			t.Fatal("ApplyBatch still losing replies after 40 writes")
		}
		ids := eventIDs(fmt.Sprintf("sweep%02d", n), 4)
		items, pays := batchOf(t, ids)
		write := func(ctx context.Context, tx pgx.Tx, i int) (string, error) { return writeLedger(ctx, tx, pays[i]) }
		filter := new(keySet)
		if _, err := postgres.ApplyBatch(ctx, pool, "billing", items[:2], write, postgres.WithPrecheck(filter)); err != nil {
			t.Fatal(err)
		}
		before := f.fired.Load()
		f.countdown.Store(n)
		results, err := postgres.ApplyBatch(ctx, pool, "billing", items, write, postgres.WithPrecheck(filter))
		f.countdown.Store(0)
		if f.fired.Load() == before {
			if err != nil {
				t.Fatalf("n=%d: ApplyBatch without a fault: %v", n, err)
			}
			t.Logf("ApplyBatch with a pre-check took %d writes", n-1)
			break
		}
		switch {
		case err != nil && effects.ClassOf(err) != effects.Retryable:
			t.Fatalf("n=%d: ApplyBatch = %v; want a retryable error", n, err)
		case err == nil:
			for i, r := range results {
				if r.Err != nil {
					t.Fatalf("n=%d: item %d: %v", n, i, r.Err)
				}
			}
		}
		retry, err := postgres.ApplyBatch(ctx, pool, "billing", items, write, postgres.WithPrecheck(filter))
		if err != nil {
			t.Fatalf("n=%d: retry: %v", n, err)
		}
		rows := ledgerRows(t, pool)
		for i, id := range ids {
			if retry[i].Err != nil || rows[id] != 1 {
				t.Errorf("n=%d: %s: retry %+v, %d ledger rows; want 1", n, id, retry[i], rows[id])
			}
		}
	}
}
