package mysql_test

// The benchmark of Apply against the hand-written baseline, on one durable
// server (InnoDB's defaults: innodb_flush_log_at_trx_commit = 1, the log
// fsynced at every COMMIT) started by mysqltest, sequential, one key per
// call. The figures in BENCHMARKS.md come from:
//
//	go test -run '^$' -bench ApplyPaired -benchtime 400x -count 5 ./mysql/
//
// Commit latency is dominated by the log's fsync, which on a shared
// virtual disk drifts within a minute, so the variants run round-robin,
// call by call, on one *sql.DB, and each call is timed: drift hits them
// alike. Each variant reports its median and the ratio of its median to
// the plain insert transaction's.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/mysql"
	"effectively.dev/mysql/mysqltest"
)

var benchSeq atomic.Int64

func benchKey() effects.Key {
	return effects.Key("evt_" + strconv.FormatInt(benchSeq.Add(1), 10) + ":ledger")
}

// BenchmarkApplyPaired compares, interleaved on one durable server:
//   - plain_insert: what a team writes without dedup, BEGIN; INSERT the
//     ledger row; COMMIT (the baseline);
//   - apply_new: Apply of a new key (the same INSERT, and the key's row,
//     in one transaction);
//   - apply_duplicate: Apply of a key applied before (the write and the
//     key's INSERT, rolled back, and the lookup), which replays.
//
// One op runs each variant once. It reports each variant's median
// (<variant>-ms) and the ratio of its median to plain_insert's
// (<variant>-x).
func BenchmarkApplyPaired(b *testing.B) {
	dsn := createDB(b, mysqltest.Start(b, mysqltest.Options{Durable: true}))
	db := openMigrated(b, dsn)
	ctx := context.Background()
	eff, err := mysql.New(db, "billing", writeLedger)
	if err != nil {
		b.Fatal(err)
	}
	if err := eff.Check(ctx); err != nil {
		b.Fatal(err) // the settings a production server must have
	}
	dup := benchKey()
	if _, err := eff.Apply(ctx, dup, payment{EventID: string(dup), Amount: 4200}); err != nil {
		b.Fatal(err)
	}
	variants := []struct {
		name string
		run  func() error
	}{
		{"plain_insert", func() error {
			k := benchKey()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if _, err := writeLedger(ctx, tx, payment{EventID: string(k), Amount: 4200}); err != nil {
				return err
			}
			return tx.Commit()
		}},
		{"apply_new", func() error {
			k := benchKey()
			res, err := eff.Apply(ctx, k, payment{EventID: string(k), Amount: 4200})
			if err == nil && res.Status != effects.Applied {
				err = fmt.Errorf("new key %s", res.Status)
			}
			return err
		}},
		{"apply_duplicate", func() error {
			res, err := eff.Apply(ctx, dup, payment{EventID: string(dup), Amount: 4200})
			if err == nil && res.Status != effects.Replayed {
				err = fmt.Errorf("duplicate %s", res.Status)
			}
			return err
		}},
	}
	for _, v := range variants { // warm the pool and the statement caches
		if err := v.run(); err != nil {
			b.Fatal(err)
		}
	}
	samples := make([][]time.Duration, len(variants))
	b.ResetTimer()
	for i := range b.N {
		for j := range variants {
			v := (i + j) % len(variants)
			start := time.Now()
			if err := variants[v].run(); err != nil {
				b.Fatal(err)
			}
			samples[v] = append(samples[v], time.Since(start))
		}
	}
	b.StopTimer()
	medians := make([]time.Duration, len(variants))
	for v := range variants {
		slices.Sort(samples[v])
		medians[v] = samples[v][len(samples[v])/2]
		b.ReportMetric(float64(medians[v].Microseconds())/1000, variants[v].name+"-ms")
		if v > 0 {
			b.ReportMetric(float64(medians[v])/float64(medians[0]), variants[v].name+"-x")
		}
	}
	if n := ledgerRows(b, db, string(dup)); n != 1 {
		b.Errorf("the duplicate's ledger rows: %d, want 1", n)
	}
}
