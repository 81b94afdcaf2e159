package negcache_test

// BenchmarkReplayStorm measures what a pre-check, the Bloom filter and
// batching save when a stream is re-fed: one op is one storm of 2000
// deliveries per variant, on a durable cluster (fsync on,
// synchronous_commit on) started by pgtest, sequential, one connection at a
// time. Run:
//
//	go test -run '^$' -bench ReplayStorm -benchtime 1x -count 5 ./negcache/
//
// Two mixes: storm_99pct_seen (a replay: 99% of the keys committed before,
// 1% new) and live_1pct_seen (ordinary traffic: 1% seen, 99% new).
// Variants:
//
//   - apply_only: postgres.Effect.Apply for every delivery (a duplicate is
//     [BEGIN, lock, lookup], ROLLBACK; a new key [BEGIN, lock, lookup],
//     write, [INSERT key, COMMIT]).
//   - precheck_filter: negcache.Precheck: postgres.Seen only when the filter
//     says "maybe seen", Apply when not found. The filter is sized for the
//     storm (2000 keys at 1%) and holds the seen keys, as if this process
//     had applied them or warmed the filter with postgres.Keys.
//   - apply_batch_N (N = 100, 500, 1000): postgres.ApplyBatch, N deliveries
//     per transaction (all keys claimed).
//   - precheck_batch_N: postgres.ApplyBatch with
//     postgres.WithPrecheck(filter), N deliveries per call: one query looks
//     up the keys the filter may have seen, those found replay without a
//     transaction, and one transaction claims the rest.
//
// Each variant has a storm of its own (fresh keys); the variants take turns
// every 1000 deliveries, starting with a different one each turn, so that
// drifting fsync latency hits them alike. One op is one round; run with
// -benchtime 1x -count 5 for five rounds, each reported on its own.
// Reported per variant: <variant>-us/key, <variant>-walB/key (WAL written
// during its storm), <variant>/apply_only (time ratio: below 1 is cheaper
// than per-event Apply), and for the filter variant
// precheck_filter-checks/key (the share of deliveries that ran the
// pre-check).

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
	"effectively.dev/negcache"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

const (
	stormSize = 2000
	chunk     = 1000 // variants take turns every chunk deliveries
)

var stormSeq atomic.Int64

// storm is one re-fed range: keys in delivery order, which of them were
// committed before, and a filter that knows those.
type storm struct {
	keys   []effects.Key
	pays   []payment
	seen   []bool
	filter *negcache.Filter
}

// newStorm commits round(stormSize·seenFrac) fresh keys (one ApplyBatch),
// adds them to a new filter, mixes in fresh unseen keys, and shuffles.
func (e *env) newStorm(b *testing.B, seenFrac float64) *storm {
	b.Helper()
	ctx := context.Background()
	nSeen := int(float64(stormSize)*seenFrac + 0.5)
	s := &storm{}
	f, err := negcache.New(stormSize, 0.01)
	if err != nil {
		b.Fatal(err)
	}
	s.filter = f
	for i := range stormSize {
		id := "evt_" + strconv.FormatInt(stormSeq.Add(1), 10)
		s.keys = append(s.keys, effects.MustKey(id, "ledger"))
		s.pays = append(s.pays, payment{EventID: id, Amount: 4200})
		s.seen = append(s.seen, i < nSeen)
	}
	items := make([]postgres.BatchItem, nSeen)
	for i := range nSeen {
		fp, _ := effects.FingerprintJSON(s.pays[i])
		items[i] = postgres.BatchItem{Key: s.keys[i], Fingerprint: fp}
		f.Add(s.keys[i])
	}
	if _, err := postgres.ApplyBatch(ctx, e.pool, "billing", items, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
		return writeLedger(ctx, tx, s.pays[i])
	}); err != nil {
		b.Fatal(err)
	}
	rand.Shuffle(stormSize, func(i, j int) {
		s.keys[i], s.keys[j] = s.keys[j], s.keys[i]
		s.pays[i], s.pays[j] = s.pays[j], s.pays[i]
		s.seen[i], s.seen[j] = s.seen[j], s.seen[i]
	})
	return s
}

func (s *storm) want(i int) effects.Status {
	if s.seen[i] {
		return effects.Replayed
	}
	return effects.Applied
}

func (e *env) walLSN(b *testing.B) string {
	var lsn string
	if err := e.pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		b.Fatal(err)
	}
	return lsn
}

func (e *env) walSince(b *testing.B, lsn string) float64 {
	var d float64
	if err := e.pool.QueryRow(context.Background(), `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)`, lsn).Scan(&d); err != nil {
		b.Fatal(err)
	}
	return d
}

// stormRun delivers s.keys[lo:hi] in order.
type stormRun func(s *storm, lo, hi int)

// batched delivers in batches of size with postgres.ApplyBatch, with the
// storm's filter as pre-check if precheck is set.
func (e *env) batched(b *testing.B, size int, precheck bool) stormRun {
	ctx := context.Background()
	return func(s *storm, lo, hi int) {
		for ; lo < hi; lo += size {
			end := min(lo+size, hi)
			items := make([]postgres.BatchItem, end-lo)
			for i := range items {
				fp, _ := effects.FingerprintJSON(s.pays[lo+i])
				items[i] = postgres.BatchItem{Key: s.keys[lo+i], Fingerprint: fp}
			}
			var opts []postgres.BatchOption
			if precheck {
				opts = append(opts, postgres.WithPrecheck(s.filter))
			}
			results, err := postgres.ApplyBatch(ctx, e.pool, "billing", items, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
				return writeLedger(ctx, tx, s.pays[lo+i])
			}, opts...)
			if err != nil {
				b.Fatal(err)
			}
			for i, r := range results {
				if r.Err != nil || r.Status != s.want(lo+i) {
					b.Fatalf("item %d = %+v; want %v", lo+i, r, s.want(lo+i))
				}
			}
		}
	}
}

func BenchmarkReplayStorm(b *testing.B) {
	for _, mix := range []struct {
		name string
		seen float64
	}{{"storm_99pct_seen", 0.99}, {"live_1pct_seen", 0.01}} {
		b.Run(mix.name, func(b *testing.B) {
			e := newEnv(b, pgtest.Options{Durable: true})
			ctx := context.Background()
			var checks, filtered int64
			variants := []struct {
				name string
				run  stormRun
			}{
				{"apply_only", func(s *storm, lo, hi int) {
					for i := lo; i < hi; i++ {
						res, err := e.fx.Apply(ctx, s.keys[i], s.pays[i])
						if err != nil || res.Status != s.want(i) {
							b.Fatalf("Apply = %+v, %v; want %v", res, err, s.want(i))
						}
					}
				}},
				{"precheck_filter", func(s *storm, lo, hi int) {
					fx := mustPrecheck(b, e.fx, s.filter, e.seen)
					for i := lo; i < hi; i++ {
						res, err := fx.Apply(ctx, s.keys[i], s.pays[i])
						if err != nil || res.Status != s.want(i) {
							b.Fatalf("Apply = %+v, %v; want %v", res, err, s.want(i))
						}
					}
					checks += fx.Stats().Checked
					filtered += int64(hi - lo)
				}},
				{"apply_batch_100", e.batched(b, 100, false)},
				{"apply_batch_500", e.batched(b, 500, false)},
				{"apply_batch_1000", e.batched(b, 1000, false)},
				{"precheck_batch_100", e.batched(b, 100, true)},
				{"precheck_batch_500", e.batched(b, 500, true)},
				{"precheck_batch_1000", e.batched(b, 1000, true)},
			}
			spent := make([]time.Duration, len(variants))
			wal := make([]float64, len(variants))
			if _, err := e.pool.Exec(ctx, `CHECKPOINT`); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				storms := make([]*storm, len(variants))
				for v := range variants {
					storms[v] = e.newStorm(b, mix.seen)
				}
				b.StartTimer()
				for c := range stormSize / chunk {
					lo, hi := c*chunk, (c+1)*chunk
					for j := range variants {
						v := (i + c + j) % len(variants)
						b.StopTimer()
						lsn := e.walLSN(b)
						b.StartTimer()
						start := time.Now()
						variants[v].run(storms[v], lo, hi)
						spent[v] += time.Since(start)
						b.StopTimer()
						wal[v] += e.walSince(b, lsn)
						b.StartTimer()
					}
				}
			}
			b.StopTimer()
			keys := float64(b.N * stormSize)
			for v, variant := range variants {
				b.ReportMetric(float64(spent[v].Microseconds())/keys, variant.name+"-us/key")
				b.ReportMetric(wal[v]/keys, variant.name+"-walB/key")
				if v > 0 {
					b.ReportMetric(float64(spent[v])/float64(spent[0]), variant.name+"/apply_only")
				}
			}
			b.ReportMetric(float64(checks)/float64(filtered), "precheck_filter-checks/key")
		})
	}
}
