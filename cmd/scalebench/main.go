// Command scalebench measures how the cost of the postgres adapter grows
// with the key table, on a durable throwaway PostgreSQL cluster
// (postgres/pgtest, fsync on), and prints markdown tables. Three
// experiments, each optional (-experiments):
//
//   - apply: effectively_keys bulk-loaded to each -fills size (an INSERT …
//     SELECT over generate_series per million rows, with the indexes
//     dropped during the load and built after it, then VACUUM ANALYZE and
//     a CHECKPOINT), with random (uuid4) or time-ordered (uuid7, ULID's
//     layout) message ids; then Apply of new keys through postgres.New,
//     postgres.NewPipelined and postgres.ApplyBatch, by -workers workers:
//     keys/s, latency p50 and p99, WAL and full-page images per key
//     (pg_stat_wal), index growth per key, machine CPU per key, and the
//     primary key's B-tree depth and leaf fill. Every run starts with a
//     CHECKPOINT and ends by deleting its keys and VACUUMing, so each
//     table stays at its fill size; the cases take turns round by round in
//     a new random order every round, and the smallest fill runs twice per
//     round (the control, whose ratio to itself shows the noise). Block
//     accesses per key (pg_stat_database: found in shared_buffers, or read
//     from the OS) show the cache misses that noise cannot blur.
//   - prune: a table of the largest -prune count of expired keys; windows
//     of -window in which Apply runs alone (twice: the control), next to
//     a postgres.Pruner paced at twice the insert rate, and next to an
//     unpaced postgres.Prune loop; interleaved over -rounds, every window
//     starting with the table topped up to its expired count, a VACUUM
//     and a CHECKPOINT. Then, for
//     each -prune count, a drain: every expired key deleted by Prune while
//     Apply runs, its rate as it goes, the table's size before, after and
//     after a VACUUM.
//   - cycles: four tables (autovacuum defaults or -tuned reloptions;
//     uuid4 or uuid7 keys) that take -cycle-rate new keys/s each while a
//     Pruner deletes those older than -horizon, all at once for -cycles
//     horizons: the tables' size at the end of each, and against a packed
//     copy at the end.
//
// Usage:
//
//	go run ./cmd/scalebench [-quick] [-experiments apply,prune,cycles]
//	    [-fills 1e4,1e6,1e7] [-shapes uuid4,uuid7] [-variants apply,pipelined,batch]
//	    [-keys 20000] [-workers 8] [-batch 100] [-rounds 3] [-write=true]
//	    [-prune 1e6,1e7] [-window 15s] [-prune-batch 1000] [-prune-rate 0]
//	    [-cycles 10] [-cycle-rate 3000] [-horizon 60s] [-naptime 1s] [-tuned ...]
//	    [-settings name=value,...] [-memlimit 0]
//
// -quick runs every experiment on tiny tables in well under a minute: it
// proves the program works, not what it measures. The tables go to stdout;
// progress to stderr. Exit status 1 when a run failed, 2 for bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// Experiments.
const (
	expApply  = "apply"
	expPrune  = "prune"
	expCycles = "cycles"
)

var experiments = []string{expApply, expPrune, expCycles}

// config is what one invocation measures.
type config struct {
	quick       bool
	experiments []string

	fills    []int64
	shapes   []string
	variants []string
	keys     int
	workers  int
	batch    int
	rounds   int
	write    bool
	control  bool

	pruneSizes []int64
	window     time.Duration
	pruneBatch int
	pruneRate  float64

	cycles    int
	cycleRate int
	horizon   time.Duration
	naptime   time.Duration
	tuned     string

	settings map[string]string
	memLimit int64

	logger *slog.Logger // the Pruners' warnings, to stderr
}

// defaultTuned are the reloptions the cycles experiment compares with
// autovacuum's defaults.
const defaultTuned = "autovacuum_vacuum_scale_factor=0.02,autovacuum_vacuum_insert_scale_factor=0.02,autovacuum_vacuum_cost_limit=2000"

func parse(args []string, stderr io.Writer) (config, error) {
	cfg := config{control: true}
	fs := flag.NewFlagSet("scalebench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&cfg.quick, "quick", false, "tiny tables and short runs for every experiment (overrides the sizes below): proves the program works")
	exps := fs.String("experiments", strings.Join(experiments, ","), "experiments to run, comma-separated")
	fills := fs.String("fills", "1e4,1e6,1e7", "key table sizes of the apply experiment, comma-separated")
	shapeList := fs.String("shapes", strings.Join(shapes, ","), "key shapes, comma-separated")
	variantList := fs.String("variants", strings.Join(variants, ","), "apply variants, comma-separated")
	fs.IntVar(&cfg.keys, "keys", 20000, "new keys per apply run")
	fs.IntVar(&cfg.workers, "workers", 8, "concurrent Apply callers")
	fs.IntVar(&cfg.batch, "batch", 100, "keys per ApplyBatch call")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds (at least 3 for a median and a range worth reading)")
	fs.BoolVar(&cfg.write, "write", true, "the effect's write updates an accounts row; false: the key's row alone")
	prune := fs.String("prune", "1e6,1e7", "expired key counts of the prune experiment, comma-separated")
	fs.DurationVar(&cfg.window, "window", 15*time.Second, "length of each prune-mode window")
	fs.IntVar(&cfg.pruneBatch, "prune-batch", 1000, "keys per DELETE statement of Prune and the Pruner")
	fs.Float64Var(&cfg.pruneRate, "prune-rate", 0, "the Pruner's rate in keys/s in the prune experiment; 0: twice the measured insert rate")
	fs.IntVar(&cfg.cycles, "cycles", 10, "horizons the cycles experiment runs after the first")
	fs.IntVar(&cfg.cycleRate, "cycle-rate", 3000, "new keys/s per table in the cycles experiment")
	fs.DurationVar(&cfg.horizon, "horizon", time.Minute, "the Pruner's horizon in the cycles experiment")
	fs.DurationVar(&cfg.naptime, "naptime", time.Second, "autovacuum_naptime during the cycles experiment")
	fs.StringVar(&cfg.tuned, "tuned", defaultTuned, "reloptions of the cycles experiment's tuned tables")
	settings := fs.String("settings", "", "server settings, name=value,... (e.g. shared_buffers=4GB)")
	memLimit := fs.String("memlimit", "0", "cap the cluster's memory, page cache included, with a cgroup (e.g. 1GiB; Linux, needs root); 0: no cap")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var errs []error
	cfg.experiments = list(*exps, experiments, "experiment", &errs)
	cfg.shapes = list(*shapeList, shapes, "shape", &errs)
	cfg.variants = list(*variantList, variants, "variant", &errs)
	cfg.fills = counts(*fills, "-fills", &errs)
	cfg.pruneSizes = counts(*prune, "-prune", &errs)
	cfg.settings = map[string]string{}
	if *settings != "" {
		for _, kv := range strings.Split(*settings, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				errs = append(errs, fmt.Errorf("-settings: %q is not name=value", kv))
				continue
			}
			cfg.settings[k] = v
		}
	}
	var err error
	if cfg.memLimit, err = bytesize(*memLimit); err != nil {
		errs = append(errs, fmt.Errorf("-memlimit: %w", err))
	}
	if cfg.quick {
		cfg.fills = []int64{1000, 20000}
		cfg.keys, cfg.workers, cfg.batch, cfg.rounds = 120, 4, 20, 2
		cfg.pruneSizes = []int64{5000, 20000}
		// Windows long enough, and prune batches small enough, that a loaded
		// machine still ends a batch in each window.
		cfg.window, cfg.pruneBatch = time.Second, 250
		cfg.cycles, cfg.cycleRate, cfg.horizon = 2, 400, time.Second
	}
	if cfg.keys < 1 || cfg.workers < 1 || cfg.batch < 1 || cfg.rounds < 1 || cfg.pruneBatch < 1 || cfg.pruneRate < 0 ||
		cfg.cycles < 1 || cfg.cycleRate < 10 || cfg.horizon <= 0 || cfg.naptime < time.Second || cfg.window <= 0 {
		errs = append(errs, errors.New("need -keys, -workers, -batch, -rounds, -prune-batch, -cycles >= 1, -cycle-rate >= 10, -prune-rate >= 0, -naptime >= 1s, -horizon and -window > 0"))
	}
	return cfg, errors.Join(errs...)
}

// list splits s on commas and checks every element is in known.
func list(s string, known []string, what string, errs *[]error) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if !slices.Contains(known, x) {
			*errs = append(*errs, fmt.Errorf("unknown %s %q (have %s)", what, x, strings.Join(known, ", ")))
			continue
		}
		out = append(out, x)
	}
	if len(out) == 0 {
		*errs = append(*errs, fmt.Errorf("no %s given", what))
	}
	return out
}

// counts parses comma-separated counts such as 1e4,1e6,2500000.
func counts(s, flagName string, errs *[]error) []int64 {
	var out []int64
	for _, x := range strings.Split(s, ",") {
		f, err := strconv.ParseFloat(x, 64)
		if err != nil || f < 1 || f > 1e10 || f != float64(int64(f)) {
			*errs = append(*errs, fmt.Errorf("%s: %q is not a whole count between 1 and 1e10", flagName, x))
			continue
		}
		out = append(out, int64(f))
	}
	return out
}

// bytesize parses 0, 512MiB, 1GiB, 1073741824.
func bytesize(s string) (int64, error) {
	mult := int64(1)
	for suffix, m := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if strings.HasSuffix(s, suffix) {
			s, mult = strings.TrimSuffix(s, suffix), m
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size (e.g. 1GiB)", s)
	}
	return n * mult, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parse(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "scalebench:", err)
		}
		return 2
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(stderr, "scalebench: %s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}
	cfg.logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := start(ctx, cfg, logf)
	if err != nil {
		fmt.Fprintln(stderr, "scalebench:", err)
		return 1
	}
	defer e.close()
	fmt.Fprintf(stdout, "# scalebench, %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(stdout, "PostgreSQL %s (durable: fsync on), %d CPUs, Go %s; %s", e.version, runtime.NumCPU(), runtime.Version(), strings.Join(e.settings, ", "))
	if cfg.memLimit > 0 {
		fmt.Fprintf(stdout, "; the cluster confined to %d MiB of memory, page cache included (cgroup)", cfg.memLimit>>20)
	}
	fmt.Fprint(stdout, "\n\n")
	steps := map[string]func(context.Context, *env, config, io.Writer) error{
		expApply: runApply, expPrune: runPrune, expCycles: runCycles,
	}
	for _, x := range cfg.experiments {
		began := time.Now()
		if err := steps[x](ctx, e, cfg, stdout); err != nil {
			fmt.Fprintf(stderr, "scalebench: %s: %v\n", x, err)
			return 1
		}
		logf("%s done in %v", x, time.Since(began).Round(time.Second))
	}
	return 0
}

// sanitize makes s a database name: lower case, dots as underscores.
func sanitize(s string) string { return strings.ReplaceAll(strings.ToLower(s), ".", "_") }
