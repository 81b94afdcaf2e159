// Command chargehook runs the essay's billing pipeline on embedded
// defaults and shows what effectively-once buys: the same seeded schedule
// of duplicates at every hop goes through the naive handler and through an
// effects.Plan, and a table compares what each did to the ledger, to
// Stripe, to S3, to Kafka and to the customers' inboxes.
//
// Everything runs on this machine, on 127.0.0.1, and each handler's run
// gets its own: a throwaway PostgreSQL primary with a synchronous standby,
// kfake, an in-process S3 (gofakes3), an in-process SMTP server and
// stripetest; a payment processor, a load
// balancer and two webhook pods over real HTTP; a worker that is an
// consume.Consumer over kafka.Source. Faults: the processor resends events
// whose 200 it lost, the balancer retries on the sibling of a frozen pod,
// the worker crashes between commit and ack, and the PostgreSQL primary is
// killed mid-run and its standby promoted.
//
// Usage:
//
//	go run ./cmd/chargehook [-events 1000] [-seed 42] [-workers 8]
//	    [-sender 0.05] [-sibling 0.05] [-crash 0.03] [-failover=true]
//	    [-standby] [-noise] [-v]
//	    [-cpuprofile FILE]
//
// -noise runs the naive handler on both sides instead: the same schedule
// and kind of backends, in the same order. Their throughputs differ only
// by what the machine did meanwhile, which shows how far apart the two
// sides of a normal run can land on this machine for reasons other than
// their handlers.
//
// DATABASE_URL runs on an existing server instead (with -failover=false);
// KAFKA_BROKERS on an existing Kafka cluster. A progress bar goes to
// stderr when stderr is a terminal; the table goes to stdout.
//
// Exit status: 0 when the effectively-once side charged every event exactly
// once (one PaymentIntent, one ledger row), wrote every receipt once and
// lost no event; 1 when it did not; 2 when the demo could not run. The
// at-least-once steps (the Kafka event and the email) never fail the run:
// their duplicates are reported next to their declared window. A -noise
// run exits 0 when it could run.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"effectively.dev/internal/chargehook"
	"effectively.dev/observe"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr *os.File) int {
	cfg := chargehook.DefaultConfig()
	fs := flag.NewFlagSet("chargehook", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.Events, "events", cfg.Events, "payment events the processor emits")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "handlers the worker runs at once (and partitions of the webhook topic)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the events and the fault schedule")
	fs.Float64Var(&cfg.Sender, "sender", cfg.Sender, "probability the processor loses an event's 200 and resends it")
	fs.Float64Var(&cfg.Sibling, "sibling", cfg.Sibling, "probability a pod freezes and the load balancer retries on its sibling")
	fs.Float64Var(&cfg.Crash, "crash", cfg.Crash, "probability the worker crashes after the effects committed, before the ack")
	fs.BoolVar(&cfg.Failover, "failover", cfg.Failover, "kill the PostgreSQL primary mid-run and promote its synchronous standby")
	fs.BoolVar(&cfg.Standby, "standby", cfg.Standby, "with -failover=false: give each run's primary a synchronous standby anyway (what the standby costs each side)")
	fs.BoolVar(&cfg.NaiveTwice, "noise", cfg.NaiveTwice, "run the naive handler on both sides, to see how far apart two runs of the same code land on this machine")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file; each side's goroutines are labelled side=naive or side=effectively-once (side=naive again with -noise; go tool pprof -tags)")
	verbose := fs.Bool("v", false, "log the phases, and every failed attempt (effectively.dev/observe), to stderr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg.DatabaseURL = os.Getenv("DATABASE_URL")
	if cfg.DatabaseURL != "" && cfg.Failover {
		fmt.Fprintln(stderr, "chargehook: DATABASE_URL is set: running without the failover (it needs the demo's own primary and standby)")
		cfg.Failover = false
	}
	if cfg.DatabaseURL != "" && cfg.Standby {
		fmt.Fprintln(stderr, "chargehook: DATABASE_URL is set: running without the standby (it needs the demo's own primary)")
		cfg.Standby = false
	}

	bar := newProgress(stderr)
	cfg.Progress = bar.update
	if *verbose {
		logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		obs, err := observe.New(observe.WithLogger(logger))
		if err != nil {
			fmt.Fprintln(stderr, "chargehook:", err)
			return 2
		}
		cfg.Observer = obs
		cfg.Log = func(format string, args ...any) { bar.log(format, args...) }
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "chargehook:", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "chargehook:", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	report, err := chargehook.Run(ctx, cfg)
	bar.finish()
	if err != nil {
		fmt.Fprintln(stderr, "chargehook:", strings.TrimPrefix(err.Error(), "chargehook: "))
		return 2
	}
	if err := report.WriteTable(stdout); err != nil {
		fmt.Fprintln(stderr, "chargehook:", err)
		return 2
	}
	if len(report.Violations()) > 0 {
		return 1
	}
	return 0
}

// progress draws one bar per handler run on a terminal, and nothing
// otherwise.
type progress struct {
	w       io.Writer
	tty     bool
	mu      sync.Mutex
	current string
	start   time.Time
	rate    float64 // frozen once every event is done
	drawn   bool
}

func newProgress(f *os.File) *progress {
	return &progress{w: f, tty: term.IsTerminal(int(f.Fd()))}
}

func (p *progress) update(handler string, done, total int) {
	if !p.tty {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if handler != p.current {
		if p.drawn {
			fmt.Fprintln(p.w)
		}
		p.current, p.start, p.rate = handler, time.Now(), 0
	}
	// \r goes back over the bar drawn last; after a log line there is
	// none, and the bar starts on the new line.
	const width = 30
	filled := 0
	if total > 0 {
		filled = width * done / total
	}
	rate := p.rate
	if rate == 0 {
		rate = float64(done) / max(time.Since(p.start).Seconds(), 1e-3)
		if done >= total {
			p.rate = rate
		}
	}
	fmt.Fprintf(p.w, "\r%-16s [%s%s] %5d/%d events %5.0f/s", handler,
		strings.Repeat("=", filled), strings.Repeat(" ", width-filled), done, total, rate)
	p.drawn = true
}

// log prints a line, keeping the bar intact.
func (p *progress) log(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}

func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}
