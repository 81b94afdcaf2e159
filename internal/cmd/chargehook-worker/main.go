// Command chargehook-worker runs only the worker of the chargehook demo, as
// a process of its own, against a Kafka cluster and a PostgreSQL database
// that outlive it: an consume.Consumer over a kafka.Source that runs, for
// every payment event in the input topic, an effects.Plan of two steps:
//
//   - "ledger": a row in the chargehook_worker_ledger table, written by
//     postgres.New in the transaction that claims the event's key
//     (effectively once; the table has no unique index, so only the dedup
//     row keeps a second row out);
//   - "charged-event": a record in the output topic, produced by
//     kafka.NewProducer with a postgres.NewJournal sent-record (at least
//     once: a crash after the broker's ack and before the journal records
//     it produces the record again once the lease expires). Its value
//     names the ledger row, so a replayed plan must rebuild it from the
//     recorded ledger id.
//
// It acks a record only after both steps are done; the Source's group
// commit then commits its offset, with the others acked meanwhile. It runs until SIGTERM or SIGINT, then stops taking records, lets
// running handlers finish, commits the acked offsets and exits 0. Killed
// (SIGKILL), it leaves its unacked records to the next process of the group,
// whose deliveries replay whatever was already done.
//
// It is the process internal/torture kills at random points; it also runs
// by hand, for example on the webhook topic of a chargehook run against an
// existing cluster:
//
//	chargehook-worker -brokers 127.0.0.1:9092 -database-url postgres://... \
//	    -topic webhooks -output charged -group workers -migrate
//
// Input records carry a JSON chargehook event ({"id", "account", "email",
// "cents"}); the delivery id, and so every key, is the event id.
//
// What cannot be a payment is poison (internal/payment.Decode: bad JSON, a
// string amount, an amount past int64, an empty id or one that is not
// valid UTF-8, no account, an amount that is not positive or over
// payment.MaxCents), and so is an event whose key was used with another
// amount (effects.ErrKeyReused): the consumer hands it at its first attempt
// to the dead-letter hook, which inserts it into the
// chargehook_worker_dead_letters table, once per input record (its
// topic/partition/offset is the primary key, so a redelivered dead letter
// is not inserted twice), and the record is acked: the events behind it in
// its partition go on. Other failures (the database down, a key leased by a
// crashed attempt) are retried, -max-attempts times with backoff; past
// that, the hook refuses them, so the record stays unacked and the consumer
// keeps retrying it every half second: an outage is waited out, never
// dead-lettered.
//
// Flags worth knowing:
//
//   - -instance-id makes the process a static group member (KIP-345): a
//     restart with the same id takes over the old member's partitions at
//     once. Without it, a worker restarted after a crash gets no partitions
//     until the dead member's session times out (franz-go's default: 45 s),
//     and its partitions stall that long.
//   - -lease bounds how long a crash during the output step blocks the
//     event's key: the next attempt gets effects.ErrInFlight, and the
//     consumer retries it, holding back its partition, until the lease
//     expires (journal.WithLease; the adapter's own default is
//     journal.WithLease's default, a minute).
//   - -session-timeout, -rebalance-timeout and -heartbeat-interval set the
//     group's timing (franz-go's defaults otherwise); the rebalance torture
//     runs three workers with a 3 s session, so a frozen worker is dropped
//     quickly.
//   - -max-attempts is the consumer's attempt budget before a failure goes
//     to the dead-letter hook (which takes only poison; see above).
//   - -trace writes one line per step to stdout, for the torture test (the
//     format is documented on the tracer type).
//   - -ack-first acks every record before running its plan: the mistake
//     that ack-after-commit exists to prevent, there for the torture test's
//     negative control. A crash between the ack and the ledger's commit
//     loses the event. Never use it otherwise.
//
// Exit status: 0 after a clean shutdown, 1 when the consumer or its setup
// failed, 2 for bad usage.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/effects/journal"
	"effectively.dev/internal/payment"
	"effectively.dev/kafka"
	"effectively.dev/postgres"
)

// Step names; they are part of the keys, so they never change.
const (
	stepLedger = "ledger"
	stepOutput = "charged-event"
)

// ledgerDDL is the worker's business table. No unique index on event_id:
// counting rows per event shows whether the dedup row kept duplicates out.
const ledgerDDL = `CREATE TABLE IF NOT EXISTS chargehook_worker_ledger (
	id       bigserial PRIMARY KEY,
	event_id text        NOT NULL,
	account  text        NOT NULL,
	cents    bigint      NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now()
)`

// deadLetterDDL is where poison records go: one row per input record.
const deadLetterDDL = `CREATE TABLE IF NOT EXISTS chargehook_worker_dead_letters (
	position    text PRIMARY KEY, -- topic/partition/offset of the input record
	delivery_id text        NOT NULL,
	reason      text        NOT NULL,
	body        bytea,
	created_at  timestamptz NOT NULL DEFAULT now()
)`

// ledgerLockID serializes -migrate runs of concurrent workers.
const ledgerLockID int64 = 0x63686b776f726b72 // "chkworkr"

// event is the JSON of a chargehook webhook record (chargehook.Event).
type event = payment.Event

type config struct {
	brokers, databaseURL, topic, output, group, instanceID, scope string
	concurrency, maxAttempts                                      int
	lease, grace                                                  time.Duration
	session, rebalance, heartbeat                                 time.Duration
	migrate, trace, ackFirst                                      bool
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("chargehook-worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addCommonFlags(fs, &cfg, "consumer group", "handlers running at once (at most one per partition)")
	fs.StringVar(&cfg.instanceID, "instance-id", "", "static group membership id (a restart takes over at once); empty: dynamic membership")
	fs.IntVar(&cfg.maxAttempts, "max-attempts", 10, "attempts before a failure goes to the dead-letter hook (which takes only poison)")
	fs.DurationVar(&cfg.session, "session-timeout", 0, "group session timeout (0: franz-go's default, 45s)")
	fs.DurationVar(&cfg.rebalance, "rebalance-timeout", 0, "group rebalance timeout (0: franz-go's default, 60s)")
	fs.DurationVar(&cfg.heartbeat, "heartbeat-interval", 0, "group heartbeat interval (0: franz-go's default, 3s)")
	fs.BoolVar(&cfg.ackFirst, "ack-first", false, "NEGATIVE CONTROL: ack each record before applying it (loses events on a crash)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg.fromEnv()
	missing := cfg.missingFlags()
	if len(missing) > 0 || fs.NArg() > 0 || cfg.concurrency < 1 || cfg.maxAttempts < 1 {
		fmt.Fprintf(stderr, "chargehook-worker: need %s (and no arguments, a positive -concurrency and -max-attempts)\n", strings.Join(missing, ", "))
		fs.Usage()
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := work(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "chargehook-worker:", err)
		return 1
	}
	return 0
}

// work runs the consumer until ctx is done.
func work(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	tr := &tracer{w: stdout, on: cfg.trace}

	pool, producer, brokers, closeBackends, err := openBackends(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeBackends()

	h, err := newHandler(pool, producer, cfg, tr)
	if err != nil {
		return err
	}

	opts := []kgo.Opt{brokers, kgo.ConsumerGroup(cfg.group), kgo.ConsumeTopics(cfg.topic), kgo.FetchMaxWait(100 * time.Millisecond)}
	if cfg.instanceID != "" {
		opts = append(opts, kgo.InstanceID(cfg.instanceID))
	}
	for _, o := range []struct {
		d   time.Duration
		opt func(time.Duration) kgo.GroupOpt
	}{{cfg.session, kgo.SessionTimeout}, {cfg.rebalance, kgo.RebalanceTimeout}, {cfg.heartbeat, kgo.HeartbeatInterval}} {
		if o.d > 0 {
			opts = append(opts, o.opt(o.d))
		}
	}
	src, err := kafka.NewSource(opts, kafka.WithLogger(stderrLogger(stderr, "chargehook-worker")))
	if err != nil {
		return err
	}
	h.src = &tracingSource{Source: src, tr: tr}

	c, err := consume.New(h.src, h.handle,
		consume.WithConcurrency(cfg.concurrency),
		// Poison goes to the dead-letter hook at once; anything else is
		// retried -max-attempts times, then kept (the hook refuses it)
		// and retried every max backoff: after a crash a key can stay
		// leased (ErrInFlight) until its lease expires, and an outage must
		// hold back its partition, not be dead-lettered.
		consume.WithMaxAttempts(cfg.maxAttempts),
		consume.WithBackoff(10*time.Millisecond, 500*time.Millisecond),
		consume.WithDeadLetter(h.deadLetter),
		consume.WithShutdownGrace(cfg.grace),
		consume.WithObserver(effects.ObserverFunc(func(_ context.Context, ev effects.Event) {
			if ev.Kind != effects.EventDeadLettered {
				tr.line("retry", ev.DeliveryID, cause(ev.Err))
			}
		})),
	)
	if err != nil {
		src.Close()
		return err
	}
	tr.line("ready")
	runErr := c.Run(ctx)
	closeErr := src.Close() // commits the acked offsets
	s := c.Stats()
	fmt.Fprintf(stderr, "chargehook-worker: stopped: %d delivered, %d acked, %d retried, %d dead-lettered, %d dropped (revoked), %d failed\n",
		s.Delivered, s.Acked, s.Retried, s.DeadLettered, s.Dropped, s.Failed)
	tr.line("stopped")
	if runErr != nil {
		return runErr
	}
	if closeErr != nil {
		return fmt.Errorf("committing offsets on shutdown: %w", closeErr)
	}
	return nil
}

// addCommonFlags defines the flags both modes take, into cfg: where the
// events come from and go to, the keys' scope, the handlers, the lease,
// the shutdown grace, -migrate and -trace. group says which kind of group
// -group names; concurrency documents -concurrency.
func addCommonFlags(fs *flag.FlagSet, cfg *config, group, concurrency string) {
	// The environment is read after the flags (fromEnv), not as their
	// defaults: a default is printed in the usage text, and DATABASE_URL
	// holds a password.
	fs.StringVar(&cfg.brokers, "brokers", "", "Kafka seed brokers, host:port[,host:port...] (default $KAFKA_BROKERS)")
	fs.StringVar(&cfg.databaseURL, "database-url", "", "PostgreSQL connection URL (default $DATABASE_URL)")
	fs.StringVar(&cfg.topic, "topic", "", "input topic of payment events")
	fs.StringVar(&cfg.output, "output", "", "output topic for the \"charged\" records")
	fs.StringVar(&cfg.group, "group", "", group)
	fs.StringVar(&cfg.scope, "scope", "chargehook-worker", "scope of the idempotency keys")
	fs.IntVar(&cfg.concurrency, "concurrency", 8, concurrency)
	fs.DurationVar(&cfg.lease, "lease", 2*time.Second, "journal lease of the output step: how long a crashed attempt blocks its key")
	fs.DurationVar(&cfg.grace, "grace", 5*time.Second, "shutdown grace for running handlers after SIGTERM")
	fs.BoolVar(&cfg.migrate, "migrate", false, "create the tables (postgres.Migrate and the ledger) before consuming")
	fs.BoolVar(&cfg.trace, "trace", false, "write one line per step to stdout (for internal/torture)")
}

// fromEnv fills the flags that default to the environment and were not
// given: -brokers from KAFKA_BROKERS, -database-url from DATABASE_URL.
func (cfg *config) fromEnv() {
	if cfg.brokers == "" {
		cfg.brokers = os.Getenv("KAFKA_BROKERS")
	}
	if cfg.databaseURL == "" {
		cfg.databaseURL = os.Getenv("DATABASE_URL")
	}
}

// missingFlags names the required flags that are empty.
func (cfg config) missingFlags() []string {
	var missing []string
	for _, f := range []struct{ name, v string }{
		{"-brokers", cfg.brokers}, {"-database-url", cfg.databaseURL}, {"-topic", cfg.topic}, {"-output", cfg.output}, {"-group", cfg.group},
	} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	return missing
}

// openBackends opens the worker's database pool (migrating it with
// -migrate) and its producer client, and returns the seed brokers' option
// for the consumer; closeBackends closes both.
func openBackends(ctx context.Context, cfg config) (pool *pgxpool.Pool, producer *kgo.Client, brokers kgo.Opt, closeBackends func(), err error) {
	pcfg, err := pgxpool.ParseConfig(cfg.databaseURL)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("-database-url: %w", err)
	}
	if !strings.Contains(cfg.databaseURL, "pool_max_conns") {
		// A handler holds one connection for the ledger's transaction and
		// one for each journal call; the default (4 on 2 cores) would make
		// the handlers wait for each other.
		pcfg.MaxConns = int32(2*cfg.concurrency + 2)
	}
	pool, err = pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if cfg.migrate {
		if err := migrate(ctx, pool); err != nil {
			pool.Close()
			return nil, nil, nil, nil, err
		}
	}
	brokers = kgo.SeedBrokers(strings.Split(cfg.brokers, ",")...)
	// Linger 0: every handler waits for its own record, so batching across
	// handlers buys nothing and lingering would add to every event.
	producer, err = kgo.NewClient(brokers, kgo.ProducerLinger(0))
	if err != nil {
		pool.Close()
		return nil, nil, nil, nil, err
	}
	return pool, producer, brokers, func() { producer.Close(); pool.Close() }, nil
}

// migrate creates the library's tables and the ledger.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := postgres.Migrate(ctx, pool); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", ledgerLockID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, ledgerDDL); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, deadLetterDDL)
		return err
	})
}

// handler runs the plan for one delivery.
type handler struct {
	pool     *pgxpool.Pool
	scope    string
	ledger   *postgres.Effect[ledgerRow]
	output   *kafka.Producer
	plan     *effects.Plan[event] // defined once, run per delivery
	src      *tracingSource
	ackFirst bool
	tr       *tracer
	// attempts counts the attempts started per delivery (by its Token,
	// which the consumer keeps across retries), for the trace.
	attempts sync.Map
}

// ledgerRow is the ledger step's input.
type ledgerRow struct {
	EventID, Account string
	Cents            int64
}

func newHandler(pool *pgxpool.Pool, producer *kgo.Client, cfg config, tr *tracer) (*handler, error) {
	jrnl, err := postgres.NewJournal(pool, cfg.scope)
	if err != nil {
		return nil, err
	}
	ledger, err := postgres.New(pool, cfg.scope, func(ctx context.Context, tx pgx.Tx, in ledgerRow) (id string, err error) {
		err = tx.QueryRow(ctx, `INSERT INTO chargehook_worker_ledger (event_id, account, cents) VALUES ($1, $2, $3) RETURNING id::text`,
			in.EventID, in.Account, in.Cents).Scan(&id)
		return id, err
	})
	if err != nil {
		return nil, err
	}
	output, err := kafka.NewProducer(producer, cfg.output, kafka.WithJournal(jrnl, journal.WithLease(cfg.lease)))
	if err != nil {
		return nil, err
	}
	h := &handler{pool: pool, scope: cfg.scope, ledger: ledger, output: output, ackFirst: cfg.ackFirst, tr: tr}
	if h.plan, err = h.newPlan(); err != nil {
		return nil, err
	}
	return h, nil
}

// charged is the value of an output record.
type charged struct {
	Event       string `json:"event"`
	LedgerEntry string `json:"ledger_entry"`
	Cents       int64  `json:"cents"`
}

// newPlan defines the worker's two effects once, as functions of the event.
func (h *handler) newPlan() (*effects.Plan[event], error) {
	p, err := effects.NewPlan(h.scope,
		effects.NewStep(stepLedger, h.ledger, func(ev event, _ effects.Results) (ledgerRow, error) {
			return ledgerRow{EventID: ev.ID, Account: ev.Account, Cents: ev.Cents}, nil
		}),
		effects.NewStep(stepOutput, h.output, func(ev event, done effects.Results) (kafka.Message, error) {
			id := done[stepLedger].Ref
			if id == "" {
				return kafka.Message{}, errors.New("no ledger id from the ledger step")
			}
			v, err := json.Marshal(charged{Event: ev.ID, LedgerEntry: id, Cents: ev.Cents})
			return kafka.Message{Key: []byte(ev.ID), Value: v,
				Headers: []kgo.RecordHeader{{Key: "event-id", Value: []byte(ev.ID)}}}, err
		}),
	)
	if err != nil {
		return nil, err
	}
	return p.WithObserver(effects.ObserverFunc(func(_ context.Context, e effects.Event) {
		h.tr.line("step", e.DeliveryID, e.Step, e.Kind.String())
	})), nil
}

// handle is the consume.Handler.
func (h *handler) handle(ctx context.Context, d effects.Delivery) (err error) {
	if h.tr.on {
		n := 1
		if v, ok := h.attempts.Load(d.Token); ok {
			n = v.(int) + 1
		}
		h.attempts.Store(d.Token, n)
		defer func() {
			if err == nil {
				h.attempts.Delete(d.Token)
			}
		}()
		h.tr.line("begin", d.ID, strconv.Itoa(n))
	}
	ev, err := payment.Decode(d.Body) // poison: dead-lettered at once
	if err != nil {
		return err
	}
	if h.ackFirst {
		// The negative control: the offset is committed before any effect.
		// Ack only marks the record (the group commit follows within the
		// commit interval); Flush commits it now, as a consumer that
		// commits before its effect does.
		if err := h.src.Ack(ctx, d); err != nil {
			return err
		}
		if err := h.src.Flush(ctx); err != nil {
			return err
		}
	}
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = h.plan.Run(hctx, ev.ID, ev)
	return err
}

// deadLetter is the consumer's dead-letter hook. It takes poison (see the
// package doc) into the dead-letters table, once per input record, and
// refuses every other failure, which so stays unacked and is retried.
func (h *handler) deadLetter(ctx context.Context, d effects.Delivery, cause error) error {
	if effects.ClassOf(cause) != effects.Permanent {
		return fmt.Errorf("not dead-lettering a failure that may heal; retrying: %w", cause)
	}
	rec, ok := kafka.Record(d)
	if !ok {
		return errors.New("dead letter: not a Kafka delivery")
	}
	pos := fmt.Sprintf("%s/%d/%d", rec.Topic, rec.Partition, rec.Offset)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := h.pool.Exec(ctx, `INSERT INTO chargehook_worker_dead_letters (position, delivery_id, reason, body)
		VALUES ($1, $2, $3, $4) ON CONFLICT (position) DO NOTHING`,
		pos, pgText(d.ID), pgText(cause.Error()), d.Body); err != nil {
		return fmt.Errorf("dead letter %s: %w", pos, err)
	}
	h.tr.line("dead", pos)
	return nil
}

// pgText makes s storable as PostgreSQL text, which refuses NUL bytes and
// invalid UTF-8 (the body column keeps the exact bytes).
func pgText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", `\x00`)
}

// tracingSource traces every successful Ack.
type tracingSource struct {
	*kafka.Source
	tr *tracer
}

func (s *tracingSource) Ack(ctx context.Context, d effects.Delivery) error {
	err := s.Source.Ack(ctx, d)
	if err == nil {
		s.tr.line("acked", d.ID)
	}
	return err
}

// tracer writes the -trace lines to stdout, each with one write so that a
// line is whole even when the process is killed right after it. The lines,
// fields separated by one space:
//
//	ready                          the consumer is about to run
//	begin <id> <attempt>           a handler started attempt <attempt> (from 1) at a delivery of event <id>
//	step <id> <step> <kind>        a plan step ended: applied, replayed, in_flight, failed, key_reused
//	acked <id>                     Ack returned nil: the next group commit commits the offset (unless an earlier one is unacked)
//	retry <id> <cause>             the consumer will try the delivery again
//	dead <topic/partition/offset>  the dead-letter hook stored the record (poison)
//	stopped                        the consumer stopped after SIGTERM
type tracer struct {
	w  io.Writer
	on bool
	mu sync.Mutex
}

func (t *tracer) line(fields ...string) {
	if !t.on {
		return
	}
	b := []byte(strings.Join(fields, " ") + "\n")
	t.mu.Lock()
	defer t.mu.Unlock()
	_, _ = t.w.Write(b)
}

// cause names an attempt's failure in one word.
func cause(err error) string {
	for _, k := range []struct {
		err  error
		name string
	}{{effects.ErrInFlight, "in_flight"}, {effects.ErrAmbiguous, "ambiguous"}, {effects.ErrTransient, "transient"}} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	if err == nil {
		return "none"
	}
	return "other:" + strconv.Quote(err.Error())
}

// stderrLogger is the logger of the sources' own failures (rate-limited
// by the sources): text lines on stderr, naming the worker.
func stderrLogger(stderr io.Writer, worker string) *slog.Logger {
	return slog.New(slog.NewTextHandler(stderr, nil)).With("worker", worker)
}
