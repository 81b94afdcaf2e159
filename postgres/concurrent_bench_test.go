package postgres_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/internal/machine"
	"effectively.dev/postgres"
)

// BenchmarkLedgerConcurrent runs the single-key variants (Apply of New and
// of NewPipelined among them) the way a consumer does, eight transactions at once on the default pool, and
// reports throughput rather than latency: on a small machine the cluster's
// CPU and its WAL, not round trips, decide how many keys a second commit.
// One op is a round: every variant handles keysPerRound new keys with
// eight workers, in a new order every round; each variant reports its
// median keys/s over the rounds as <variant>-keys/s, its ratio to the
// hand-written handler's (the median of the per-round ratios) as
// <variant>/handwritten, its ratio to a plain insert transaction's as
// <variant>/plain (above 1/1.20 is the target for apply), and the WAL the cluster wrote per key
// (pg_stat_wal) as <variant>-walB/key, full-page images per key as
// <variant>-fpi/key, and the CPU the whole machine spent per key as
// <variant>-cpuµs/key: on a machine where the cluster, the benchmark and
// nothing else run, that is the cost that decides throughput once the
// CPU, not the disk, is the bottleneck (fsync latency on a shared virtual
// disk swings by 4x within minutes; the CPU cost does not).
//
//	go test -run '^$' -bench LedgerConcurrent -benchtime 5x ./postgres/
func BenchmarkLedgerConcurrent(b *testing.B) {
	const (
		workers      = 8
		keysPerRound = 4000
	)
	lb := newLedgerBench(b)
	mustExec(b, lb.pool, `CREATE TABLE seen_at (event_id text PRIMARY KEY, processed_at timestamptz NOT NULL)`)
	// The same ledger row as a statement, the key as the ref.
	pipelined, err := postgres.NewPipelined(lb.pool, "billing", func(_ context.Context, k effects.Key, p payment) (string, []postgres.Statement, error) {
		return string(k), []postgres.Statement{{SQL: `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, Args: []any{p.EventID, p.Amount}}}, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	lookupFirst, err := postgres.New(lb.pool, "billing", writeLedger, postgres.WithLookupFirst())
	if err != nil {
		b.Fatal(err)
	}
	variants := []variant{
		{"handwritten", func(k effects.Key) { lb.handwrittenNarrow(b, k) }},
		// A plain insert transaction, no dedup: BEGIN, the ledger row,
		// COMMIT.
		{"plain", func(k effects.Key) { lb.plainInsert(b, k) }},
		{"apply", func(k effects.Key) { lb.apply(b, lb.fx, k, effects.Applied) }},
		{"apply_lookupfirst", func(k effects.Key) { lb.apply(b, lookupFirst, k, effects.Applied) }},
		{"pipelined", func(k effects.Key) { lb.apply(b, pipelined, k, effects.Applied) }},
		// The hand-written transaction claiming into effectively_keys: the
		// cost of the library's wider key row alone.
		{"handwritten_keys", func(k effects.Key) { lb.handwritten(b, k) }},
		// Apply's shape with WithLookupFirst, by hand: the settings and
		// the lookup in BEGIN's round trip.
		{"lookup_merged", func(k effects.Key) { shapeLookupMerged(b, lb, k) }},
		// Apply's shape for a new key, by hand.
		{"settings_insert", func(k effects.Key) { shapeSettingsInsert(b, lb, k) }},
		// A lower bound, not correct dedup: the key row inserted before
		// COMMIT, and nothing read, not even the settings.
		{"floor_key_row", func(k effects.Key) { shapeFloor(b, lb, k, true) }},
	}
	for _, v := range variants {
		v.run(benchKeys(1)[0])
	}
	type stat struct {
		rates, ratios, plain []float64
		wal, fpi             int64
		cpu                  time.Duration
	}
	stats := make([]stat, len(variants))
	walNow := func() (bytes, fpi int64) {
		if err := lb.pool.QueryRow(lb.ctx, `SELECT wal_bytes::bigint, wal_fpi FROM pg_stat_wal`).Scan(&bytes, &fpi); err != nil {
			b.Fatal(err)
		}
		return bytes, fpi
	}
	order := make([]int, len(variants))
	for i := range order {
		order[i] = i
	}
	b.ResetTimer()
	for round := range b.N {
		mustExec(b, lb.pool, `CHECKPOINT`)
		// Rotate, so that every variant runs first, and right after a
		// CHECKPOINT (full-page images), as often as any other.
		rotated := append(order[round%len(order):len(order):len(order)], order[:round%len(order)]...)
		rates := make([]float64, len(variants))
		for _, v := range rotated {
			keys := benchKeys(keysPerRound)
			w0, f0 := walNow()
			c0 := machineCPU(b)
			var next atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := next.Add(1) - 1; i < int64(len(keys)); i = next.Add(1) - 1 {
						variants[v].run(keys[i])
					}
				}()
			}
			wg.Wait()
			rates[v] = float64(len(keys)) / time.Since(start).Seconds()
			stats[v].cpu += machineCPU(b) - c0
			w1, f1 := walNow()
			stats[v].wal += w1 - w0
			stats[v].fpi += f1 - f0
		}
		for v := range variants {
			stats[v].rates = append(stats[v].rates, rates[v])
			stats[v].ratios = append(stats[v].ratios, rates[v]/rates[0])
			stats[v].plain = append(stats[v].plain, rates[v]/rates[1])
		}
	}
	b.StopTimer()
	median := func(xs []float64) float64 {
		xs = slices.Clone(xs)
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	n := float64(b.N * keysPerRound)
	for v, variant := range variants {
		b.ReportMetric(median(stats[v].rates), variant.name+"-keys/s")
		b.ReportMetric(float64(stats[v].wal)/n, variant.name+"-walB/key")
		b.ReportMetric(float64(stats[v].fpi)/n, variant.name+"-fpi/key")
		b.ReportMetric(float64(stats[v].cpu.Microseconds())/n, variant.name+"-cpuµs/key")
		if v > 0 {
			b.ReportMetric(median(stats[v].ratios), variant.name+"/handwritten")
		}
		if v > 1 {
			b.ReportMetric(median(stats[v].plain), variant.name+"/plain")
		}
	}
}

// machineCPU is the CPU time the whole machine has spent busy since
// boot (package machine): this process, the cluster and anything else.
func machineCPU(b *testing.B) time.Duration {
	d, err := machine.BusyCPU()
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// handwrittenNarrow is the essay's handler as e2ebench's hand-written
// variant runs it: the claim in a table of its own with only the event id
// and a timestamp, then the write, in four round trips.
func (lb *ledgerBench) handwrittenNarrow(b *testing.B, k effects.Key) {
	lb.handwrittenClaim(b, k, `INSERT INTO seen_at (event_id, processed_at) VALUES ($1, now()) ON CONFLICT (event_id) DO NOTHING`, string(k))
}
