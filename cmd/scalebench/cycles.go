package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// cycleConfig is one way of running autovacuum on the key table.
type cycleConfig struct {
	name       string
	reloptions string // ALTER TABLE effectively_keys SET (...); "" for the defaults
}

// cycleTable is one table of the experiment: a configuration and a key
// shape.
type cycleTable struct {
	cc       cycleConfig
	shape    string
	d        *db
	samples  []cycleSample
	inserted atomic.Int64
	pruned   atomic.Int64
}

// cycleSample is the table's state at the end of one cycle.
type cycleSample struct {
	sizes
	live, dead, autovacuums int64
}

// runCycles runs the steady-state experiment: every table gets new keys
// at cfg.cycleRate and a Pruner with horizon cfg.horizon at twice that
// rate, for cfg.cycles horizons after the first (which fills the table to
// its steady size), all tables at once; autovacuum_naptime is
// cfg.naptime meanwhile (time runs faster here than in production, where
// the horizon is days: see the report).
func runCycles(ctx context.Context, e *env, cfg config, w io.Writer) (err error) {
	admin, err := pgx.Connect(ctx, e.pg.URL("postgres"))
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER SYSTEM SET autovacuum_naptime = '%dms'`, cfg.naptime.Milliseconds())); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return err
	}
	defer func() {
		bg := context.WithoutCancel(ctx)
		if _, rerr := admin.Exec(bg, `ALTER SYSTEM RESET autovacuum_naptime`); rerr != nil {
			err = errors.Join(err, rerr)
		} else if _, rerr := admin.Exec(bg, `SELECT pg_reload_conf()`); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	configs := []cycleConfig{{name: "defaults"}, {name: "tuned", reloptions: cfg.tuned}}
	var tables []*cycleTable
	defer func() {
		for _, t := range tables {
			if derr := e.drop(context.WithoutCancel(ctx), t.d); derr != nil {
				e.logf("dropping %s: %v", t.d.name, derr)
			}
		}
	}()
	for _, cc := range configs {
		for _, shape := range cfg.shapes {
			d, err := e.newDB(ctx, sanitize("cycles_"+cc.name+"_"+shape), 4)
			if err != nil {
				return err
			}
			tables = append(tables, &cycleTable{cc: cc, shape: shape, d: d})
			if cc.reloptions != "" {
				if _, err := d.pool.Exec(ctx, `ALTER TABLE effectively_keys SET (`+cc.reloptions+`)`); err != nil {
					return fmt.Errorf("-tuned %q: %w", cc.reloptions, err)
				}
			}
		}
	}
	e.logf("cycles: %d tables, %d keys/s each, horizon %v, %d cycles after the first", len(tables), cfg.cycleRate, cfg.horizon, cfg.cycles)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errs := make([]error, 2*len(tables))
	for i, t := range tables {
		wg.Add(2)
		go func() {
			defer wg.Done()
			errs[2*i] = t.load(rctx, cfg.cycleRate)
		}()
		go func() {
			defer wg.Done()
			p := &postgres.Pruner{DB: t.d.pool, Scope: scope, Horizon: cfg.horizon, Rate: 2 * float64(cfg.cycleRate), BatchSize: cfg.pruneBatch, Interval: max(cfg.horizon/20, 10*time.Millisecond), Logger: cfg.logger, Observer: countPruned(&t.pruned)}
			errs[2*i+1] = p.Run(rctx)
		}()
	}
	began := time.Now()
	for c := range cfg.cycles + 1 {
		select {
		case <-ctx.Done():
			stop()
			wg.Wait()
			return ctx.Err()
		case <-time.After(time.Until(began.Add(time.Duration(c+1) * cfg.horizon))):
		}
		for _, t := range tables {
			s, err := t.sample(ctx)
			if err != nil {
				stop()
				wg.Wait()
				return err
			}
			t.samples = append(t.samples, s)
		}
		e.logf("cycle %d of %d: %s", c, cfg.cycles, cycleLine(tables))
	}
	stop()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return reportCycles(ctx, w, cfg, tables, time.Since(began))
}

// load inserts rate new keys a second, a tenth every 100 ms, as
// multi-row INSERTs: the key table's traffic without Apply's cost, so
// that the tables' growth and vacuum are what is measured.
func (t *cycleTable) load(ctx context.Context, rate int) error {
	ms := `(extract(epoch from clock_timestamp()) * 1000)::bigint`
	insert := fmt.Sprintf(`INSERT INTO effectively_keys (scope, key, fingerprint, ref)
		SELECT $1, %s, %s, '' FROM generate_series(1, $2::int)`, keySQL(idSQL(t.shape, ms)), fingerprintSQL)
	const tick = 100 * time.Millisecond
	per := max(rate/10, 1)
	tk := time.NewTicker(tick)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C:
		}
		if _, err := t.d.pool.Exec(ctx, insert, scope, per); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		t.inserted.Add(int64(per))
	}
}

func (t *cycleTable) sample(ctx context.Context) (cycleSample, error) {
	s := cycleSample{}
	var err error
	if s.sizes, err = t.d.sizes(ctx); err != nil {
		return s, err
	}
	err = t.d.pool.QueryRow(ctx, `SELECT n_live_tup, n_dead_tup, autovacuum_count FROM pg_stat_user_tables WHERE relname = 'effectively_keys'`).
		Scan(&s.live, &s.dead, &s.autovacuums)
	return s, err
}

func cycleLine(tables []*cycleTable) string {
	parts := make([]string, len(tables))
	for i, t := range tables {
		s := t.samples[len(t.samples)-1]
		parts[i] = fmt.Sprintf("%s/%s %s MiB (%d live, %d dead, %d autovacuums)", t.cc.name, t.shape, mib(s.total()), s.live, s.dead, s.autovacuums)
	}
	return strings.Join(parts, "; ")
}

func reportCycles(ctx context.Context, w io.Writer, cfg config, tables []*cycleTable, took time.Duration) error {
	fmt.Fprintf(w, "## Steady state: insert and prune at equal rates\n\n")
	fmt.Fprintf(w, "each table: %d new keys/s (multi-row INSERTs every 100 ms) and a postgres.Pruner (horizon %v, rate %d keys/s, batch %d), all %d tables at once for %v; autovacuum_naptime %v; tuned: %s\n\n",
		cfg.cycleRate, cfg.horizon, 2*cfg.cycleRate, cfg.pruneBatch, len(tables), took.Round(time.Second), cfg.naptime, cfg.tuned)
	fmt.Fprint(w, "| autovacuum | shape |")
	for c := range cfg.cycles + 1 {
		fmt.Fprintf(w, " %d |", c)
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, "|---|---|")
	for range cfg.cycles + 1 {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for _, t := range tables {
		fmt.Fprintf(w, "| %s | %s |", t.cc.name, t.shape)
		for _, s := range t.samples {
			fmt.Fprintf(w, " %s |", mib(s.total()))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "(table + indexes, MiB, at the end of each horizon; horizon 0 fills the table, pruning starts after it)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| autovacuum | shape | inserted | pruned | live rows | dead rows | autovacuums | heap MiB | pkey MiB | created_at MiB | pkey leaf fill % | ÷ packed copy | last ÷ middle cycle |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, t := range tables {
		last := t.samples[len(t.samples)-1]
		mid := t.samples[len(t.samples)/2]
		packed, err := t.d.packedSize(ctx)
		if err != nil {
			return err
		}
		b, err := t.d.btree(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %d | %s | %s | %s | %.0f | %.2f | %.2f |\n",
			t.cc.name, t.shape, t.inserted.Load(), t.pruned.Load(), last.live, last.dead, last.autovacuums,
			mib(last.heap), mib(last.pkey), mib(last.createdAt), b.leafFill,
			float64(last.total())/float64(packed.total()), float64(last.total())/float64(mid.total()))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "÷ packed copy: the table's size over that of a copy of its live rows with freshly built indexes (heap full, B-tree leaves 90 % full)")
	fmt.Fprintln(w)
	return nil
}

// packedSize copies the table's rows into a new table with freshly built
// indexes, measures it and drops it.
func (d *db) packedSize(ctx context.Context) (sizes, error) {
	var s sizes
	_, err := d.pool.Exec(ctx, `CREATE TABLE packed AS SELECT * FROM effectively_keys;
		ALTER TABLE packed ADD CONSTRAINT packed_pkey PRIMARY KEY (scope, key);
		CREATE INDEX packed_created_at ON packed (scope, created_at)`)
	if err != nil {
		return s, err
	}
	err = d.pool.QueryRow(ctx, `SELECT pg_relation_size('packed'), pg_relation_size('packed_pkey'), pg_relation_size('packed_created_at')`).
		Scan(&s.heap, &s.pkey, &s.createdAt)
	if _, derr := d.pool.Exec(ctx, `DROP TABLE packed`); err == nil {
		err = derr
	}
	return s, err
}

// countPruned is an Observer that adds the keys every EventPruned
// deleted to n.
func countPruned(n *atomic.Int64) effects.Observer {
	return effects.ObserverFunc(func(_ context.Context, ev effects.Event) {
		if ev.Kind == effects.EventPruned {
			n.Add(ev.Count)
		}
	})
}
