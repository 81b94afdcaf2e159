package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// Prune modes: what deletes expired keys while Apply runs.
const (
	modeNone    = "none"      // nothing
	modeControl = "none-2"    // nothing, a second time: the noise
	modePruner  = "pruner"    // postgres.Pruner at a rate of twice the insert rate
	modeLoop    = "prune-all" // postgres.Prune of every expired key, back to back, unpaced
)

var pruneModes = []string{modeNone, modeControl, modePruner, modeLoop}

// horizon is how long keys are kept in the prune experiment; the fill's
// keys are two to three days old.
const horizon = 24 * time.Hour

// window is one prune mode's run.
type window struct {
	applied     int
	rate        float64 // keys applied per second
	p50, p99    time.Duration
	pruned      int64
	pruneRate   float64 // keys pruned per second
	exhausted   bool    // no expired key was left before the window ended
	vacuumShare float64 // share of the samples that saw a VACUUM of the table running
	walPerKey   float64 // WAL per applied key
}

// runPrune runs the prune experiment: interleaved windows of Apply with
// each prune mode on a table of the largest expired count, then one drain
// of every expired count.
func runPrune(ctx context.Context, e *env, cfg config, w io.Writer) error {
	biggest := cfg.pruneSizes[0]
	for _, n := range cfg.pruneSizes {
		biggest = max(biggest, n)
	}
	fmt.Fprintf(w, "## Pruning expired keys while Apply runs\n\n")
	if err := pruneRounds(ctx, e, cfg, biggest, w); err != nil {
		return err
	}
	return pruneDrains(ctx, e, cfg, w)
}

func pruneRounds(ctx context.Context, e *env, cfg config, expired int64, w io.Writer) error {
	d, err := e.newDB(ctx, "prune_rounds", cfg.workers+4)
	if err != nil {
		return err
	}
	defer e.drop(context.WithoutCancel(ctx), d)
	e.logf("filling prune_rounds with %d expired keys", expired)
	if err := d.fill(ctx, e.logf, scope, shapeRandom, expired, time.Now().Add(-2*horizon), horizon); err != nil {
		return err
	}
	a, err := newApplier(d, variantApply, cfg.write)
	if err != nil {
		return err
	}
	warm, err := pruneWindow(ctx, d, a, cfg, modeNone, 0)
	if err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	rate := cfg.pruneRate
	if rate == 0 {
		rate = 2 * warm.rate
	}
	e.logf("warm-up: %.0f keys/s applied; the pruner's rate: %.0f keys/s", warm.rate, rate)
	res := map[string][]window{}
	for round := range cfg.rounds {
		for i := range pruneModes {
			mode := pruneModes[(i+round)%len(pruneModes)]
			// Every window starts from the same state: the full backlog
			// of expired keys (an unpaced loop empties it within one
			// window), no dead rows (else the autovacuum of the previous
			// window's deletes runs in this one) and a CHECKPOINT (so
			// that no window pays more full-page images than another).
			now := time.Now()
			added, err := d.topUp(ctx, e.logf, scope, shapeRandom, expired, now.Add(-horizon), now.Add(-2*horizon), horizon)
			if err != nil {
				return fmt.Errorf("round %d, %s: top-up: %w", round+1, mode, err)
			}
			if added > 0 {
				e.logf("  topped up %d expired keys", added)
			}
			for _, sql := range []string{`VACUUM effectively_keys`, `CHECKPOINT`} {
				if _, err := d.pool.Exec(ctx, sql); err != nil {
					return err
				}
			}
			r, err := pruneWindow(ctx, d, a, cfg, mode, rate)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, mode, err)
			}
			e.logf("round %d %-10s %7.0f keys/s applied  p99 %6.2f ms  %8.0f keys/s pruned  vacuum %3.0f%%",
				round+1, mode, r.rate, float64(r.p99)/1e6, r.pruneRate, 100*r.vacuumShare)
			res[mode] = append(res[mode], r)
		}
	}
	fmt.Fprintf(w, "%s expired %s keys (two to three days old, horizon one day); topped up to that backlog, VACUUMed and CHECKPOINTed before every window; windows of %v per mode, %d rounds, modes interleaved; Apply: postgres.New, %d workers, new %s keys; pruner at %.0f keys/s (twice the warm-up's %.0f keys/s applied), batch %d\n\n",
		si(expired), shapeRandom, cfg.window, cfg.rounds, cfg.workers, shapeRandom, rate, warm.rate, cfg.pruneBatch)
	fmt.Fprintln(w, "| mode | applied keys/s (median, range) | × none | p50 ms | p99 ms (median, range) | p99 × none | pruned keys/s (median, range) | pruned ÷ applied | VACUUM running | WAL B/applied key |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	base := res[modeNone]
	for _, mode := range pruneModes {
		var rates, rr, p50, p99, pr, prune, keep, vac, wal []float64
		exhausted := false
		for j, r := range res[mode] {
			rates = append(rates, r.rate)
			rr = append(rr, r.rate/base[j].rate)
			p50 = append(p50, float64(r.p50))
			p99 = append(p99, float64(r.p99))
			pr = append(pr, float64(r.p99)/float64(base[j].p99))
			prune = append(prune, r.pruneRate)
			keep = append(keep, r.pruneRate/r.rate)
			vac = append(vac, r.vacuumShare*100)
			wal = append(wal, r.walPerKey)
			exhausted = exhausted || r.exhausted
		}
		note := ""
		if exhausted {
			note = " (ran out)"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s%s | %s | %.0f %% | %.0f |\n", mode, spread(rates, count), spreadRatio(rr),
			ms(median(p50)), spread(p99, ms), spreadRatio(pr), spread(prune, count), note, spreadRatio(keep), median(vac), median(wal))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "none, none-2: Apply alone (none-2 is the control: the same mode run twice per round)")
	fmt.Fprintln(w, "pruner:      (&postgres.Pruner{DB: pool, Scope: scope, Horizon: 24h, Rate: rate, BatchSize: batch}).Run")
	fmt.Fprintln(w, "prune-all:   postgres.Prune(ctx, pool, scope, now-24h, batch) back to back, unpaced, as a cron job runs it")
	fmt.Fprintln(w, "VACUUM running: share of 250 ms samples of pg_stat_progress_vacuum that saw a (auto)vacuum of the database")
	fmt.Fprintln(w)
	return nil
}

// pruneWindow runs Apply for cfg.window with mode's pruning.
func pruneWindow(ctx context.Context, d *db, a *applier, cfg config, mode string, rate float64) (window, error) {
	wctx, cancel := context.WithTimeout(ctx, cfg.window)
	defer cancel()
	lsn0, err := d.lsn(ctx)
	if err != nil {
		return window{}, err
	}
	var (
		wg        sync.WaitGroup
		pruned    atomic.Int64
		pruneErr  error
		exhausted bool
		vacuums   atomic.Int64
		samples   atomic.Int64
		pruneTime time.Duration
	)
	wg.Add(1)
	go func() { // the VACUUM sampler
		defer wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			var n int
			if err := d.pool.QueryRow(wctx, `SELECT count(*) FROM pg_stat_progress_vacuum WHERE datname = current_database()`).Scan(&n); err == nil {
				samples.Add(1)
				if n > 0 {
					vacuums.Add(1)
				}
			}
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		began := time.Now()
		defer func() { pruneTime = time.Since(began) }()
		switch mode {
		case modePruner:
			p := &postgres.Pruner{DB: d.pool, Scope: scope, Horizon: horizon, Rate: rate, BatchSize: cfg.pruneBatch, Interval: cfg.window, Logger: cfg.logger, Observer: effects.ObserverFunc(func(_ context.Context, ev effects.Event) {
				if ev.Kind == effects.EventPruned {
					pruned.Add(ev.Count)
					if ev.Count < int64(cfg.pruneBatch) {
						exhausted = true
					}
				}
			})}
			pruneErr = p.Run(wctx)
		case modeLoop:
			n, err := postgres.Prune(wctx, d.pool, scope, time.Now().Add(-horizon), cfg.pruneBatch)
			pruned.Add(n)
			if err == nil {
				exhausted = true
				<-wctx.Done()
			} else if wctx.Err() == nil {
				pruneErr = err
			}
		}
	}()
	lat, n, err := a.load(wctx, cfg.workers, 0, 1, shapeRandom)
	cancel()
	wg.Wait()
	if err := errors.Join(err, pruneErr); err != nil {
		return window{}, err
	}
	if n == 0 {
		return window{}, errors.New("no key applied in the window")
	}
	wal, err := d.walSince(ctx, lsn0, false)
	if err != nil {
		return window{}, err
	}
	r := window{
		applied:   n,
		rate:      float64(n) / cfg.window.Seconds(),
		p50:       quantile(lat, 0.5),
		p99:       quantile(lat, 0.99),
		pruned:    pruned.Load(),
		pruneRate: float64(pruned.Load()) / max(pruneTime.Seconds(), 1e-9),
		exhausted: exhausted,
		walPerKey: float64(wal.bytes) / float64(n),
	}
	if s := samples.Load(); s > 0 {
		r.vacuumShare = float64(vacuums.Load()) / float64(s)
	}
	return r, nil
}

// drainSlice is how long each Prune call of a drain runs before it is
// interrupted, to see the rate fall (or not) as the drain goes on.
const drainSlice = 5 * time.Second

// pruneDrains fills a table with each expired count and deletes all of
// it with postgres.Prune while Apply runs, then VACUUMs.
func pruneDrains(ctx context.Context, e *env, cfg config, w io.Writer) error {
	fmt.Fprintf(w, "Drain: every expired key deleted by postgres.Prune (batch %d, unpaced, in calls of %v) while Apply runs (postgres.New, %d workers); then a manual VACUUM\n\n",
		cfg.pruneBatch, drainSlice, cfg.workers)
	fmt.Fprintln(w, "| expired keys | drain s | pruned keys/s | first / last slice keys/s | applied keys/s: alone → during | p99 ms: alone → during | MiB before | after drain | VACUUM s | after VACUUM |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, n := range cfg.pruneSizes {
		name := sanitize("prune_" + si(n))
		d, err := e.newDB(ctx, name, cfg.workers+4)
		if err != nil {
			return err
		}
		e.logf("filling %s with %d expired keys", name, n)
		err = drain(ctx, e, d, cfg, n, w)
		if derr := e.drop(context.WithoutCancel(ctx), d); err == nil {
			err = derr
		}
		if err != nil {
			return fmt.Errorf("drain of %d: %w", n, err)
		}
	}
	fmt.Fprintln(w)
	return nil
}

func drain(ctx context.Context, e *env, d *db, cfg config, n int64, w io.Writer) error {
	if err := d.fill(ctx, e.logf, scope, shapeRandom, n, time.Now().Add(-2*horizon), horizon); err != nil {
		return err
	}
	a, err := newApplier(d, variantApply, cfg.write)
	if err != nil {
		return err
	}
	alone, err := pruneWindow(ctx, d, a, cfg, modeNone, 0)
	if err != nil {
		return err
	}
	before, err := d.sizes(ctx)
	if err != nil {
		return err
	}
	actx, stopApply := context.WithCancel(ctx)
	type loadResult struct {
		lat []time.Duration
		n   int
		err error
	}
	done := make(chan loadResult, 1)
	began := time.Now()
	go func() {
		lat, n, err := a.load(actx, cfg.workers, 0, 1, shapeRandom)
		done <- loadResult{lat, n, err}
	}()
	var (
		pruned int64
		rates  []float64
	)
	cutoff := time.Now().Add(-horizon)
	for {
		sctx, cancel := context.WithTimeout(ctx, drainSlice)
		t0 := time.Now()
		k, err := postgres.Prune(sctx, d.pool, scope, cutoff, cfg.pruneBatch)
		cancel()
		pruned += k
		rates = append(rates, float64(k)/time.Since(t0).Seconds())
		if err == nil {
			break
		}
		if ctx.Err() != nil || sctx.Err() == nil {
			stopApply()
			<-done
			return err
		}
		e.logf("  drain of %s: %d of %d pruned, %.0f keys/s", si(n), pruned, n, rates[len(rates)-1])
	}
	took := time.Since(began)
	stopApply()
	lr := <-done
	if lr.err != nil {
		return lr.err
	}
	// A slice's deadline can cancel a DELETE whose commit the server
	// finished: its rows are gone but not counted in pruned. What is left
	// is the measure: nothing expired may remain, and pruned is all of it.
	var left int64
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM effectively_keys WHERE scope = $1 AND created_at < $2`, scope, cutoff).Scan(&left); err != nil {
		return err
	}
	if left != 0 || pruned > n {
		return fmt.Errorf("drain counted %d pruned keys and left %d expired ones, want all %d pruned", pruned, left, n)
	}
	pruned = n
	after, err := d.sizes(ctx)
	if err != nil {
		return err
	}
	v0 := time.Now()
	if _, err := d.pool.Exec(ctx, `VACUUM effectively_keys`); err != nil {
		return err
	}
	vacuumed := time.Since(v0)
	vac, err := d.sizes(ctx)
	if err != nil {
		return err
	}
	last := rates[len(rates)-1]
	if len(rates) > 1 {
		last = rates[len(rates)-2] // the final slice ends early
	}
	fmt.Fprintf(w, "| %s | %.1f | %.0f | %.0f / %.0f | %.0f → %.0f | %s → %s | %s | %s | %.1f | %s |\n",
		si(n), took.Seconds(), float64(pruned)/took.Seconds(), rates[0], last,
		alone.rate, float64(lr.n)/took.Seconds(), ms(float64(alone.p99)), ms(float64(quantile(lr.lat, 0.99))),
		mib(before.total()), mib(after.total()), vacuumed.Seconds(), mib(vac.total()))
	return nil
}
