// Package chargehook is the billing pipeline of the essay this project
// comes from, built from real parts and run twice on one seeded fault
// schedule: once with the naive handler, once with an [effects.Plan] of
// effectively-once adapters. It counts, in every backend, what each did.
//
// The pipeline, every arrow a real network hop on 127.0.0.1, numbered as
// in the essay:
//
//	[processor] -> [load balancer] -> [pod A | pod B] -> [Kafka] -> [worker] -> [effects]
//	            (1)                (2)                (3)        (4)         (5)
//
// The worker is an consume.Consumer over a kafka.Source; the effects are a
// Stripe PaymentIntent, a Postgres ledger row, an S3 receipt, a Kafka
// "charged" event and an email receipt. The schedule makes the duplicates
// the essay names:
//
//   - (1) the processor does not get the 200 for an event a pod already
//     queued, and sends it again later: a sequential duplicate;
//   - (2) the pod the balancer picked freezes in a GC pause past the
//     per-try timeout; the balancer retries on the sibling, and the frozen
//     pod enqueues too when it thaws: a concurrent duplicate;
//   - (4) the worker crashes after the effects committed and before the
//     ack, so the consumer delivers the message again: a redelivery;
//   - (5) the PostgreSQL primary dies in the middle of the run with
//     handlers in flight and its synchronous standby is promoted; the
//     worker's pool follows through a multi-host URL with
//     target_session_attrs=read-write, and every attempt the failover
//     broke is retried.
//
// The naive handler is the essay's: check a dedup table, do the effects,
// mark the event seen, each in its own transaction or request; a Stripe
// call with a fresh idempotency key per attempt, a plain S3 PUT, a produce
// without a record, a send without a record. The effectively-once handler
// runs the same effects as a Plan of four steps: stripe.PaymentIntents
// (Stripe's Idempotency-Key, the object id kept in a journal),
// postgres.Effect (the dedup row in the ledger's transaction, and in the
// same transaction the "charged" event as a row of kafka/outbox, which an
// outbox.Relay publishes), s3.Writer (If-None-Match: *) and email.Sender
// (with a journal). The charged event and the email are at-least-once by
// contract, duplicates only after an unknown outcome (the relay's: after
// the broker's ack, before the rows are marked sent). It runs the charge
// and the ledger row in order, then the receipt and the email, which need
// only those two results, concurrently (effects.Step.Concurrent): every
// step keeps its key, so this changes nothing about what a redelivery
// replays, and the plan's composite contract is the one reported. An event
// is handled once its steps are done; the relay publishes its charged
// event from the outbox meanwhile, and the counts wait for the outbox to
// drain.
//
// Each handler's run gets backends of its own, started for it and stopped
// before the other run starts: a throwaway PostgreSQL primary with a
// synchronous standby, kfake, an in-process S3, a Stripe server and an
// SMTP server. The counts are separate, and neither run inherits what the
// other left behind (the cluster its failover promoted, a broker holding
// its records), so both start alike, whichever runs first. [Run] returns a [Report]; its
// [Report.Violations] lists what the effectively-once side must never do:
// charge an event twice (two PaymentIntents or two ledger rows), write a
// receipt twice, or lose an event.
//
// # Reading the report
//
// Effects are counted where a user would see them: ledger rows in a table
// without a unique index, PaymentIntents stripetest created with the
// event's id in their metadata, PUTs the S3 server answered with 200,
// records in the "charged" topic, messages the SMTP server accepted.
// Deliveries are counted by the worker: the pods stamp each record with the
// hop it came from, and a record delivered again counts as a redelivery
// (after the injected crash), after failover (its previous attempt failed
// between the kill of the primary and one second after the promotion), or a
// retry after an error (another copy of the event held a key: a concurrent
// duplicate, absorbed by waiting). A crash is injected as a handler error
// after the handler succeeded: the consumer does not ack, and delivers the
// message again, as the broker would to the worker's replacement.
//
// The schedule is seeded, and the webhook tier replays it exactly; what
// happens at the worker depends on timing too (which copy of a duplicate
// wins, which attempts the failover breaks), so two runs with one seed
// agree on the faults, not on every count. Throughput is end to end, on
// whatever else the machine is doing.
//
// Not a benchmark and not a test server: it is the demo behind
// cmd/chargehook, and package code only so that a test can hold it to its
// claims.
package chargehook

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
	"effectively.dev/email/smtptest"
	"effectively.dev/internal/machine"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/s3/s3test"
	"effectively.dev/stripe/stripetest"
)

// Handler names, as the report prints them.
const (
	NaiveName = "naive"
	EOName    = "effectively-once"
	// NaiveAgainName is the second side of a Config.NaiveTwice run.
	NaiveAgainName = "naive again"
)

// env is what both runs share: the configuration and the schedule. Each
// run gets backends of its own (see [env.runSide]).
type env struct {
	cfg   Config
	sched Schedule
	runID string
}

// Run starts the embedded backends, runs the schedule drawn from cfg
// through the naive handler and then through the effectively-once
// handler (with Config.NaiveTwice, through the naive handler again),
// counts the effects in the backends, and stops everything it started.
// An error means the demo could not run; what the handlers did wrong is
// in the Report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	e := &env{cfg: cfg, sched: NewSchedule(cfg), runID: randomKey()[:8]}
	var err error
	r := &Report{
		Events: cfg.Events, Workers: cfg.Workers, Seed: cfg.Seed,
		Sender: cfg.Sender, Sibling: cfg.Sibling, Crash: cfg.Crash, Failover: cfg.Failover, Standby: cfg.Standby && !cfg.Failover,
		Database: describeDatabase(cfg),
	}
	r.Scheduled.Sender, r.Scheduled.Sibling, r.Scheduled.Crash = e.sched.Count()
	// Each side's goroutines carry a "side" profiler label, so a CPU
	// profile of the run (chargehook -cpuprofile) splits by side.
	pprof.Do(ctx, pprof.Labels("side", NaiveName), func(ctx context.Context) { r.Naive, err = e.runSide(ctx, NaiveName, false, nil) })
	if err != nil {
		return nil, fmt.Errorf("naive run: %w", err)
	}
	if cfg.NaiveTwice {
		pprof.Do(ctx, pprof.Labels("side", NaiveAgainName), func(ctx context.Context) { r.NaiveAgain, err = e.runSide(ctx, NaiveAgainName, false, nil) })
		if err != nil {
			return nil, fmt.Errorf("second naive run: %w", err)
		}
		return r, nil
	}
	pprof.Do(ctx, pprof.Labels("side", EOName), func(ctx context.Context) { r.EffectivelyOnce, err = e.runSide(ctx, EOName, true, &r.Contract) })
	if err != nil {
		return nil, fmt.Errorf("effectively-once run: %w", err)
	}
	return r, nil
}

// runSide runs the whole pipeline once with one handler, the
// effectively-once one if eoSide and the naive one if not, and counts.
// name labels the side in the report and the logs.
func (e *env) runSide(ctx context.Context, name string, eoSide bool, contract *effects.PlanContract) (*Side, error) {
	cfg, sched := e.cfg, e.sched
	tag := "naive"
	if eoSide {
		tag = "eo"
	}
	// Backends made for this run alone, stopped before the next run
	// starts: neither handler runs on what the other left behind (the
	// cluster a failover promoted and its WAL, a broker full of the other
	// run's records), so both start alike whatever their order.
	db, err := startDatabase(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if cfg.Failover || cfg.Standby {
		if err := db.addStandby(ctx); err != nil {
			return nil, err
		}
	}
	cfg.logf("%s: starting kfake, the in-process S3 and the webhook tier", name)
	kc, err := kafkatest.New()
	if err != nil {
		return nil, err
	}
	defer kc.Close()
	pool, err := db.newPool(ctx, cfg.Workers)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	webhooks, err := kc.CreateTopic(ctx, "chargehook-"+tag+"-webhooks", int32(cfg.Workers))
	if err != nil {
		return nil, err
	}
	charged, err := kc.CreateTopic(ctx, "chargehook-"+tag+"-charged", 3)
	if err != nil {
		return nil, err
	}
	s3srv, err := s3test.NewInProcess() // its own bucket, whose writes it counts per key
	if err != nil {
		return nil, err
	}
	defer s3srv.Close()
	s3client, closeS3 := s3srv.NewClient()
	defer closeS3()
	bucket := s3srv.Bucket
	stripeSrv, err := stripetest.New()
	if err != nil {
		return nil, err
	}
	defer stripeSrv.Close()
	smtpSrv, err := smtptest.New()
	if err != nil {
		return nil, err
	}
	defer smtpSrv.Close()
	// A default client: neither kafka.Producer.Apply nor the naive
	// handler's ProduceSync waits for its linger.
	producer, err := kgo.NewClient(kc.Opts()...)
	if err != nil {
		return nil, err
	}
	defer producer.Close()

	d := deps{
		pool: pool, stripe: stripeSrv.Client(nil), s3: s3client, bucket: bucket,
		kafka: producer, topic: charged, smtp: smtpSrv.Addr(),
		scope: "chargehook-" + e.runID, ledger: "chargehook_ledger", observe: cfg.Observer,
	}
	var (
		h         handler
		objectKey func(Event) string
		unrecord  atomic.Int64
		drain     = func(context.Context) error { return nil }
	)
	if eoSide {
		eo, err := newEffectivelyOnce(d, slog.New(countingHandler{&unrecord}))
		if err != nil {
			return nil, err
		}
		defer eo.mail.Close()
		h, objectKey = eo, eo.objectKey
		*contract = eo.contract()
		// The outbox relay publishes the charged events while the worker
		// runs, and drains the outbox before the effects are counted.
		relayCtx, stopRelay := context.WithCancel(ctx)
		relayDone := make(chan struct{})
		go func() {
			defer close(relayDone)
			_ = eo.relay.Run(relayCtx) // it retries its errors (the failover's) itself
		}()
		defer func() { stopRelay(); <-relayDone }()
		drain = func(ctx context.Context) error { return drainOutbox(ctx, pool) }
	} else {
		d.ledger = "chargehook_naive_ledger"
		nv, err := newNaive(d)
		if err != nil {
			return nil, err
		}
		h, objectKey = nv, func(ev Event) string { return "receipts/" + ev.ID }
	}

	// The webhook tier.
	var pods []*pod
	for _, pn := range []string{"pod-a", "pod-b"} {
		cl, err := kgo.NewClient(kc.Opts(kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))...)
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		p, err := startPod(pn, sched.Faults, cl, webhooks)
		if err != nil {
			return nil, err
		}
		pods = append(pods, p)
	}
	lb, err := startBalancer(pods, sched.Faults)
	if err != nil {
		return nil, err
	}
	proc := newProcessor(lb.url, sched.Faults, 4*cfg.Workers)
	defer proc.close()

	// The failover, triggered by the worker's progress.
	var (
		fw         failoverWindow
		failWG     sync.WaitGroup
		failErr    error
		failTook   time.Duration
		finished   atomic.Int64
		failoverAt int
	)
	var start time.Time
	var lastDone atomic.Int64 // when the worker finished its latest event, in ns since start
	onDone := func(id string) {
		for t := int64(time.Since(start)); ; {
			if old := lastDone.Load(); old >= t || lastDone.CompareAndSwap(old, t) {
				break
			}
		}
		proc.done(id)
		n := finished.Add(1)
		if cfg.Failover && int(n) == sched.FailoverAfter {
			failoverAt = int(n)
			failWG.Add(1)
			go func() {
				defer failWG.Done()
				cfg.logf("%s: failover: killing the primary with %d of %d events done", name, n, cfg.Events)
				fw.begin()
				failErr = db.failover(ctx)
				failTook = fw.promoted()
				cfg.logf("%s: failover: standby promoted %v after the kill", name, failTook.Round(time.Millisecond))
			}()
		}
	}
	w := newWorker(h, sched.Faults, &fw, onDone)

	stopProgress := func() {}
	if cfg.Progress != nil {
		quit := make(chan struct{})
		var progressWG sync.WaitGroup
		progressWG.Add(1)
		go func() {
			defer progressWG.Done()
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-quit:
					cfg.Progress(name, w.finished(), cfg.Events)
					return
				case <-t.C:
					cfg.Progress(name, w.finished(), cfg.Events)
				}
			}
		}()
		var once sync.Once
		stopProgress = func() { once.Do(func() { close(quit); progressWG.Wait() }) }
		defer stopProgress()
	}

	cfg.logf("%s: running %d events", name, cfg.Events)
	start = time.Now()
	cpu0, cpuErr := machine.BusyCPU()
	wal0, walErr := walPosition(ctx, pool)
	timeline, tlErr := walTimeline(ctx, pool)
	var (
		total    atomic.Int64 // records in the webhook topic, once the tier stopped
		procErr  error
		procDone = make(chan struct{})
	)
	total.Store(-1)
	go func() {
		defer close(procDone)
		procErr = proc.run(ctx, sched.Events)
		// Let the frozen pods finish enqueueing, then count the records.
		// The processor's idle connections go first: a connection the
		// balancer accepted and never got a request on holds its Shutdown
		// for 5 s (net/http waits that long for a new connection's first
		// request).
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		proc.close()
		_ = lb.stop(sctx)
		for _, p := range pods {
			_ = p.stop(sctx)
		}
		n, err := endOffsets(sctx, kc, webhooks)
		if err != nil && procErr == nil {
			procErr = err
		}
		total.Store(n)
	}()
	stats, err := w.consume(ctx, kc.Opts(), "chargehook-"+tag+"-worker", webhooks, cfg.Workers, cfg.Observer,
		func(handled int64) bool {
			t := total.Load()
			return t >= 0 && handled >= t
		})
	// The run lasts until the worker finished its last event; stopping
	// the webhook tier and waiting for the count of its records is not
	// the handler's time.
	elapsed := time.Duration(lastDone.Load())
	cpu1, cpuErr1 := machine.BusyCPU()
	wal1, walErr1 := walPosition(ctx, pool)
	stopProgress()
	<-procDone
	failWG.Wait()
	if err == nil {
		err = procErr
	}
	if err == nil {
		err = failErr
	}
	if err != nil {
		return nil, err
	}

	s := &Side{
		Handler: name, Elapsed: elapsed, Consumer: stats,
		Sent: int(proc.attempts.Load()), SenderRetries: int(proc.retries.Load()), GaveUp: int(proc.gaveUp.Load()),
		SiblingRetries: int(lb.siblingRetries.Load()), DroppedReplies: int(lb.droppedReplies.Load()),
		Enqueued: int(total.Load()), FailoverAt: failoverAt, Failover: failTook,
		UnrecordedMail: int(unrecord.Load()),
	}
	if tlErr == nil {
		s.Timeline = timeline
	}
	if cpuErr == nil && cpuErr1 == nil {
		s.MachineCPU = cpu1 - cpu0
	}
	if walErr == nil && walErr1 == nil {
		s.WAL = wal1 - wal0
	}
	w.mu.Lock()
	s.Deliveries, s.Absorbed, s.Failures = w.deliveries, w.absorbed, w.errors
	s.DeadLettered = len(w.deadLettered)
	w.mu.Unlock()

	if err := drain(ctx); err != nil {
		return nil, err
	}
	cfg.logf("%s: counting effects in the backends", name)
	c := counter{
		pool: pool, ledger: d.ledger, stripe: stripeSrv, s3: s3srv, objectKey: objectKey,
		kafka: kc, topic: charged, smtp: smtpSrv,
	}
	if err := c.count(ctx, sched.Events, s); err != nil {
		return nil, fmt.Errorf("counting: %w", err)
	}
	return s, nil
}

// walPosition is the current WAL position of pool's primary, in bytes.
func walPosition(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var lsn int64
	err := pool.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`).Scan(&lsn)
	return lsn, err
}

// walTimeline is the timeline of pool's primary: the first eight hex
// digits of its current WAL file's name.
func walTimeline(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var tl int
	err := pool.QueryRow(ctx, `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int`).Scan(&tl)
	return tl, err
}

// drainOutbox waits until the outbox relay has published every row.
func drainOutbox(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var unsent int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM effectively_outbox WHERE sent_at IS NULL`).Scan(&unsent)
		if err == nil && unsent == 0 {
			return nil
		}
		if serr := retry.Sleep(ctx, 50*time.Millisecond); serr != nil {
			return fmt.Errorf("waiting for the outbox relay to publish every charged event (%d left, %v): %w", unsent, err, serr)
		}
	}
}

// endOffsets sums the end offsets of topic's partitions: the number of
// records in it (no transactions write to it).
func endOffsets(ctx context.Context, c *kafkatest.Cluster, topic string) (int64, error) {
	cl, err := kgo.NewClient(c.Opts()...)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	offs, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("listing the end offsets of %s: %w", topic, err)
	}
	var n int64
	offs.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n, nil
}

// eventOf extracts the event id from a receipt mail's subject.
func eventOf(subject string) string {
	return strings.TrimPrefix(subject, mailSubject(Event{}))
}
