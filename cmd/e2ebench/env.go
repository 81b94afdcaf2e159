package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"effectively.dev/internal/machine"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// env is what every run shares: the clusters and the commit counter.
type env struct {
	pg        *pgtest.Cluster
	pgVersion string
	kafka     *kafkatest.Cluster

	mu      sync.Mutex
	commits map[string]int // OffsetCommit requests per group
}

func start(ctx context.Context, logf func(string, ...any)) (*env, error) {
	logf("starting a durable throwaway PostgreSQL cluster (fsync on) and kfake")
	pg, err := pgtest.New(pgtest.Options{Durable: true})
	if err != nil {
		return nil, err
	}
	e := &env{pg: pg, commits: map[string]int{}}
	conn, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		e.close()
		return nil, err
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, `SHOW server_version`).Scan(&e.pgVersion); err != nil {
		e.close()
		return nil, err
	}
	if e.kafka, err = kafkatest.New(); err != nil {
		e.close()
		return nil, err
	}
	if e.kafka.Fake == nil {
		e.close()
		return nil, fmt.Errorf("counting OffsetCommit requests needs kfake; unset %s", "KAFKA_BROKERS")
	}
	e.kafka.Fake.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.Fake.KeepControl()
		if r, ok := req.(*kmsg.OffsetCommitRequest); ok {
			e.mu.Lock()
			e.commits[r.Group]++
			e.mu.Unlock()
		}
		return nil, nil, false // counted, not handled: the broker commits as usual
	})
	return e, nil
}

func (e *env) close() {
	if e.kafka != nil {
		e.kafka.Close()
	}
	if e.pg != nil {
		_ = e.pg.Stop()
	}
}

func (e *env) commitsOf(group string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.commits[group]
}

// event is one payment event, the value of every record.
type event struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Cents   int64  `json:"cents"`
}

// result is one variant's run.
type result struct {
	rate    float64 // events/s, first handled event to last
	commits int     // OffsetCommit requests of the run, the last ones (on close, after the last poll) included
	// cpu is the machine's busy CPU time per event from the first handled
	// event to the last (0 where /proc/stat cannot be read); procCPU this
	// process's (kfake included), over the same span.
	cpu, procCPU time.Duration
	// Per event, over the whole run: messages the pool's connections wrote
	// to PostgreSQL (round trips: a pipeline is one), transactions
	// committed in the run's database, WAL flushes (fsyncs) and WAL bytes
	// of the cluster.
	roundTrips, xacts, walSyncs, walBytes float64
}

// pgStats are the server's counters that result reads per event.
type pgStats struct{ commits, walSyncs, walBytes int64 }

// readPGStats reads the run's database's commits and the cluster's WAL
// counters. Backends report them when they go idle or exit; the caller
// reads after the run's pool closed.
func readPGStats(ctx context.Context, url string) (pgStats, error) {
	var s pgStats
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return s, err
	}
	defer conn.Close(context.Background())
	err = conn.QueryRow(ctx, `SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
		wal_sync, wal_bytes::bigint FROM pg_stat_wal`).Scan(&s.commits, &s.walSyncs, &s.walBytes)
	return s, err
}

// countingConn counts the messages written on a connection to PostgreSQL.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

// processCPU is the CPU time this process used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runEnv is one run of one variant: its topic, group, tables and scope.
type runEnv struct {
	cfg                 config
	brokers             []kgo.Opt
	topic, group, scope string
	ledger, seen        string // tables
	db, url             string // the run's own database
	pool                *pgxpool.Pool
	progress            *progress
	writes              atomic.Int64 // messages written to PostgreSQL by pool
}

// progress counts handled events and stamps the first and the last, in
// wall time and in the machine's busy CPU time.
type progress struct {
	target              int64
	n                   atomic.Int64
	first, last         time.Time
	cpuFirst, cpuLast   time.Duration
	procFirst, procLast time.Duration
	once                sync.Once
	done                chan struct{}
}

func newProgress(target int) *progress {
	return &progress{target: int64(target), done: make(chan struct{})}
}

// handled counts k handled events.
func (p *progress) handled(k int) {
	if k == 0 {
		return
	}
	now := time.Now()
	p.once.Do(func() { p.first, p.cpuFirst, p.procFirst = now, busyCPU(), processCPU() })
	if n := p.n.Add(int64(k)); n >= p.target && n-int64(k) < p.target {
		p.last, p.cpuLast, p.procLast = now, busyCPU(), processCPU()
		close(p.done)
	}
}

// busyCPU is machine.BusyCPU, 0 where it cannot be read.
func busyCPU() time.Duration {
	d, _ := machine.BusyCPU()
	return d
}

// runVariant prepares a topic and tables, drains them with the variant,
// and checks the ledger and the committed offsets.
func (e *env) runVariant(ctx context.Context, cfg config, name string, round int) (result, error) {
	tag := fmt.Sprintf("%s_%d", variantTag(name), round)
	topic, err := e.kafka.CreateTopic(ctx, "e2e-"+tag, int32(cfg.partitions))
	if err != nil {
		return result{}, err
	}
	if err := e.produce(ctx, topic, cfg); err != nil {
		return result{}, err
	}
	r := &runEnv{
		cfg: cfg, brokers: e.kafka.Opts(), topic: topic, group: "g-" + topic, scope: "e2e-" + tag,
		ledger: "ledger_" + tag, seen: "processed_events_" + tag, db: "run_" + tag, url: e.pg.URL("run_" + tag),
		progress: newProgress(cfg.events),
	}
	if err := e.prepareTables(ctx, r); err != nil {
		return result{}, err
	}
	pcfg, err := pgxpool.ParseConfig(r.url)
	if err != nil {
		return result{}, err
	}
	pcfg.MaxConns = int32(cfg.pool)
	pcfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, n: &r.writes}, nil
	}
	before, err := readPGStats(ctx, r.url)
	if err != nil {
		return result{}, err
	}
	if r.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return result{}, err
	}
	defer r.pool.Close()

	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go pprof.Do(runCtx, pprof.Labels("variant", name), func(ctx context.Context) { errc <- variants[name](ctx, r) })
	select {
	case <-r.progress.done:
		cancel()
		err = <-errc
	case err = <-errc:
		cancel()
		if err == nil {
			err = fmt.Errorf("stopped after %d of %d events", r.progress.n.Load(), cfg.events)
		}
	case <-time.After(10 * time.Minute):
		cancel()
		<-errc
		err = fmt.Errorf("timed out after %d of %d events", r.progress.n.Load(), cfg.events)
	}
	if err != nil {
		return result{}, err
	}
	writes := r.writes.Load() // before check's queries
	if err := e.check(ctx, r); err != nil {
		return result{}, err
	}
	r.pool.Close()
	after, err := readPGStats(ctx, r.url)
	if err != nil {
		return result{}, err
	}
	el := r.progress.last.Sub(r.progress.first)
	n := float64(cfg.events)
	res := result{rate: float64(cfg.events-1) / el.Seconds(), commits: e.commitsOf(r.group),
		roundTrips: float64(writes) / n, xacts: float64(after.commits-before.commits) / n,
		walSyncs: float64(after.walSyncs-before.walSyncs) / n, walBytes: float64(after.walBytes-before.walBytes) / n}
	if r.progress.cpuFirst > 0 && r.progress.cpuLast > 0 {
		res.cpu = (r.progress.cpuLast - r.progress.cpuFirst) / time.Duration(cfg.events-1)
	}
	res.procCPU = (r.progress.procLast - r.progress.procFirst) / time.Duration(cfg.events-1)
	return res, nil
}

// produce writes cfg.events events round robin over the partitions, each
// with its id in the kafka.KeyHeader header (Delivery.ID).
func (e *env) produce(ctx context.Context, topic string, cfg config) error {
	cl, err := kgo.NewClient(e.kafka.Opts(kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(1<<20))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	recs := make([]*kgo.Record, cfg.events)
	for i := range recs {
		ev := event{ID: fmt.Sprintf("evt-%06d", i), Account: fmt.Sprintf("acct-%03d", i%100), Cents: int64(100 + i%9000)}
		v, _ := json.Marshal(ev)
		recs[i] = &kgo.Record{Topic: topic, Partition: int32(i % cfg.partitions), Value: v,
			Headers: []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte(ev.ID)}}}
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// prepareTables creates the run's database (every variant starts alike:
// new tables, never analyzed, as a deployment's first day), the library's
// tables and the run's, and checkpoints, so that no run pays for the
// previous one's dirty buffers.
func (e *env) prepareTables(ctx context.Context, r *runEnv) error {
	if err := e.pg.CreateDatabase(ctx, r.db); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, r.url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if err := postgres.Migrate(ctx, conn); err != nil {
		return err
	}
	for _, sql := range []string{
		`CREATE TABLE ` + r.ledger + ` (id bigserial PRIMARY KEY, event_id text NOT NULL, account text NOT NULL, cents bigint NOT NULL)`,
		`CREATE TABLE ` + r.seen + ` (event_id text PRIMARY KEY, processed_at timestamptz NOT NULL)`,
		`CHECKPOINT`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

// check requires every event's ledger row exactly once and the group's
// offsets committed to the end of every partition.
func (e *env) check(ctx context.Context, r *runEnv) error {
	var rows, distinct int
	err := r.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+r.ledger).Scan(&rows, &distinct)
	if err != nil {
		return err
	}
	if rows != r.cfg.events || distinct != r.cfg.events {
		return fmt.Errorf("ledger holds %d rows for %d events, want %d each exactly once", rows, distinct, r.cfg.events)
	}
	cl, err := kgo.NewClient(e.kafka.Opts()...)
	if err != nil {
		return err
	}
	defer cl.Close()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, r.group)
	if err != nil {
		return err
	}
	var total int64
	offs.Each(func(o kadm.OffsetResponse) { total += o.At })
	if total != int64(r.cfg.events) {
		return fmt.Errorf("group committed %d records of %d", total, r.cfg.events)
	}
	return nil
}
