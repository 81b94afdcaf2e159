package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
	"effectively.dev/internal/machine"
	"effectively.dev/postgres"
)

// Apply variants.
const (
	variantApply     = "apply"     // postgres.New(...).Apply
	variantPipelined = "pipelined" // postgres.NewPipelined(...).Apply
	variantBatch     = "batch"     // postgres.ApplyBatch
)

var variants = []string{variantApply, variantPipelined, variantBatch}

// scope is every key's scope.
const scope = "payments"

// payment is the effect's input: which account to credit, and by how
// much.
type payment struct {
	Account int
	Cents   int64
}

const updateAccount = `UPDATE accounts SET balance = balance + $2 WHERE id = $1`

// applier applies one effect to new keys, one key (or one batch) per
// call.
type applier struct {
	variant string
	single  effects.Effect[payment] // apply, pipelined
	d       *db
	write   bool
}

func newApplier(d *db, variant string, write bool) (*applier, error) {
	a := &applier{variant: variant, d: d, write: write}
	var err error
	switch variant {
	case variantApply:
		a.single, err = postgres.New(d.pool, scope, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
			if !write {
				return "", nil
			}
			_, err := tx.Exec(ctx, updateAccount, p.Account, p.Cents)
			return "", err
		})
	case variantPipelined:
		a.single, err = postgres.NewPipelined(d.pool, scope, func(_ context.Context, _ effects.Key, p payment) (string, []postgres.Statement, error) {
			if !write {
				return "", nil, nil
			}
			return "", []postgres.Statement{{SQL: updateAccount, Args: []any{p.Account, p.Cents}}}, nil
		})
	case variantBatch:
	default:
		err = fmt.Errorf("unknown variant %q", variant)
	}
	return a, err
}

// apply applies keys (one call of the variant) and reports its latency.
func (a *applier) apply(ctx context.Context, keys []effects.Key, r *rand.Rand) (time.Duration, error) {
	ps := make([]payment, len(keys))
	for i := range ps {
		ps[i] = payment{Account: 1 + r.IntN(accounts), Cents: 1 + r.Int64N(10000)}
	}
	// A batch updates its accounts in id order, as any transaction that
	// locks several rows should: concurrent batches then wait for each
	// other instead of deadlocking.
	slices.SortFunc(ps, func(a, b payment) int { return a.Account - b.Account })
	began := time.Now()
	if a.single != nil {
		res, err := a.single.Apply(ctx, keys[0], ps[0])
		if err == nil && res.Status != effects.Applied {
			err = fmt.Errorf("key %q: %v, want applied (keys are new)", keys[0], res.Status)
		}
		return time.Since(began), err
	}
	items := make([]postgres.BatchItem, len(keys))
	for i, k := range keys {
		fp, err := effects.FingerprintJSON(ps[i])
		if err != nil {
			return 0, err
		}
		items[i] = postgres.BatchItem{Key: k, Fingerprint: fp}
	}
	res, err := postgres.ApplyBatch(ctx, a.d.pool, scope, items, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
		if !a.write {
			return "", nil
		}
		_, err := tx.Exec(ctx, updateAccount, ps[i].Account, ps[i].Cents)
		return "", err
	})
	took := time.Since(began)
	if err != nil {
		return took, err
	}
	for i, r := range res {
		if r.Err != nil {
			return took, r.Err
		}
		if r.Status != effects.Applied {
			return took, fmt.Errorf("key %q: %v, want applied (keys are new)", keys[i], r.Status)
		}
	}
	return took, nil
}

// perCall is how many keys one call of the variant applies.
func perCall(variant string, batch int) int {
	if variant == variantBatch {
		return batch
	}
	return 1
}

// load runs workers that apply new keys of shape, perCall at a time,
// until n keys are applied (n > 0) or ctx is done, and returns the
// latency of every call and how many keys were applied.
func (a *applier) load(ctx context.Context, workers, n, per int, shape string) ([]time.Duration, int, error) {
	var (
		next    atomic.Int64
		mu      sync.Mutex
		lat     []time.Duration
		applied atomic.Int64
		errs    = make([]error, workers)
		wg      sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(rand.Uint64(), uint64(w)))
			var mine []time.Duration
			defer func() {
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
			for ctx.Err() == nil {
				if n > 0 && next.Add(int64(per)) > int64(n) {
					return
				}
				keys := make([]effects.Key, per)
				for i := range keys {
					k, err := newKey(scope, shape, r)
					if err != nil {
						errs[w] = err
						return
					}
					keys[i] = k
				}
				took, err := a.apply(ctx, keys, r)
				if err != nil {
					if ctx.Err() != nil && n == 0 {
						return // the window ended during the call
					}
					errs[w] = err
					return
				}
				mine = append(mine, took)
				applied.Add(int64(per))
			}
		}()
	}
	wg.Wait()
	slices.Sort(lat)
	return lat, int(applied.Load()), errors.Join(errs...)
}

// applyCase is one configuration of the apply experiment: a fill size, a
// key shape and a variant. A control case is the smallest fill's, run a
// second time in every round: its ratio to the first shows the noise.
type applyCase struct {
	fill    int64
	shape   string
	variant string
	control bool
	d       *db
	a       *applier
}

func (c applyCase) name() string {
	s := fmt.Sprintf("%s %s %s", si(c.fill), c.shape, c.variant)
	if c.control {
		s += " (control)"
	}
	return s
}

// applyRun is one run of one case.
type applyRun struct {
	rate      float64 // keys/s
	p50, p99  time.Duration
	walPerKey float64
	fpiPerKey float64
	idxPerKey float64 // index growth in bytes per key
	// hitPerKey and readPerKey are the block accesses per key found in
	// shared_buffers and read from the operating system.
	hitPerKey, readPerKey float64
	cpuPerKey             time.Duration
}

// runApply measures every case cfg.rounds times, in a rotating order.
func runApply(ctx context.Context, e *env, cfg config, w io.Writer) error {
	dbs := map[string]*db{}
	defer func() {
		for _, d := range dbs {
			if err := e.drop(context.WithoutCancel(ctx), d); err != nil {
				e.logf("dropping %s: %v", d.name, err)
			}
		}
	}()
	var cases []applyCase
	newest := time.Now()
	for _, fill := range cfg.fills {
		for _, shape := range cfg.shapes {
			name := fmt.Sprintf("apply_%s_%s", si(fill), shape)
			e.logf("filling %s", name)
			d, err := e.newDB(ctx, sanitize(name), cfg.workers+2)
			if err != nil {
				return err
			}
			dbs[name] = d
			if err := d.fill(ctx, e.logf, scope, shape, fill, newest, 24*time.Hour); err != nil {
				return err
			}
			for _, v := range cfg.variants {
				a, err := newApplier(d, v, cfg.write)
				if err != nil {
					return err
				}
				cases = append(cases, applyCase{fill: fill, shape: shape, variant: v, d: d, a: a})
				if fill == cfg.fills[0] && cfg.control {
					cases = append(cases, applyCase{fill: fill, shape: shape, variant: v, control: true, d: d, a: a})
				}
			}
		}
	}
	trees := map[*db]btree{}
	for _, d := range dbs {
		b, err := d.btree(ctx)
		if err != nil {
			return err
		}
		trees[d] = b
	}
	// A warm-up call per case prepares its statements.
	for _, c := range cases {
		if _, _, err := c.a.load(ctx, 1, perCall(c.variant, cfg.batch), perCall(c.variant, cfg.batch), c.shape); err != nil {
			return fmt.Errorf("%s: warm-up: %w", c.name(), err)
		}
	}
	res := make([][]applyRun, len(cases))
	shuffle := rand.New(rand.NewPCG(1, 2)) // the same orders in every invocation
	for round := range cfg.rounds {
		order := shuffle.Perm(len(cases)) // a new order every round, so that drift hits every case alike
		for _, i := range order {
			r, err := runApplyCase(ctx, cases[i], cfg)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, cases[i].name(), err)
			}
			e.logf("round %d %-28s %7.0f keys/s  p50 %6.2f ms  p99 %6.2f ms  %6.0f B WAL/key (%5.0f B FPI)",
				round+1, cases[i].name(), r.rate, float64(r.p50)/1e6, float64(r.p99)/1e6, r.walPerKey, r.fpiPerKey)
			res[i] = append(res[i], r)
		}
	}
	reportApply(w, cfg, cases, res, trees)
	return nil
}

// runApplyCase runs c once: a checkpoint (so every run starts at the same
// point of the checkpoint cycle), cfg.keys new keys, then their deletion
// and a VACUUM, so that the table is back at its fill size.
func runApplyCase(ctx context.Context, c applyCase, cfg config) (applyRun, error) {
	d := c.d
	if _, err := d.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return applyRun{}, err
	}
	var began time.Time
	if err := d.pool.QueryRow(ctx, `SELECT now()`).Scan(&began); err != nil {
		return applyRun{}, err
	}
	s0, err := d.sizes(ctx)
	if err != nil {
		return applyRun{}, err
	}
	lsn0, err := d.lsn(ctx)
	if err != nil {
		return applyRun{}, err
	}
	if err := d.quiesce(ctx); err != nil {
		return applyRun{}, err
	}
	b0, err := d.blocks(ctx)
	if err != nil {
		return applyRun{}, err
	}
	cpu0, cpuErr := machine.BusyCPU()
	start := time.Now()
	lat, n, err := c.a.load(ctx, cfg.workers, cfg.keys, perCall(c.variant, cfg.batch), c.shape)
	elapsed := time.Since(start)
	cpu1, cpuErr1 := machine.BusyCPU()
	if err != nil {
		return applyRun{}, err
	}
	if err := d.quiesce(ctx); err != nil {
		return applyRun{}, err
	}
	b1, err := d.blocks(ctx)
	if err != nil {
		return applyRun{}, err
	}
	wal, err := d.walSince(ctx, lsn0, true)
	if err != nil {
		return applyRun{}, err
	}
	s1, err := d.sizes(ctx)
	if err != nil {
		return applyRun{}, err
	}
	var rows int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM effectively_keys WHERE scope = $1 AND created_at >= $2`, scope, began).Scan(&rows); err != nil {
		return applyRun{}, err
	}
	if rows != n {
		return applyRun{}, fmt.Errorf("%d keys applied but %d rows written", n, rows)
	}
	if _, err := d.pool.Exec(ctx, `DELETE FROM effectively_keys WHERE scope = $1 AND created_at >= $2`, scope, began); err != nil {
		return applyRun{}, err
	}
	if _, err := d.pool.Exec(ctx, `VACUUM effectively_keys`); err != nil {
		return applyRun{}, err
	}
	r := applyRun{
		rate:       float64(n) / elapsed.Seconds(),
		p50:        quantile(lat, 0.50),
		p99:        quantile(lat, 0.99),
		walPerKey:  float64(wal.bytes) / float64(n),
		fpiPerKey:  float64(wal.fpiBytes) / float64(n),
		idxPerKey:  float64(s1.index()-s0.index()) / float64(n),
		hitPerKey:  float64(b1.hit-b0.hit) / float64(n),
		readPerKey: float64(b1.read-b0.read) / float64(n),
	}
	if cpuErr == nil && cpuErr1 == nil {
		r.cpuPerKey = (cpu1 - cpu0) / time.Duration(n)
	}
	return r, nil
}

// reportApply prints the apply experiment's table.
func reportApply(w io.Writer, cfg config, cases []applyCase, res [][]applyRun, trees map[*db]btree) {
	fmt.Fprintf(w, "## Apply of new keys as effectively_keys grows\n\n")
	fmt.Fprintf(w, "%d keys per run, %d workers, %d rounds (the cases interleaved, in a new random order every round); each run starts with a CHECKPOINT; write: %s\n\n",
		cfg.keys, cfg.workers, cfg.rounds, writeName(cfg.write))
	fmt.Fprintln(w, "| fill | shape | variant | keys/s (median, range) | × smallest fill | p50 ms | p99 ms (median, range) | p99 × smallest | WAL B/key | of which FPI | index B/key | blocks hit/key | read/key | CPU µs/key |")
	fmt.Fprintln(w, "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	base := func(c applyCase) []applyRun {
		for i, b := range cases {
			if b.fill == cfg.fills[0] && b.shape == c.shape && b.variant == c.variant && !b.control {
				return res[i]
			}
		}
		return nil
	}
	for i, c := range cases {
		rs, bs := res[i], base(c)
		var rates, rateRatios, p50s, p99s, p99Ratios, wal, fpi, idx, hit, read, cpu []float64
		for j, r := range rs {
			rates = append(rates, r.rate)
			p50s = append(p50s, float64(r.p50))
			p99s = append(p99s, float64(r.p99))
			wal = append(wal, r.walPerKey)
			fpi = append(fpi, r.fpiPerKey)
			idx = append(idx, r.idxPerKey)
			hit = append(hit, r.hitPerKey)
			read = append(read, r.readPerKey)
			cpu = append(cpu, float64(r.cpuPerKey)/float64(time.Microsecond))
			if j < len(bs) {
				rateRatios = append(rateRatios, r.rate/bs[j].rate)
				p99Ratios = append(p99Ratios, float64(r.p99)/float64(bs[j].p99))
			}
		}
		fill := si(c.fill)
		if c.control {
			fill += " (control)"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %.0f | %.0f | %.0f | %.1f | %.2f | %.0f |\n",
			fill, c.shape, c.variant, spread(rates, count), spreadRatio(rateRatios), ms(median(p50s)),
			spread(p99s, ms), spreadRatio(p99Ratios), median(wal), median(fpi), median(idx), median(hit), median(read), median(cpu))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| fill | shape | primary key: levels | leaf pages | leaf fill % |")
	fmt.Fprintln(w, "|---:|---|---:|---:|---:|")
	seen := map[*db]bool{}
	for _, c := range cases {
		if seen[c.d] {
			continue
		}
		seen[c.d] = true
		b := trees[c.d]
		fmt.Fprintf(w, "| %s | %s | %d | %d | %.0f |\n", si(c.fill), c.shape, b.levels, b.leafPages, b.leafFill)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "apply:     postgres.New(pool, scope, write).Apply, one key per call; latency per call")
	fmt.Fprintln(w, "pipelined: postgres.NewPipelined(pool, scope, statements).Apply, one key per call; latency per call")
	fmt.Fprintf(w, "batch:     postgres.ApplyBatch of %d keys per call; keys/s counts keys, latency is per call\n", cfg.batch)
	fmt.Fprintln(w, "WAL B/key: the cluster's WAL per key from the run's start (right after a CHECKPOINT) to its end; of which FPI: the full-page images in it (pg_walinspect)")
	fmt.Fprintln(w, "index B/key: growth of the key table's two indexes during the run per key")
	fmt.Fprintln(w, "blocks hit/key, read/key: the database's block accesses per key found in shared_buffers, and read from the OS (its page cache or the disk: pg_stat_database)")
	fmt.Fprintln(w, "CPU µs/key: the whole machine's busy CPU per key (/proc/stat; other processes on the machine count too)")
	fmt.Fprintln(w)
}

func writeName(write bool) string {
	if write {
		return fmt.Sprintf("one UPDATE of a random row of a %d-row accounts table per key", accounts)
	}
	return "none (the key's row alone)"
}
