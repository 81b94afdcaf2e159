// Command effectively runs the operations that move failed work back into
// the pipeline once its cause is fixed.
//
// Usage:
//
//	effectively redrive -brokers HOST:PORT[,...] -dlq TOPIC [selection] [-topic T] [-rate N] [-dry-run]
//	effectively outbox list|retry|drop -db URL [selection] [-dry-run]
//
// redrive reads a dead-letter topic written by kafka.DeadLetterTopic and
// re-produces the selected dead letters to their source topic, with their
// delivery id header, so the consumer's completed steps replay and only
// the rest apply (kafka.Redrive). Selection: -from and -to (RFC 3339, the
// dead-lettering time), -class (comma-separated: poison, permanent,
// retryable, unclassified), -id (comma-separated delivery ids), -count
// (the most to move). -rate limits records moved per second; -dry-run
// prints what would move and moves nothing. A progress bar is drawn on
// standard error when it is a terminal.
//
// outbox manages the rows an outbox relay parked
// (effectively.dev/kafka/outbox): list prints them, retry returns them to
// the relays (outbox.RetryParked), drop deletes them (outbox.DropParked).
// Selection: -from and -to (the parking time), -class (permanent or
// retryable), -topic, -id (comma-separated row ids), -message-id
// (comma-separated message ids), -count. With -dry-run, retry and drop
// print the rows they would change.
//
// It exits with status 2 for a usage error and 1 when the operation
// failed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case err == nil:
	case errors.Is(err, errUsage):
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "effectively:", err)
		os.Exit(1)
	}
}

// errUsage reports a usage error, already printed.
var errUsage = errors.New("usage")

const usage = `usage:
  effectively redrive -brokers HOST:PORT[,...] -dlq TOPIC [-from T] [-to T] [-class C,...] [-id ID,...] [-count N] [-topic T] [-id-header H] [-rate N] [-dry-run]
  effectively outbox list|retry|drop -db URL [-from T] [-to T] [-class C] [-topic T] [-id N,...] [-message-id ID,...] [-count N] [-dry-run]`

// run runs the command line args (without the program name).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return errUsage
	}
	switch args[0] {
	case "redrive":
		return redrive(ctx, args[1:], stdout, stderr)
	case "outbox":
		if len(args) < 2 {
			fmt.Fprintln(stderr, usage)
			return errUsage
		}
		return outboxCmd(ctx, args[1], args[2:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "effectively: unknown command %q\n%s\n", args[0], usage)
	return errUsage
}

// selection is the flags redrive and outbox share.
type selection struct {
	from, to, class, ids string
	count                int
	dryRun               bool
}

func (s *selection) register(fs *flag.FlagSet) {
	fs.StringVar(&s.from, "from", "", "select from this time (RFC 3339)")
	fs.StringVar(&s.to, "to", "", "select before this time (RFC 3339)")
	fs.StringVar(&s.class, "class", "", "select these error classes (comma-separated)")
	fs.StringVar(&s.ids, "id", "", "select these ids (comma-separated)")
	fs.IntVar(&s.count, "count", 0, "select at most this many (0: no limit)")
	fs.BoolVar(&s.dryRun, "dry-run", false, "print what would change, change nothing")
}

func (s *selection) times() (from, to time.Time, err error) {
	parse := func(name, v string) (time.Time, error) {
		if v == "" {
			return time.Time{}, nil
		}
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return time.Time{}, fmt.Errorf("-%s: %w", name, err)
		}
		return t, nil
	}
	if from, err = parse("from", s.from); err != nil {
		return
	}
	to, err = parse("to", s.to)
	return
}

func split(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "effectively %s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return errUsage
	}
	return nil
}

func redrive(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("redrive", flag.ContinueOnError)
	var (
		sel                     selection
		brokers, dlq, topic, ih string
		perSecond               float64
	)
	sel.register(fs)
	fs.StringVar(&brokers, "brokers", "", "Kafka seed brokers (comma-separated)")
	fs.StringVar(&dlq, "dlq", "", "the dead-letter topic to read")
	fs.StringVar(&topic, "topic", "", "produce to this topic instead of each record's source topic")
	fs.StringVar(&ih, "id-header", kafka.KeyHeader, "the header the consumers read the delivery id from")
	fs.Float64Var(&perSecond, "rate", 100, "records moved per second (0: no limit)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if brokers == "" || dlq == "" {
		fmt.Fprintln(stderr, "effectively redrive: -brokers and -dlq are required")
		return errUsage
	}
	from, to, err := sel.times()
	if err != nil {
		fmt.Fprintln(stderr, "effectively redrive:", err)
		return errUsage
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(split(brokers)...))
	if err != nil {
		return err
	}
	defer cl.Close()
	opts := []kafka.RedriveOption{kafka.WithRedriveTimeRange(from, to), kafka.WithRedriveIDHeader(ih),
		kafka.WithRedriveRate(rate.Limit(perSecond), 1)}
	if classes := split(sel.class); len(classes) > 0 {
		opts = append(opts, kafka.WithRedriveClasses(classes...))
	}
	if ids := split(sel.ids); len(ids) > 0 {
		opts = append(opts, kafka.WithRedriveIDs(ids...))
	}
	if sel.count > 0 {
		opts = append(opts, kafka.WithRedriveLimit(sel.count))
	}
	if topic != "" {
		opts = append(opts, kafka.WithRedriveTopic(topic))
	}
	if sel.dryRun {
		opts = append(opts, kafka.WithRedriveDryRun(stdout))
	}
	st, err := kafka.Redrive(ctx, cl, dlq, opts...)
	verb := "moved"
	if sel.dryRun {
		verb = "would move"
	}
	fmt.Fprintf(stdout, "%s %d of %d dead letters (%d not selected, %d repeated delivery ids)\n", verb, st.Moved, st.Read, st.Skipped, st.Repeated)
	return err
}

func outboxCmd(ctx context.Context, verb string, args []string, stdout, stderr io.Writer) error {
	switch verb {
	case "list", "retry", "drop":
	default:
		fmt.Fprintf(stderr, "effectively outbox: unknown command %q\n%s\n", verb, usage)
		return errUsage
	}
	fs := flag.NewFlagSet("outbox "+verb, flag.ContinueOnError)
	var (
		sel               selection
		db, topic, msgIDs string
	)
	sel.register(fs)
	fs.StringVar(&db, "db", "", "PostgreSQL connection string of the outbox's database")
	fs.StringVar(&topic, "topic", "", "select the rows of this topic")
	fs.StringVar(&msgIDs, "message-id", "", "select these message ids (comma-separated)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if db == "" {
		fmt.Fprintln(stderr, "effectively outbox: -db is required")
		return errUsage
	}
	f := outbox.ParkedFilter{Topic: topic, Class: sel.class, Limit: sel.count}
	var err error
	if f.From, f.To, err = sel.times(); err != nil {
		fmt.Fprintln(stderr, "effectively outbox:", err)
		return errUsage
	}
	for _, s := range split(sel.ids) {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(stderr, "effectively outbox: -id %q: not a row id\n", s)
			return errUsage
		}
		f.IDs = append(f.IDs, id)
	}
	for _, s := range split(msgIDs) {
		f.MessageIDs = append(f.MessageIDs, effects.Key(s))
	}
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		return err
	}
	defer pool.Close()
	if verb == "list" || sel.dryRun {
		ps, err := outbox.ListParked(ctx, pool, f)
		if err != nil {
			return err
		}
		for _, p := range ps {
			fmt.Fprintf(stdout, "%d\t%s\t%s\t%s\t%d attempts\tparked %s\t%s\n", p.ID, p.MessageID, p.Topic, p.Class,
				p.Attempts, p.ParkedAt.UTC().Format(time.RFC3339), p.Error)
		}
		switch verb {
		case "list":
			fmt.Fprintf(stdout, "%d parked rows\n", len(ps))
		default:
			fmt.Fprintf(stdout, "would %s %d parked rows\n", verb, len(ps))
		}
		return nil
	}
	var n int64
	if verb == "retry" {
		n, err = outbox.RetryParked(ctx, pool, f)
		fmt.Fprintf(stdout, "returned %d parked rows to the relays\n", n)
	} else {
		n, err = outbox.DropParked(ctx, pool, f)
		fmt.Fprintf(stdout, "dropped %d parked rows\n", n)
	}
	return err
}
