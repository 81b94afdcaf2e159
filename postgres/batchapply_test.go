package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// batchOf returns items and payments for event ids, fingerprinted as
// postgres.Effect does by default.
func batchOf(t testing.TB, ids []string) ([]postgres.BatchItem, []payment) {
	t.Helper()
	items := make([]postgres.BatchItem, len(ids))
	pays := make([]payment, len(ids))
	for i, id := range ids {
		pays[i] = payment{EventID: id, Amount: 100}
		fp, err := effects.FingerprintJSON(pays[i])
		if err != nil {
			t.Fatal(err)
		}
		items[i] = postgres.BatchItem{Key: effects.MustKey("billing", id, "ledger"), Fingerprint: fp}
	}
	return items, pays
}

func eventIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return ids
}

// ledgerRows returns the number of ledger rows per event id.
func ledgerRows(t testing.TB, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) map[string]int {
	t.Helper()
	rows, _ := db.Query(context.Background(), `SELECT event_id, count(*) FROM ledger GROUP BY event_id`)
	out := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestApplyBatch(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	ctx := testCtx(t)

	t.Run("1000 keys, new and seen mixed, duplicates in the batch", func(t *testing.T) {
		ids := eventIDs("mix", 1000)
		// Seed 400 of them (every other among the first 800).
		var seedIDs []string
		for i := 0; i < 800; i += 2 {
			seedIDs = append(seedIDs, ids[i])
		}
		seedItems, seedPays := batchOf(t, seedIDs)
		seeded, err := postgres.ApplyBatch(ctx, pool, "billing", seedItems, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
			return writeLedger(ctx, tx, seedPays[i])
		})
		if err != nil {
			t.Fatal(err)
		}
		seedRef := map[string]string{}
		for i, r := range seeded {
			if r.Status != effects.Applied || r.Err != nil || !strings.HasPrefix(r.Ref, "ledger:") {
				t.Fatalf("seed item %d = %+v, want applied with a ref", i, r)
			}
			seedRef[seedIDs[i]] = r.Ref
		}

		// All 1000, then 100 of them again in the same batch.
		all := append(append([]string(nil), ids...), ids[:100]...)
		items, pays := batchOf(t, all)
		var writes sync.Map
		results, err := postgres.ApplyBatch(ctx, pool, "billing", items, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
			if _, dup := writes.LoadOrStore(all[i], true); dup {
				t.Errorf("write called twice for %s", all[i])
			}
			return writeLedger(ctx, tx, pays[i])
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(results) != len(all) {
			t.Fatalf("%d results for %d items", len(results), len(all))
		}
		firstRef := map[string]string{}
		for i, r := range results {
			id := all[i]
			if r.Err != nil {
				t.Fatalf("item %d (%s): %v", i, id, r.Err)
			}
			switch {
			case i >= 1000: // a repeat within the batch
				if r.Status != effects.Replayed || r.Ref != firstRef[id] {
					t.Errorf("repeat %s = %+v, want replayed with %q", id, r, firstRef[id])
				}
			case seedRef[id] != "":
				if r.Status != effects.Replayed || r.Ref != seedRef[id] {
					t.Errorf("seen %s = %+v, want replayed with %q", id, r, seedRef[id])
				}
			default:
				if r.Status != effects.Applied || !strings.HasPrefix(r.Ref, "ledger:") {
					t.Errorf("new %s = %+v, want applied with a ref", id, r)
				}
			}
			if i < 1000 {
				firstRef[id] = r.Ref
			}
		}
		rows := ledgerRows(t, pool)
		for _, id := range ids {
			if rows[id] != 1 {
				t.Errorf("%s has %d ledger rows, want 1", id, rows[id])
			}
		}
		// The stored refs replay: a second run changes nothing.
		again, err := postgres.ApplyBatch(ctx, pool, "billing", items[:1000], func(context.Context, pgx.Tx, int) (string, error) {
			t.Error("write called for a committed key")
			return "", nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range again {
			if r.Status != effects.Replayed || r.Ref != firstRef[all[i]] {
				t.Fatalf("replay of %s = %+v, want ref %q", all[i], r, firstRef[all[i]])
			}
		}
	})

	t.Run("key reused with another payload fails only that item", func(t *testing.T) {
		items, pays := batchOf(t, eventIDs("reuse", 3))
		if _, err := postgres.ApplyBatch(ctx, pool, "billing", items[:1], func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
			return writeLedger(ctx, tx, pays[i])
		}); err != nil {
			t.Fatal(err)
		}
		items[0].Fingerprint = effects.Fingerprint([]byte("another payload"))
		results, err := postgres.ApplyBatch(ctx, pool, "billing", items, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
			return writeLedger(ctx, tx, pays[i])
		})
		if err != nil {
			t.Fatal(err)
		}
		if !errors.Is(results[0].Err, effects.ErrKeyReused) || results[1].Status != effects.Applied || results[2].Status != effects.Applied {
			t.Errorf("results %+v, want ErrKeyReused, applied, applied", results)
		}
	})

	t.Run("a failing write fails only its item", func(t *testing.T) {
		ids := eventIDs("failwrite", 8)
		items, pays := batchOf(t, ids)
		bad := errors.New("amount does not parse")
		results, err := postgres.ApplyBatch(ctx, pool, "billing", items, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
			switch i {
			case 2:
				return "", bad
			case 5: // an SQL error aborts the transaction
				_, err := tx.Exec(ctx, `SELECT 1 / 0`)
				return "", err
			}
			return writeLedger(ctx, tx, pays[i])
		})
		if err != nil {
			t.Fatal(err)
		}
		rows := ledgerRows(t, pool)
		for i, r := range results {
			switch i {
			case 2, 5:
				if r.Err == nil || r.Status != 0 || rows[ids[i]] != 0 {
					t.Errorf("item %d = %+v with %d rows, want its write's error and no row", i, r, rows[ids[i]])
				}
			default:
				if r.Err != nil || r.Status != effects.Applied || rows[ids[i]] != 1 {
					t.Errorf("item %d = %+v with %d rows, want applied once", i, r, rows[ids[i]])
				}
			}
		}
		if !errors.Is(results[2].Err, bad) || effects.ClassOf(results[2].Err) == effects.Retryable {
			t.Errorf("item 2 error %v, want the write's own, not retryable", results[2].Err)
		}
	})

	t.Run("too many failing writes abandon the batch", func(t *testing.T) {
		ids := eventIDs("abandon", 10)
		items, pays := batchOf(t, ids)
		results, err := postgres.ApplyBatch(ctx, pool, "billing", items, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
			if i%2 == 0 {
				return "", fmt.Errorf("bad item %d", i)
			}
			return writeLedger(ctx, tx, pays[i])
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range results {
			if r.Err == nil {
				t.Errorf("item %d = %+v, want an error", i, r)
			}
			if wantRetry := i%2 == 1 || i > 4; (effects.ClassOf(r.Err) == effects.Retryable) != wantRetry {
				t.Errorf("item %d: ClassOf(%v) == Retryable is %v, want %v", i, r.Err, !wantRetry, wantRetry)
			}
		}
		if rows := ledgerRows(t, pool); rows[ids[1]] != 0 {
			t.Error("an abandoned batch committed")
		}
	})

	t.Run("invalid key: nothing done", func(t *testing.T) {
		items, _ := batchOf(t, []string{"ok"})
		items = append(items, postgres.BatchItem{Key: "bad\x00key"})
		_, err := postgres.ApplyBatch(ctx, pool, "billing", items, func(context.Context, pgx.Tx, int) (string, error) {
			t.Error("write called")
			return "", nil
		})
		if !errors.Is(err, effects.ErrInvalidKey) {
			t.Fatalf("err = %v, want ErrInvalidKey", err)
		}
	})

	t.Run("concurrent overlapping batches apply each key once", func(t *testing.T) {
		ids := eventIDs("overlap", 200)
		var wg sync.WaitGroup
		var mu sync.Mutex
		applied := map[string]int{}
		for g := range 4 {
			shuffled := append([]string(nil), ids...)
			rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			items, pays := batchOf(t, shuffled)
			wg.Go(func() {
				results, err := postgres.ApplyBatch(ctx, pool, "billing", items, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
					return writeLedger(ctx, tx, pays[i])
				})
				if err != nil {
					t.Errorf("goroutine %d: %v", g, err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for i, r := range results {
					if r.Status == effects.Applied {
						applied[shuffled[i]]++
					}
				}
			})
		}
		wg.Wait()
		rows := ledgerRows(t, pool)
		for _, id := range ids {
			if applied[id] != 1 || rows[id] != 1 {
				t.Errorf("%s applied %d times, %d rows; want 1 and 1", id, applied[id], rows[id])
			}
		}
	})
}

// TestApplyBatchLostCommitReply: when the COMMIT's reply is lost the whole
// batch is ErrAmbiguous; retrying the same items replays every one.
func TestApplyBatchLostCommitReply(t *testing.T) {
	var f faults
	url := newDB(t)
	pool := newPool(t, url, func(c *pgxpool.Config) {
		f.configure(c)
		// Send SQL text with every statement, so that faultConn sees the
		// COMMIT pipelined after the ref UPDATE.
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	})
	ctx := testCtx(t)
	ids := eventIDs("lost", 20)
	items, pays := batchOf(t, ids)
	write := func(ctx context.Context, tx pgx.Tx, i int) (string, error) { return writeLedger(ctx, tx, pays[i]) }
	f.onCommit.Store(true)
	_, err := postgres.ApplyBatch(ctx, pool, "billing", items, write)
	if !errors.Is(err, effects.ErrAmbiguous) || f.fired.Load() != 1 {
		t.Fatalf("err = %v (faults fired %d), want ErrAmbiguous", err, f.fired.Load())
	}
	results, err := postgres.ApplyBatch(ctx, pool, "billing", items, write)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if r.Status != effects.Replayed || !strings.HasPrefix(r.Ref, "ledger:") {
			t.Errorf("retry of %s = %+v, want replayed with the committed ref", ids[i], r)
		}
	}
	rows := ledgerRows(t, pool)
	for _, id := range ids {
		if rows[id] != 1 {
			t.Errorf("%s: %d rows", id, rows[id])
		}
	}
}

func TestBatchErrors(t *testing.T) {
	whole := errors.New("batch failed")
	reused := &effects.Error{Kind: effects.ErrKeyReused}
	if errs := postgres.BatchErrors(2, nil, whole); errs[0] != whole || errs[1] != whole {
		t.Errorf("BatchErrors with a batch error = %v", errs)
	}
	errs := postgres.BatchErrors(3, []postgres.BatchResult{{Status: effects.Applied}, {Err: reused}}, nil)
	if errs[0] != nil || errs[1] != reused || errs[2] == nil {
		t.Errorf("BatchErrors = %v, want nil, the item's error, an error for the missing result", errs)
	}
}

func TestSeenAndKeys(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	ctx := testCtx(t)
	items, pays := batchOf(t, []string{"seen-1", "seen-2"})
	before := time.Now().Add(-time.Minute)

	if _, found, err := postgres.Seen(ctx, pool, "billing", items[0].Key, items[0].Fingerprint); found || err != nil {
		t.Fatalf("Seen before any apply = %v, %v; want false", found, err)
	}
	applied, err := postgres.ApplyBatch(ctx, pool, "billing", items[:1], func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
		return writeLedger(ctx, tx, pays[i])
	})
	if err != nil {
		t.Fatal(err)
	}
	res, found, err := postgres.Seen(ctx, pool, "billing", items[0].Key, items[0].Fingerprint)
	if !found || err != nil || res.Status != effects.Replayed || res.Ref != applied[0].Ref {
		t.Errorf("Seen after apply = %+v, %v, %v; want replayed with %q", res, found, err, applied[0].Ref)
	}
	if _, _, err := postgres.Seen(ctx, pool, "billing", items[0].Key, []byte("other")); !errors.Is(err, effects.ErrKeyReused) {
		t.Errorf("Seen with another fingerprint: %v, want ErrKeyReused", err)
	}
	if _, found, err := postgres.Seen(ctx, pool, "other-scope", items[0].Key, items[0].Fingerprint); found || err != nil {
		t.Errorf("Seen in another scope = %v, %v; want false", found, err)
	}
	if _, _, err := postgres.Seen(ctx, pool, "billing", "", nil); !errors.Is(err, effects.ErrInvalidKey) {
		t.Errorf("Seen of an empty key: %v, want ErrInvalidKey", err)
	}
	// A claim that has not committed is not seen.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := postgres.Claim(ctx, tx, "billing", items[1].Key, items[1].Fingerprint); err != nil {
		t.Fatal(err)
	}
	if _, found, err := postgres.Seen(ctx, pool, "billing", items[1].Key, items[1].Fingerprint); found || err != nil {
		t.Errorf("Seen of an uncommitted claim = %v, %v; want false", found, err)
	}

	var keys []effects.Key
	if err := postgres.Keys(ctx, pool, "billing", before, func(k effects.Key) error { keys = append(keys, k); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != items[0].Key {
		t.Errorf("Keys = %v, want only the committed %v", keys, items[0].Key)
	}
	stop := errors.New("stop")
	if err := postgres.Keys(ctx, pool, "billing", before, func(effects.Key) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("Keys returned %v, want fn's error", err)
	}
}
