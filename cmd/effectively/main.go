// Command effectively runs the operations that move failed work back into
// the pipeline once its cause is fixed, and shows what failed.
//
// Usage:
//
//	effectively redrive -brokers HOST:PORT[,...] -dlq TOPIC -allow-topic T [-allow-topic T ...] [selection] [-group G] [-topic T] [-rate N] [-dry-run] [-yes]
//	effectively dlq list -brokers HOST:PORT[,...] -dlq TOPIC [selection] [-group G]
//	effectively outbox list|retry|drop [-db URL] [selection] [-topic T] [-message-id ID,...] [-all] [-dry-run]
//	effectively -h | effectively CMD -h
//
// redrive reads a dead-letter topic written by kafka.DeadLetterTopic and
// re-produces the selected dead letters to their source topic, with their
// delivery id header, so the consumer's completed steps replay and only
// the rest apply (kafka.Redrive). The destination comes from each dead
// letter's header, which whoever can write the dead-letter topic can
// forge: redrive moves a dead letter only to a topic named by -allow-topic
// (repeatable) or -topic, and skips and counts the others. It first prints
// what it will move (counts per destination and class, with the first and
// last dead-lettering times) and moves them only with -yes; -dry-run also
// lists each dead letter. With -group G, redrive records its progress on
// the dead-letter topic under consumer group G: a redrive stopped part-way
// (SIGINT, SIGTERM, a crash) and run again with the same group moves only
// what was not moved, and -count N moves the next N. Selection: -from and
// -to (RFC 3339, the dead-lettering time), -class (comma-separated:
// poison, permanent, retryable, unclassified), -id (comma-separated
// delivery ids), -count (the most to move). -rate limits records moved per
// second. On SIGINT or SIGTERM it stops after the record in flight and
// prints what it moved.
//
// dlq list prints each selected dead letter (time, delivery id, class,
// destination, error) and the counts per class and per destination.
//
// outbox manages the rows an outbox relay parked
// (effectively.dev/kafka/outbox): list prints them, retry returns them to
// the relays (outbox.ParkedFilter.Retry), drop deletes them
// (outbox.ParkedFilter.Drop).
// Selection: -from and -to (the parking time), -class (permanent or
// retryable), -topic, -id (comma-separated row ids), -message-id
// (comma-separated message ids), -count. retry and drop refuse to run
// without a selection unless given -all. With -dry-run, they print the
// rows they would change.
//
// Secrets never go on the command line. The database URL is -db, else the
// DATABASE_URL environment variable, else the standard PG* variables
// (PGHOST, PGUSER, PGPASSWORD, ...). Kafka: -tls turns TLS on (-tls-ca,
// -tls-cert and -tls-key name PEM files, -tls-server-name overrides the
// name checked); -sasl PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 with
// -sasl-user NAME authenticates, with the password from the environment
// variable EFFECTIVELY_SASL_PASSWORD. -brokers defaults to KAFKA_BROKERS.
// Passwords are redacted from every message the command prints.
//
// It exits with status 0 after -h, 2 for a usage error, and 1 when the
// operation failed or was interrupted.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"golang.org/x/time/rate"

	"effectively.dev/effects"
	"effectively.dev/internal/ratelog"
	"effectively.dev/kafka"
	"effectively.dev/kafka/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
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

// Environment variables the command reads.
const (
	envDatabaseURL  = "DATABASE_URL"
	envSASLPassword = "EFFECTIVELY_SASL_PASSWORD"
	envBrokers      = "KAFKA_BROKERS"
)

const usage = `usage:
  effectively redrive -brokers HOST:PORT[,...] -dlq TOPIC -allow-topic T [-allow-topic T ...] [-from T] [-to T] [-class C,...] [-id ID,...] [-count N] [-group G] [-topic T] [-id-header H] [-rate N] [-dry-run] [-yes]
  effectively dlq list -brokers HOST:PORT[,...] -dlq TOPIC [-from T] [-to T] [-class C,...] [-id ID,...] [-count N] [-group G]
  effectively outbox list|retry|drop [-db URL] [-from T] [-to T] [-class C] [-topic T] [-id N,...] [-message-id ID,...] [-count N] [-all] [-dry-run]

Kafka connection (redrive, dlq): -tls [-tls-ca FILE] [-tls-cert FILE -tls-key FILE] [-tls-server-name NAME],
  -sasl PLAIN|SCRAM-SHA-256|SCRAM-SHA-512 -sasl-user NAME (password from $EFFECTIVELY_SASL_PASSWORD);
  -brokers defaults to $KAFKA_BROKERS.
Database (outbox): -db, else $DATABASE_URL, else the PG* variables (PGHOST, PGUSER, PGPASSWORD, ...).
Run 'effectively CMD -h' for a command's flags.`

// run runs the command line args (without the program name).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	r := &redactor{}
	err := dispatch(ctx, r, args, stdout, stderr)
	if err == nil || errors.Is(err, errUsage) {
		return err
	}
	return r.wrap(err)
}

func dispatch(ctx context.Context, r *redactor, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return errUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return nil
	case "redrive":
		return redrive(ctx, r, args[1:], stdout, stderr)
	case "dlq":
		if len(args) < 2 || args[1] != "list" {
			if len(args) >= 2 && isHelp(args[1]) {
				fmt.Fprintln(stdout, usage)
				return nil
			}
			fmt.Fprintf(stderr, "effectively dlq: want 'dlq list'\n%s\n", usage)
			return errUsage
		}
		return dlqList(ctx, r, args[2:], stdout, stderr)
	case "outbox":
		if len(args) < 2 {
			fmt.Fprintln(stderr, usage)
			return errUsage
		}
		if isHelp(args[1]) {
			fmt.Fprintln(stdout, usage)
			return nil
		}
		return outboxCmd(ctx, r, args[1], args[2:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "effectively: unknown command %q\n%s\n", args[0], usage)
	return errUsage
}

func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" || a == "help" }

// redactor replaces the secrets it learnt in the errors the command
// returns.
type redactor struct{ secrets []string }

func (r *redactor) add(secret string) {
	if secret != "" {
		r.secrets = append(r.secrets, secret)
		if esc := url.QueryEscape(secret); esc != secret {
			r.secrets = append(r.secrets, esc)
		}
		if esc := url.PathEscape(secret); esc != secret {
			r.secrets = append(r.secrets, esc)
		}
	}
}

// text returns s with every secret replaced by "xxxxx".
func (r *redactor) text(s string) string {
	for _, sec := range r.secrets {
		s = strings.ReplaceAll(s, sec, "xxxxx")
	}
	return s
}

// wrap returns err with its text redacted; errors.Is and errors.As still
// reach err.
func (r *redactor) wrap(err error) error {
	if len(r.secrets) == 0 {
		return err
	}
	return &redacted{err: err, msg: r.text(err.Error())}
}

type redacted struct {
	err error
	msg string
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }

// selection is the flags redrive, dlq and outbox share.
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
}

func (s *selection) registerDryRun(fs *flag.FlagSet) {
	fs.BoolVar(&s.dryRun, "dry-run", false, "print what would change, change nothing")
}

// any reports whether the selection narrows anything.
func (s *selection) any() bool {
	return s.from != "" || s.to != "" || s.class != "" || s.ids != "" || s.count > 0
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

// repeated is a flag that may be given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, split(v)...); return nil }

// parseFlags parses args into fs; -h prints fs's usage to stdout and
// returns flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	fs.SetOutput(stderr)
	for _, a := range args {
		if isHelp(a) {
			fs.SetOutput(stdout)
			break
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return flag.ErrHelp
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "effectively %s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return errUsage
	}
	return nil
}

// helpOK turns flag.ErrHelp into a successful exit.
func helpOK(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// kafkaFlags are the connection flags of redrive and dlq.
type kafkaFlags struct {
	brokers, dlq                      string
	tls                               bool
	tlsCA, tlsCert, tlsKey, tlsServer string
	saslMechanism, saslUser           string
}

func (k *kafkaFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.brokers, "brokers", "", "Kafka seed brokers, comma-separated (default $"+envBrokers+")")
	fs.StringVar(&k.dlq, "dlq", "", "the dead-letter topic")
	fs.BoolVar(&k.tls, "tls", false, "connect with TLS (implied by the other -tls flags)")
	fs.StringVar(&k.tlsCA, "tls-ca", "", "PEM file of the CAs to trust (default: the system's)")
	fs.StringVar(&k.tlsCert, "tls-cert", "", "PEM file of the client certificate")
	fs.StringVar(&k.tlsKey, "tls-key", "", "PEM file of the client certificate's key")
	fs.StringVar(&k.tlsServer, "tls-server-name", "", "the server name to verify (default: the broker's host)")
	fs.StringVar(&k.saslMechanism, "sasl", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (password from $"+envSASLPassword+")")
	fs.StringVar(&k.saslUser, "sasl-user", "", "SASL user name")
}

// client returns a Kafka client for the flags, or a usage error (printed
// to stderr).
func (k *kafkaFlags) client(cmd string, r *redactor, stderr io.Writer) (*kgo.Client, error) {
	usageErr := func(format string, args ...any) (*kgo.Client, error) {
		fmt.Fprintf(stderr, "effectively %s: %s\n", cmd, r.text(fmt.Sprintf(format, args...)))
		return nil, errUsage
	}
	if k.brokers == "" {
		k.brokers = os.Getenv(envBrokers)
	}
	if k.brokers == "" || k.dlq == "" {
		return usageErr("-brokers (or $%s) and -dlq are required", envBrokers)
	}
	opts := []kgo.Opt{kgo.SeedBrokers(split(k.brokers)...)}
	if k.tls || k.tlsCA != "" || k.tlsCert != "" || k.tlsKey != "" || k.tlsServer != "" {
		cfg, err := k.tlsConfig()
		if err != nil {
			return usageErr("%v", err)
		}
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	if k.saslMechanism != "" || k.saslUser != "" {
		pass := os.Getenv(envSASLPassword)
		r.add(pass)
		if k.saslUser == "" || pass == "" {
			return usageErr("-sasl needs -sasl-user and the password in $%s", envSASLPassword)
		}
		switch strings.ToUpper(k.saslMechanism) {
		case "PLAIN":
			opts = append(opts, kgo.SASL(plain.Auth{User: k.saslUser, Pass: pass}.AsMechanism()))
		case "SCRAM-SHA-256":
			opts = append(opts, kgo.SASL(scram.Auth{User: k.saslUser, Pass: pass}.AsSha256Mechanism()))
		case "SCRAM-SHA-512":
			opts = append(opts, kgo.SASL(scram.Auth{User: k.saslUser, Pass: pass}.AsSha512Mechanism()))
		default:
			return usageErr("-sasl %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", k.saslMechanism)
		}
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return usageErr("%v", err)
	}
	return cl, nil
}

func (k *kafkaFlags) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: k.tlsServer}
	if k.tlsCA != "" {
		pem, err := os.ReadFile(k.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("-tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-tls-ca %s: no PEM certificate in it", k.tlsCA)
		}
	}
	if (k.tlsCert == "") != (k.tlsKey == "") {
		return nil, errors.New("-tls-cert and -tls-key go together")
	}
	if k.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(k.tlsCert, k.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("-tls-cert/-tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func redrive(ctx context.Context, r *redactor, args []string, stdout, stderr io.Writer) error {
	const cmd = "redrive"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var (
		sel              selection
		kf               kafkaFlags
		allow            repeated
		topic, ih, group string
		perSecond        float64
		yes              bool
	)
	sel.register(fs)
	sel.registerDryRun(fs)
	kf.register(fs)
	fs.Var(&allow, "allow-topic", "a topic dead letters may move to (repeatable, or comma-separated)")
	fs.StringVar(&topic, "topic", "", "produce to this topic instead of each record's source topic (allowed by naming it)")
	fs.StringVar(&group, "group", "", "record progress under this consumer group on the dead-letter topic, to resume a stopped redrive")
	fs.StringVar(&ih, "id-header", kafka.KeyHeader, "the header the consumers read the delivery id from")
	fs.Float64Var(&perSecond, "rate", 100, "records moved per second (0: no limit)")
	fs.BoolVar(&yes, "yes", false, "move the dead letters (without it, redrive prints what it would move)")
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return helpOK(err)
	}
	if perSecond < 0 {
		fmt.Fprintln(stderr, "effectively redrive: -rate must not be negative (0: no limit)")
		return errUsage
	}
	opts, err := redriveSelection(sel, group)
	if err != nil {
		fmt.Fprintln(stderr, "effectively redrive:", err)
		return errUsage
	}
	if yes && !sel.dryRun && len(allow) == 0 && topic == "" {
		fmt.Fprintln(stderr, "effectively redrive: -yes needs -allow-topic (repeatable) or -topic: the topics dead letters may move to")
		return errUsage
	}
	cl, err := kf.client(cmd, r, stderr)
	if err != nil {
		return err
	}
	defer cl.Close()
	opts = append(opts, kafka.WithIDHeader(ih))
	if perSecond > 0 {
		opts = append(opts, kafka.WithLimiter(rate.NewLimiter(rate.Limit(perSecond), 1)))
	}
	if topic != "" {
		opts = append(opts, kafka.WithTopic(topic))
	}
	if len(allow) > 0 {
		opts = append(opts, kafka.WithAllowTopics(allow...))
	}
	// The plan: a dry run, printed.
	var list io.Writer
	if sel.dryRun {
		list = stdout
	}
	plan, err := kafka.Redrive(ctx, cl, kf.dlq, append(opts, kafka.WithDryRun(list))...)
	if err != nil {
		return err
	}
	printPlan(stdout, plan, allow, topic)
	if sel.dryRun || !yes {
		if !sel.dryRun && plan.Moved > 0 {
			fmt.Fprintln(stdout, "nothing moved: run again with -yes to move them")
		}
		return nil
	}
	st, err := kafka.Redrive(ctx, cl, kf.dlq, opts...)
	fmt.Fprintf(stdout, "moved %d of %d dead letters (%d not selected, %d repeated delivery ids, %d to topics not allowed, %d cut)\n",
		st.Moved, st.Read, st.Skipped, st.Repeated, st.NotAllowed, st.Cut)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("interrupted after moving %d dead letters (rerun with the same -group to move the rest): %w", st.Moved, err)
	}
	return err
}

// printPlan prints what a redrive would move.
func printPlan(w io.Writer, st kafka.RedriveStats, allow []string, topic string) {
	fmt.Fprintf(w, "would move %d of %d dead letters (%d not selected, %d repeated delivery ids, %d to topics not allowed, %d cut)\n",
		st.Moved, st.Read, st.Skipped, st.Repeated, st.NotAllowed, st.Cut)
	allowed := map[string]bool{topic: topic != ""}
	for _, a := range allow {
		allowed[a] = true
	}
	for _, m := range st.Moves {
		note := ""
		if !allowed[m.Topic] {
			note = " (not allowed: name it with -allow-topic)"
		}
		fmt.Fprintf(w, "  -> %s\tclass %s\t%d dead letters, dead-lettered %s to %s%s\n", m.Topic, m.Class, m.Count,
			m.First.UTC().Format(time.RFC3339), m.Last.UTC().Format(time.RFC3339), note)
	}
}

func dlqList(ctx context.Context, r *redactor, args []string, stdout, stderr io.Writer) error {
	const cmd = "dlq list"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var (
		sel   selection
		kf    kafkaFlags
		group string
	)
	sel.register(fs)
	kf.register(fs)
	fs.StringVar(&group, "group", "", "list from this redrive group's committed offsets (what a redrive with it would read)")
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return helpOK(err)
	}
	opts, err := redriveSelection(sel, group)
	if err != nil {
		fmt.Fprintln(stderr, "effectively dlq list:", err)
		return errUsage
	}
	cl, err := kf.client(cmd, r, stderr)
	if err != nil {
		return err
	}
	defer cl.Close()
	st, err := kafka.Redrive(ctx, cl, kf.dlq, append(opts, kafka.WithDryRun(stdout))...)
	if err != nil {
		return err
	}
	byClass, byDest := map[string]int{}, map[string]int{}
	for _, m := range st.Moves {
		byClass[m.Class] += m.Count
		byDest[m.Topic] += m.Count
	}
	fmt.Fprintf(stdout, "%d dead letters listed of %d read (%d not selected, %d repeated delivery ids, %d cut, %d without a destination)\n",
		st.Moved+st.Cut+st.NoDestination, st.Read, st.Skipped, st.Repeated, st.Cut, st.NoDestination)
	printCounts(stdout, "class", byClass)
	printCounts(stdout, "destination", byDest)
	return nil
}

// redriveSelection returns the Redrive options of sel and group.
func redriveSelection(sel selection, group string) ([]kafka.RedriveOption, error) {
	from, to, err := sel.times()
	if err != nil {
		return nil, err
	}
	opts := []kafka.RedriveOption{kafka.WithTimeRange(from, to)}
	if classes, ids := split(sel.class), split(sel.ids); len(classes) > 0 || len(ids) > 0 {
		opts = append(opts, kafka.WithFilter(func(d kafka.DeadLetter) bool {
			return (len(classes) == 0 || slices.Contains(classes, d.Class)) && (len(ids) == 0 || slices.Contains(ids, d.ID))
		}))
	}
	if sel.count > 0 {
		opts = append(opts, kafka.WithLimit(sel.count))
	}
	if group != "" {
		opts = append(opts, kafka.WithGroup(group))
	}
	return opts, nil
}

func printCounts(w io.Writer, what string, counts map[string]int) {
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		name := k
		if name == "" {
			name = "(none)"
		}
		fmt.Fprintf(w, "  %s %s: %d\n", what, name, counts[k])
	}
}

func outboxCmd(ctx context.Context, r *redactor, verb string, args []string, stdout, stderr io.Writer) error {
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
		all               bool
	)
	sel.register(fs)
	sel.registerDryRun(fs)
	fs.StringVar(&db, "db", "", "PostgreSQL connection string of the outbox's database (default $"+envDatabaseURL+", else the PG* variables)")
	fs.StringVar(&topic, "topic", "", "select the rows of this topic")
	fs.StringVar(&msgIDs, "message-id", "", "select these message ids (comma-separated)")
	fs.BoolVar(&all, "all", false, "retry or drop every parked row (retry and drop refuse to run without a selection)")
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return helpOK(err)
	}
	if verb != "list" && !all && !sel.any() && topic == "" && msgIDs == "" {
		fmt.Fprintf(stderr, "effectively outbox %s: no selection: name the rows (-from, -to, -class, -topic, -id, -message-id, -count), or say -all to %s every parked row\n", verb, verb)
		return errUsage
	}
	dsn, err := databaseURL(db, r)
	if err != nil {
		fmt.Fprintf(stderr, "effectively outbox: %v\n", err)
		return errUsage
	}
	f := outbox.ParkedFilter{Topic: topic, Class: sel.class, Limit: sel.count}
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
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if verb == "list" || sel.dryRun {
		ps, err := f.List(ctx, pool)
		if err != nil {
			return err
		}
		for _, p := range ps {
			fmt.Fprintf(stdout, "%d\t%s\t%s\t%s\t%d attempts\tparked %s\t%s\n", p.ID, ratelog.Bound(string(p.MessageID)), p.Topic, p.Class,
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
		n, err = f.Retry(ctx, pool)
		fmt.Fprintf(stdout, "returned %d parked rows to the relays\n", n)
	} else {
		n, err = f.Drop(ctx, pool)
		fmt.Fprintf(stdout, "dropped %d parked rows\n", n)
	}
	return err
}

// pgEnv lists the libpq environment variables that can name a database
// on their own.
var pgEnv = []string{"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE"}

// databaseURL returns the connection string: flag, else $DATABASE_URL,
// else "" when a PG* variable is set (pgx reads them). Its password, and
// $PGPASSWORD, are added to r.
func databaseURL(flagValue string, r *redactor) (string, error) {
	r.add(os.Getenv("PGPASSWORD"))
	dsn := flagValue
	if dsn == "" {
		dsn = os.Getenv(envDatabaseURL)
	}
	if dsn == "" {
		for _, v := range pgEnv {
			if os.Getenv(v) != "" {
				return "", nil
			}
		}
		return "", fmt.Errorf("no database: set $%s (or the PG* variables), or pass -db", envDatabaseURL)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return "", fmt.Errorf("the database URL does not parse (%s)", r.text(strings.ReplaceAll(err.Error(), dsn, "<url>")))
	}
	r.add(cfg.ConnConfig.Password)
	return dsn, nil
}
