// Command chargehook runs the essay's billing pipeline on embedded defaults:
// it starts a throwaway PostgreSQL cluster, replays a seeded schedule of
// payment webhooks with the duplicates every hop makes (processor retries,
// load-balancer retries to a sibling, crashes after the effect before the
// ack), through the naive handler and the effectively-once handler, and
// prints what each did to the ledger.
//
// Usage:
//
//	go run ./cmd/chargehook [-events 2000] [-workers 8] [-seed 42] [-sender 0.05] [-sibling 0.03] [-crash 0.02]
//
// Set DATABASE_URL to use an existing server instead of a throwaway cluster
// (the demo creates its own tables there). The exit status is 1 if the
// effectively-once side double-charged or lost an event, 2 on a setup error.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/internal/chargehook"
	"effectively.dev/internal/pgtest"
)

func main() {
	cfg := chargehook.DefaultConfig()
	flag.IntVar(&cfg.Events, "events", cfg.Events, "payment events the processor emits")
	flag.IntVar(&cfg.Workers, "workers", cfg.Workers, "concurrent workers")
	flag.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the fault schedule")
	flag.Float64Var(&cfg.Sender, "sender", cfg.Sender, "probability the processor retries an event")
	flag.Float64Var(&cfg.Sibling, "sibling", cfg.Sibling, "probability the load balancer retries to a sibling pod at the same time")
	flag.Float64Var(&cfg.Crash, "crash", cfg.Crash, "probability a worker crashes after the effect, before the ack")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	code, err := run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chargehook:", err)
	}
	os.Exit(code)
}

func run(ctx context.Context, cfg chargehook.Config) (int, error) {
	if err := cfg.Validate(); err != nil {
		return 2, err
	}
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		fmt.Fprintln(os.Stderr, "starting a throwaway PostgreSQL cluster...")
		c, err := pgtest.Start(pgtest.Options{})
		if err != nil {
			return 2, err
		}
		defer c.Stop()
		url = c.URL("postgres")
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return 2, err
	}
	pcfg.MaxConns = int32(cfg.Workers + 2)
	db, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return 2, err
	}
	defer db.Close()
	res, err := chargehook.Demo(ctx, db, cfg)
	if err != nil {
		return 2, err
	}
	printTable(cfg, res)
	if res.Fixed.DoubleCharged > 0 || res.Fixed.Lost > 0 {
		return 1, fmt.Errorf("the effectively-once side double-charged %d events and lost %d", res.Fixed.DoubleCharged, res.Fixed.Lost)
	}
	return 0, nil
}

func printTable(cfg chargehook.Config, r chargehook.Result) {
	fmt.Printf("\nchargehook: %d events, seed %d, %d workers; faults: sender retry %.0f%%, sibling retry %.0f%%, crash after effect %.0f%%\n\n",
		cfg.Events, cfg.Seed, cfg.Workers, cfg.Sender*100, cfg.Sibling*100, cfg.Crash*100)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	n, f := r.Naive, r.Fixed
	row := func(name string, a, b any) { fmt.Fprintf(w, "%s\t%v\t%v\t\n", name, a, b) }
	fmt.Fprintf(w, "\tnaive\teffectively-once\t\n")
	row("events", cfg.Events, cfg.Events)
	row("deliveries", n.Deliveries, f.Deliveries)
	for _, hop := range []string{"first", "sender-retry", "sibling-retry", "redelivery"} {
		row("  "+hop, n.Hops[hop], f.Hops[hop])
	}
	row("duplicates absorbed", n.Deliveries-n.LedgerRows, f.Deliveries-f.LedgerRows)
	row("ledger rows", n.LedgerRows, f.LedgerRows)
	row("double-charged events", n.DoubleCharged, f.DoubleCharged)
	row("extra charges", n.ExtraRows, f.ExtraRows)
	row("lost events", n.Lost, f.Lost)
	row("deliveries/s", rate(n), rate(f))
	w.Flush()
	fmt.Printf("\ncontract of the effectively-once ledger effect:\n  %s\n", r.Contract)
}

func rate(s chargehook.Side) string {
	if s.Elapsed <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(s.Deliveries)/s.Elapsed.Seconds())
}
