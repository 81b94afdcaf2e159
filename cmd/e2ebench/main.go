// Command e2ebench measures the whole path a team builds first, Kafka →
// handler → PostgreSQL, end to end and side by side in one process: the
// library's defaults, the library's batch path, the essay's fixed handler
// written by hand with franz-go and pgx, and a floor without any dedup.
//
// Every variant drains the same number of events (one ledger row each) from
// a topic of its own on an in-process kfake cluster into tables of their
// own on one durable throwaway PostgreSQL cluster (postgres/pgtest, fsync
// on), and the variants take turns round by round, in a rotating order, so
// that the machine's drift hits them alike. The variants:
//
//   - defaults: kafka.NewSource → consume.New(src, handler) with no
//     options but the required dead-letter decision (WithoutDeadLetter, as
//     the hand-written handler moves nothing aside) →
//     postgres.New(pool, scope, write).Apply, the write being the
//     README's ledger INSERT … RETURNING id (the id is the Result's ref).
//   - pipelined: defaults with postgres.NewPipelined instead of New: the
//     ledger INSERT as a statement, sent with the key's row and COMMIT (the
//     event's id is the ref), one round trip per event.
//   - batch: the same Source (ordered by partition) and
//     consume.WithBatch(size, linger, h), h calling postgres.ApplyBatch and
//     postgres.BatchErrors.
//   - consumer-sql: the same Source and Consumer around the hand-written
//     handler's transaction (below) instead of postgres.Effect.Apply: what the
//     library's consumer costs, or gains, on its own.
//   - hand-written: the essay's handler with franz-go and pgx: a group
//     consumer without auto-commit; each poll's partitions handled in
//     parallel, each record in its own transaction (BEGIN; INSERT INTO
//     processed_events … ON CONFLICT DO NOTHING; the ledger INSERT if the
//     claim was new; COMMIT); the offsets committed after each poll.
//   - control: hand-written again, the same code under another name: its
//     ratio to hand-written is the noise of the run, the least a
//     difference must exceed to mean anything.
//   - floor: the same loop with a plain autocommitted ledger INSERT and no
//     dedup at all: what no dedup costs.
//   - defaults-nogroup (only when named in -variants): defaults with
//     postgres.WithoutGroupCommit, every Apply in a transaction of its own.
//
// Every variant's pgxpool has -pool connections (16 by default, more than
// any variant's concurrency, 8, so that the pool never limits it; with
// fewer than 8, postgres.New's Applies share transactions: group commit).
//
// Events/s is measured from the first handled event to the last, per
// variant and round; the table shows the median and range over the
// rounds, each variant's ratio to the hand-written handler of the same
// round (median and range), the OffsetCommit requests per event that
// reached the broker during the run, the final ones included (counted with
// a kfake control hook); per event, the messages the pool's connections
// wrote to PostgreSQL (round trips: a pipeline is one message), the
// transactions committed in the run's database and the cluster's WAL
// flushes and bytes (pg_stat_database, pg_stat_wal); and the CPU time this
// process (with kfake) and the whole machine spent busy per event between
// the first handled event and the last (getrusage and /proc/stat: the
// machine's is a cost that does not depend on how long the disk makes each
// commit wait, but counts whatever else runs on the machine). After each run
// the ledger must hold every event exactly once and the group's committed
// offsets must reach the end, or the command fails.
//
// Usage:
//
//	go run ./cmd/e2ebench [-events 20000] [-partitions 8] [-rounds 3] [-pool 16]
//	    [-variants defaults,pipelined,batch,consumer-sql,hand-written,control,floor] [-batch 100] [-linger 5ms]
//
// The table goes to stdout; progress to stderr. Exit status 1 when a run
// failed or lost or duplicated an event, 2 for bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// config is what one invocation measures.
type config struct {
	events, partitions, rounds int
	pool                       int // every variant's pgxpool size
	variants                   []string
	batch                      int
	linger                     time.Duration
	cpuProfile, blockProfile   string
}

func parse(args []string, stderr io.Writer) (config, error) {
	cfg := config{}
	fs := flag.NewFlagSet("e2ebench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.events, "events", 20000, "events per variant and round")
	fs.IntVar(&cfg.partitions, "partitions", 8, "partitions of each topic")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds (at least 3 for a median and a range worth reading)")
	variants := fs.String("variants", strings.Join(variantNames(), ","), "variants to run, comma-separated")
	fs.IntVar(&cfg.pool, "pool", 16, "every variant's pgxpool size (the default, 16, is more than any variant's concurrency, 8: the pool never limits it)")
	fs.IntVar(&cfg.batch, "batch", 100, "batch size of the batch variant")
	fs.DurationVar(&cfg.linger, "linger", 5*time.Millisecond, "batch linger of the batch variant")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.StringVar(&cfg.blockProfile, "blockprofile", "", "write a blocking profile of the whole run to this file")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg.variants = strings.Split(*variants, ",")
	var errs []error
	for _, v := range cfg.variants {
		if !slices.Contains(allVariantNames(), v) {
			errs = append(errs, fmt.Errorf("unknown variant %q (have %s)", v, strings.Join(allVariantNames(), ", ")))
		}
	}
	if cfg.events < 2 || cfg.partitions < 1 || cfg.rounds < 1 || cfg.batch < 1 || cfg.linger < 0 || cfg.pool < 1 {
		errs = append(errs, errors.New("need -events >= 2, -partitions >= 1, -rounds >= 1, -pool >= 1, -batch >= 1, -linger >= 0"))
	}
	return cfg, errors.Join(errs...)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parse(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "e2ebench:", err)
		}
		return 2
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "e2ebench: "+format+"\n", a...) }
	stopProfiles, err := startProfiles(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "e2ebench:", err)
		return 2
	}
	defer func() {
		if err := stopProfiles(); err != nil {
			fmt.Fprintln(stderr, "e2ebench:", err)
		}
	}()
	env, err := start(ctx, logf)
	if err != nil {
		fmt.Fprintln(stderr, "e2ebench:", err)
		return 1
	}
	defer env.close()
	res, err := measure(ctx, env, cfg, logf)
	if err != nil {
		fmt.Fprintln(stderr, "e2ebench:", err)
		return 1
	}
	report(stdout, cfg, env, res)
	return 0
}

// measure runs every variant cfg.rounds times, in a rotating order.
func measure(ctx context.Context, env *env, cfg config, logf func(string, ...any)) (map[string][]result, error) {
	res := map[string][]result{}
	for round := range cfg.rounds {
		order := slices.Clone(cfg.variants)
		k := round % len(order)
		order = append(order[k:], order[:k]...)
		for _, name := range order {
			r, err := env.runVariant(ctx, cfg, name, round)
			if err != nil {
				return nil, fmt.Errorf("round %d, %s: %w", round+1, name, err)
			}
			logf("round %d %-16s %8.0f events/s  %5d OffsetCommits  %4d µs CPU/event (process %4d µs)  %.2f round trips, %.3f commits, %.3f WAL flushes, %.0f WAL bytes per event",
				round+1, name, r.rate, r.commits, r.cpu.Microseconds(), r.procCPU.Microseconds(), r.roundTrips, r.xacts, r.walSyncs, r.walBytes)
			res[name] = append(res[name], r)
		}
	}
	return res, nil
}

// report prints the table.
func report(w io.Writer, cfg config, env *env, res map[string][]result) {
	fmt.Fprintf(w, "%d events on %d partitions per variant and round, %d rounds, pools of %d connections; PostgreSQL %s (durable: fsync on), kfake in-process\n\n",
		cfg.events, cfg.partitions, cfg.rounds, cfg.pool, env.pgVersion)
	fmt.Fprintln(w, "| variant | events/s (median) | range | × hand-written (median) | range | OffsetCommit requests per event | PostgreSQL round trips per event | commits per event | WAL flushes per event | WAL bytes per event | process CPU per event (median) | machine CPU per event (median) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	base, haveBase := res[handWritten]
	for _, name := range cfg.variants {
		rs := res[name]
		rates := make([]float64, len(rs))
		cpus := make([]float64, 0, len(rs))
		procs := make([]float64, len(rs))
		var commits, rtts, xacts, syncs, wal float64
		for i, r := range rs {
			rates[i] = r.rate
			commits += float64(r.commits) / float64(cfg.events)
			rtts, xacts, syncs, wal = rtts+r.roundTrips, xacts+r.xacts, syncs+r.walSyncs, wal+r.walBytes
			procs[i] = float64(r.procCPU.Microseconds())
			if r.cpu > 0 {
				cpus = append(cpus, float64(r.cpu.Microseconds()))
			}
		}
		k := float64(len(rs))
		cpu := "-"
		if len(cpus) == len(rs) {
			cpu = fmt.Sprintf("%.0f µs", median(cpus))
		}
		ratio, ratioRange := "", ""
		if haveBase {
			ratios := make([]float64, len(rs))
			for i, r := range rs {
				ratios[i] = r.rate / base[i].rate
			}
			lo, hi := minMax(ratios)
			ratio, ratioRange = fmt.Sprintf("%.2f×", median(ratios)), fmt.Sprintf("%.2f–%.2f", lo, hi)
		}
		lo, hi := minMax(rates)
		fmt.Fprintf(w, "| %s | %.0f | %.0f–%.0f | %s | %s | %.4f | %.2f | %.3f | %.3f | %.0f | %.0f µs | %s |\n",
			name, median(rates), lo, hi, ratio, ratioRange, commits/k, rtts/k, xacts/k, syncs/k, wal/k, median(procs), cpu)
	}
	fmt.Fprintln(w)
	for _, name := range cfg.variants {
		fmt.Fprintf(w, "%-12s %s\n", name+":", describe[name])
	}
}

// startProfiles starts the profiles cfg asks for; the returned function
// stops them and writes the files.
func startProfiles(cfg config) (stop func() error, err error) {
	var cpu *os.File
	if cfg.cpuProfile != "" {
		if cpu, err = os.Create(cfg.cpuProfile); err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(cpu); err != nil {
			cpu.Close()
			return nil, err
		}
	}
	if cfg.blockProfile != "" {
		runtime.SetBlockProfileRate(int(10 * time.Microsecond))
	}
	return func() error {
		var errs []error
		if cpu != nil {
			pprof.StopCPUProfile()
			errs = append(errs, cpu.Close())
		}
		if cfg.blockProfile != "" {
			f, err := os.Create(cfg.blockProfile)
			if err != nil {
				return errors.Join(append(errs, err)...)
			}
			errs = append(errs, pprof.Lookup("block").WriteTo(f, 0), f.Close())
		}
		return errors.Join(errs...)
	}, nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func minMax(xs []float64) (float64, float64) { return slices.Min(xs), slices.Max(xs) }
