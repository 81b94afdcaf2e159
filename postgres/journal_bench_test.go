package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// BenchmarkJournalConcurrent measures what group commit buys: callers
// goroutines each Begin and Complete new keys on one Journal, as that
// many journaled handlers do, on the durable cluster. One op is a round of
// every caller recording 4 keys on the shared-statement journal (the
// default) and on one that runs a statement per call, in alternating
// order; it reports the keys/s of each and the ratio of the per-round
// rates (median):
//
//	go test -run '^$' -bench JournalConcurrent -benchtime 10x -count 3 ./postgres/
func BenchmarkJournalConcurrent(b *testing.B) {
	for _, callers := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			pool := newPool(b, newDBWith(b, pgtest.Options{Durable: true}), nil) // pgxpool's default size
			shared, err := postgres.NewJournal(pool, "shared")
			if err != nil {
				b.Fatal(err)
			}
			alone, err := postgres.NewJournal(pool, "alone")
			if err != nil {
				b.Fatal(err)
			}
			postgres.SetJournalStatements(alone, 1<<30)
			fp := effects.Fingerprint([]byte("receipt"))
			const perCaller = 4
			round := func(j *postgres.Journal) time.Duration {
				keys := benchKeys(callers * perCaller)
				start := time.Now()
				var wg sync.WaitGroup
				for c := range callers {
					wg.Go(func() {
						ctx := context.Background()
						for _, k := range keys[c*perCaller : (c+1)*perCaller] {
							if _, err := j.Begin(ctx, k, fp, time.Minute); err != nil {
								b.Error(err)
								return
							}
							if err := j.Complete(ctx, k, "ref"); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				return time.Since(start)
			}
			round(shared) // warm up: connections and prepared statements
			round(alone)
			var sharedTook, aloneTook []time.Duration
			var ratios []float64
			b.ResetTimer()
			for i := range b.N {
				var s, a time.Duration
				if i%2 == 0 {
					s, a = round(shared), round(alone)
				} else {
					a, s = round(alone), round(shared)
				}
				sharedTook, aloneTook = append(sharedTook, s), append(aloneTook, a)
				ratios = append(ratios, float64(a)/float64(s))
			}
			b.StopTimer()
			keysPerRound := float64(callers * perCaller)
			rate := func(d []time.Duration) float64 {
				var sum time.Duration
				for _, x := range d {
					sum += x
				}
				return keysPerRound * float64(len(d)) / sum.Seconds()
			}
			slices.Sort(ratios)
			b.ReportMetric(rate(sharedTook), "shared-keys/s")
			b.ReportMetric(rate(aloneTook), "alone-keys/s")
			b.ReportMetric(ratios[len(ratios)/2], "shared/alone-speedup")
			bs, cs := postgres.JournalStatements(shared)
			b.ReportMetric(float64(bs+cs)/float64((b.N+1)*callers*perCaller*2), "shared-statements/call")
		})
	}
}
