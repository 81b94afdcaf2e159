package torture_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"effectively.dev/internal/torture"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/postgres/pgtest"
)

// TestMain stops the shared PostgreSQL cluster, checks with goleak that no
// goroutine outlived the tests, and removes the worker binary.
func TestMain(m *testing.M) {
	code := pgtest.Main(m)
	removeWorkerBinary()
	os.Exit(code)
}

// The torture: the worker (internal/cmd/chargehook-worker, built once per test
// binary) runs as a separate process against a kfake cluster in this
// process and a PostgreSQL database, both of which outlive it. The test
// produces a seeded stream of payment events, then, kills times, starts the
// worker, waits until it handles its first delivery, lets it run for a
// seeded 50 to 300 ms and kills it with SIGKILL: with eight handlers busy,
// the kills land in every step of a delivery (the ledger's claim and
// commit, the journal's Begin and Complete, the produce, the ack's offset
// commit). Should the backlog run low before a kill (a fast machine, no race
// detector), the stream goes on with more seeded events, so that no kill
// hits an idle worker. A last worker drains the topic and is stopped with
// SIGTERM. TORTURE_SEED, TORTURE_EVENTS and TORTURE_KILLS change the run;
// -short runs a fifth of it.
//
// While the workers run, the broker stamps every OffsetCommit request of
// the group with its clock on arrival; PostgreSQL stamps every ledger
// transaction with its commit time (track_commit_timestamp). Both are the
// machine's wall clock, so the checker can tell, for each input record,
// whether the ledger row of its event had committed before the first
// request that committed the record's offset: ack after commit, checked on
// every event, not sampled.
const (
	defaultSeed   = 20240917
	defaultEvents = 5000
	defaultKills  = 50
	partitions    = 8    // of the input topic; the worker runs one handler per partition
	duplicateRate = 0.05 // chance that an event's record is followed by a second record of it, as a resending webhook sender does
	minKillAfter  = 50 * time.Millisecond
	maxKillAfter  = 300 * time.Millisecond
	topUpBelow    = 1000             // records: a worker about to be killed gets at least this much work...
	topUp         = 1000             // ...by producing this many more events
	firstDelivery = 10 * time.Second // longest a started worker may take to begin handling
	drainTimeout  = 3 * time.Minute
	lease         = time.Second // the output step's journal lease: how long a killed attempt blocks its key
	scope         = "torture"
	instanceID    = "torture-worker" // static membership: a restart takes over the partitions at once
)

// TestSIGKILLTorture: nothing acked may be lost, nothing done twice, no
// offset committed before its event's effect, no effect without its dedup
// row, no effect for an event never sent, and every output record must be
// its event's, duplicated only inside the producer's declared window.
func TestSIGKILLTorture(t *testing.T) {
	r := runTorture(t, tortureConfig{})
	if vs := r.verdict.Violations(); len(vs) > 0 {
		t.Errorf("SIGKILL torture broke effectively-once: %s", strings.Join(vs, "; "))
	}
	r.checkSchedule(t)
	if r.trace.absorbed == 0 {
		t.Errorf("no delivery replayed its ledger step: neither the duplicate records nor the kills caused a redelivery")
	}
}

// TestSIGKILLTortureAckFirst is the negative control: the same torture
// with a worker that acks each record before applying it (-ack-first). A
// kill between the ack and the ledger's commit loses the event, and every
// offset commit precedes its event's effect: the checker must report both.
// A checker that cannot see a loss cannot pass this test.
func TestSIGKILLTortureAckFirst(t *testing.T) {
	r := runTorture(t, tortureConfig{ackFirst: true})
	v := r.verdict
	switch {
	case v.Lost > 0:
		t.Logf("negative control: the checker caught %d lost events (%s) and %d events acked before their effect committed",
			v.Lost, strings.Join(v.Samples["lost"], ", "), v.AckBeforeCommit)
	case r.ackedUnapplied == 0:
		t.Errorf("negative control: no kill found a delivery acked and not yet applied, so none could be lost: the kill schedule did not work")
	default:
		t.Errorf("negative control: %d deliveries were acked and not yet applied when the worker was killed, yet the checker reports none lost: the checker is broken",
			r.ackedUnapplied)
	}
	if v.AckBeforeCommit < v.Acked/2 {
		t.Errorf("negative control: the worker acked every event before applying it, but the checker reports only %d of %d acked events as acked before commit",
			v.AckBeforeCommit, v.Acked)
	}
	// Acking early loses events; it must not duplicate ledger rows or break
	// the rest of the bookkeeping. Output duplicates outside the window are
	// not judged here: the producer's window ends when the journal records
	// the output, which needs a redelivery after a kill, and acking first
	// is what takes the redelivery away (a kill after a duplicate record's
	// second produce, before its Complete, leaves two outputs and an
	// unfinished journal record for good).
	if v.Duplicated != 0 || v.EffectWithoutKey != 0 || v.KeyWithoutEffect != 0 || v.Unexpected != 0 ||
		v.WrongPayload != 0 || v.OutputMismatch != 0 || v.Undrained != 0 {
		t.Errorf("negative control: %s", v)
	}
	r.checkSchedule(t)
}

// TestSIGKILLTortureGrouped is TestSIGKILLTorture with the worker's pool
// at 4 connections for 8 handlers, so that its postgres.New ledger's
// Applies share transactions (group commit: the writes, then every key's
// INSERT with one COMMIT) when the kills land.
func TestSIGKILLTortureGrouped(t *testing.T) {
	r := runTorture(t, tortureConfig{poolMaxConns: 4})
	if vs := r.verdict.Violations(); len(vs) > 0 {
		t.Errorf("SIGKILL torture, grouped, broke effectively-once: %s", strings.Join(vs, "; "))
	}
	r.checkSchedule(t)
}

type tortureConfig struct {
	ackFirst     bool
	poolMaxConns int // > 0: the worker's pool size (pool_max_conns in its database URL)
}

// tortureResult is what a run did and what the checker found.
type tortureResult struct {
	cfg             tortureConfig
	seed            uint64
	events, records int
	topUps          int            // times the backlog ran low and more events were produced
	kills           int            // SIGKILLs
	midDelivery     int            // kills that found deliveries in flight
	inFlight        map[string]int // deliveries in flight at the kills, by stage
	ackedUnapplied  int            // deliveries in flight at a kill, acked, ledger step not done (-ack-first only)
	toFirst         time.Duration  // mean time from a worker's start to its first delivery
	killPhase       time.Duration
	drainTime       time.Duration
	elapsed         time.Duration
	trace           traceTotals
	verdict         *torture.Verdict
}

func (r *tortureResult) checkSchedule(t *testing.T) {
	t.Helper()
	if r.midDelivery < r.kills*9/10 {
		t.Errorf("only %d of %d kills found deliveries in flight: the kills mostly missed the worker's work", r.midDelivery, r.kills)
	}
}

func (r *tortureResult) log(t *testing.T) {
	mode := "effectively-once worker"
	if r.cfg.ackFirst {
		mode = "negative control (-ack-first)"
	}
	var stages []string
	for _, s := range []string{"ledger", "output", "ack", "retrying"} {
		stages = append(stages, fmt.Sprintf("%d %s", r.inFlight[s], stageNames[s]))
	}
	workers := time.Duration(r.kills + 1)
	t.Logf("%s, seed %d, worker race detector %t, %v (kill phase %v, drain %v): %d events in %d input records (%d top-ups); "+
		"%d SIGKILLs, %d of them with deliveries in flight: %s; a worker took %v to start and %v to its first delivery on average; "+
		"%d deliveries (%d redeliveries after the kills) in %d handler attempts (%d retries in place); %d deliveries absorbed (ledger step replayed on their first attempt); "+
		"ledger step %v, output step %v; consumer retries by cause %v; checker: %s",
		mode, r.seed, raceEnabled, r.elapsed.Round(time.Millisecond), r.killPhase.Round(time.Millisecond), r.drainTime.Round(time.Millisecond),
		r.events, r.records, r.topUps,
		r.kills, r.midDelivery, strings.Join(stages, ", "), (r.trace.toReady / workers).Round(time.Millisecond), r.toFirst.Round(time.Millisecond),
		r.trace.deliveries, r.trace.deliveries-r.records, r.trace.attempts, r.trace.attempts-r.trace.deliveries, r.trace.absorbed,
		r.trace.steps[torture.StepLedger], r.trace.steps[torture.StepOutput], r.trace.retries, r.verdict)
}

var stageNames = map[string]string{
	"ledger":   "in the ledger step (claim, insert, commit)",
	"output":   "in the output step (journal Begin, produce, journal Complete)",
	"ack":      "between the plan's end and the offset commit",
	"retrying": "waiting to retry",
}

// envInt reads an integer knob from the environment.
func envInt(t *testing.T, name string, def uint64) uint64 {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

func runTorture(t *testing.T, cfg tortureConfig) *tortureResult {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	events, kills := defaultEvents, defaultKills
	if testing.Short() {
		events, kills = events/5, kills/5
	}
	seed := envInt(t, "TORTURE_SEED", defaultSeed)
	events = int(envInt(t, "TORTURE_EVENTS", uint64(events)))
	kills = int(envInt(t, "TORTURE_KILLS", uint64(kills)))

	bin := workerBinary(t)
	cluster := kafkatest.Start(t)
	fake := cluster.RequireFake(t)
	dbURL, db := commitTimesDB(ctx, t)

	input := cluster.Topic(t, "torture-in", partitions)
	output := cluster.Topic(t, "torture-out", 3)
	group := input + "-workers"
	commits := observeCommits(fake, group, input)

	r := &tortureResult{cfg: cfg, seed: seed, inFlight: map[string]int{}}
	st := newStream(t, cluster, input, seed)
	st.produce(ctx, events)

	if cfg.poolMaxConns > 0 {
		sep := "?"
		if strings.Contains(dbURL, "?") {
			sep = "&"
		}
		dbURL += sep + "pool_max_conns=" + strconv.Itoa(cfg.poolMaxConns)
	}
	args := []string{
		"-brokers", strings.Join(cluster.Brokers(), ","), "-database-url", dbURL,
		"-topic", input, "-output", output, "-group", group, "-instance-id", instanceID,
		"-scope", scope, "-concurrency", strconv.Itoa(partitions), "-lease", lease.String(),
		"-trace",
	}
	if cfg.ackFirst {
		args = append(args, "-ack-first")
	}
	// The first worker creates the tables, as a deployment's first start
	// would; the others find them.
	first := append(slices.Clone(args), "-migrate")
	tl := newTraceLog(cfg.ackFirst)

	// The kills. A fast worker could drain the stream before the last
	// kill, and a kill of an idle worker tests little: when the backlog
	// runs low, the stream goes on with more seeded events.
	rng := rand.New(rand.NewPCG(seed, 0x6b111))
	killStart := time.Now()
	for i := range kills {
		if st.backlog(fake, group) < topUpBelow {
			st.produce(ctx, topUp)
			r.topUps++
		}
		w := startWorker(t, bin, map[bool][]string{true: first, false: args}[i == 0], tl)
		began := time.Now()
		select {
		case <-tl.begun():
			r.toFirst += time.Since(began)
		case <-w.exited:
			t.Fatalf("worker exited on its own (%v) before its first delivery:\n%s", w.err, w.stderrTail())
		case <-time.After(firstDelivery):
			t.Fatalf("worker handled nothing in %v after its start:\n%s", firstDelivery, w.stderrTail())
		}
		after := minKillAfter + time.Duration(rng.Int64N(int64(maxKillAfter-minKillAfter)))
		select {
		case <-time.After(after):
		case <-w.exited:
			t.Fatalf("worker exited on its own (%v):\n%s", w.err, w.stderrTail())
		}
		w.kill()
		at := tl.endIncarnation()
		r.kills++
		if len(at) > 0 {
			r.midDelivery++
		}
		for _, d := range at {
			r.inFlight[d.stage]++
			if d.acked && (d.stage == "ledger" || d.stage == "retrying") {
				r.ackedUnapplied++
			}
		}
	}
	r.killPhase = time.Since(killStart)
	r.toFirst /= time.Duration(max(kills, 1))

	// The drain: a last worker until every input offset is committed,
	// then a graceful stop.
	drainStart := time.Now()
	w := startWorker(t, bin, map[bool][]string{true: first, false: args}[kills == 0], tl)
	if err := waitDrained(ctx, fake, group, input, st.ends, w); err != nil {
		t.Fatalf("%v\nworker stderr:\n%s", err, w.stderrTail())
	}
	r.drainTime = time.Since(drainStart)
	if err := w.terminate(20 * time.Second); err != nil {
		t.Errorf("graceful stop: %v\n%s", err, w.stderrTail())
	}
	if !tl.stopped() {
		t.Errorf("the worker exited after SIGTERM without reporting a clean stop:\n%s", w.stderrTail())
	}
	tl.endIncarnation()
	if raceEnabled {
		for _, s := range tl.stderrs() {
			if strings.Contains(s, "WARNING: DATA RACE") {
				t.Errorf("the worker reported a data race:\n%s", s)
			}
		}
	}

	// The history.
	h := &torture.History{Scope: scope, Sent: st.sent, Commits: commits.all()}
	readHistory(t, ctx, cluster, fake, db, group, input, output, h)
	r.verdict = torture.Check(h)
	r.events, r.records = len(st.sent), len(h.Input)
	r.trace = tl.totals()
	r.elapsed = time.Since(start)
	r.log(t)
	return r
}

// stream produces the seeded payment events to the input topic.
type stream struct {
	t     *testing.T
	cl    *kgo.Client
	topic string
	rng   *rand.Rand
	evs   []event
	sent  map[string]int64 // event id -> cents
	ends  map[int32]int64  // partition -> end offset
}

// event is a chargehook webhook event, as the worker reads it.
type event struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Email   string `json:"email"`
	Cents   int64  `json:"cents"`
}

func newStream(t *testing.T, c *kafkatest.Cluster, topic string, seed uint64) *stream {
	return &stream{
		t: t, topic: topic, rng: rand.New(rand.NewPCG(seed, 0x5eed)),
		cl:   c.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0)),
		sent: map[string]int64{}, ends: map[int32]int64{},
	}
}

// produce produces n more events, each to a seeded partition; with
// duplicateRate, an event is followed by a second record of a recent one.
func (s *stream) produce(ctx context.Context, n int) {
	s.t.Helper()
	var recs []*kgo.Record
	record := func(e event) {
		body, err := json.Marshal(e)
		if err != nil {
			s.t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{
			Topic: s.topic, Partition: s.rng.Int32N(partitions), Key: []byte(e.ID), Value: body,
			Headers: []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte(e.ID)}, {Key: "event-id", Value: []byte(e.ID)}},
		})
	}
	for range n {
		i := len(s.evs)
		acct := s.rng.IntN(500)
		e := event{ID: fmt.Sprintf("evt-%05d", i), Account: fmt.Sprintf("acct-%03d", acct),
			Email: fmt.Sprintf("acct-%03d@example.com", acct), Cents: 100 + s.rng.Int64N(100_000)}
		s.evs = append(s.evs, e)
		s.sent[e.ID] = e.Cents
		record(e)
		if s.rng.Float64() < duplicateRate {
			record(s.evs[i-s.rng.IntN(min(32, i+1))])
		}
	}
	res := s.cl.ProduceSync(ctx, recs...)
	if err := res.FirstErr(); err != nil {
		s.t.Fatalf("producing the events: %v", err)
	}
	for _, pr := range res {
		s.ends[pr.Record.Partition] = max(s.ends[pr.Record.Partition], pr.Record.Offset+1)
	}
}

// backlog is the number of records the group has not committed.
func (s *stream) backlog(fake *kfake.Cluster, group string) int {
	got := committed(fake, group, s.topic)
	n := 0
	for p, end := range s.ends {
		n += int(end - got[p])
	}
	return n
}

// commitLog records every OffsetCommit request of one group, as the broker
// receives it.
type commitLog struct {
	mu      sync.Mutex
	commits []torture.CommitRequest
}

func (l *commitLog) all() []torture.CommitRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.commits)
}

// observeCommits installs a kfake control function that stamps each
// OffsetCommit request of group for topic with the time of its arrival and
// lets the broker handle it as usual. Control functions run one at a time
// on the cluster's loop, so the log is in the order the broker applied the
// requests.
func observeCommits(fake *kfake.Cluster, group, topic string) *commitLog {
	l := &commitLog{}
	id := fake.TopicInfo(topic).TopicID
	fake.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		at := time.Now()
		r, ok := req.(*kmsg.OffsetCommitRequest)
		if !ok || r.Group != group {
			return nil, nil, false
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, tp := range r.Topics {
			if tp.Topic != topic && tp.TopicID != id {
				continue
			}
			for _, p := range tp.Partitions {
				l.commits = append(l.commits, torture.CommitRequest{At: at, Partition: p.Partition, Offset: p.Offset, Member: r.MemberID, Generation: r.Generation})
			}
		}
		return nil, nil, false // observed, not handled: the broker commits as usual
	})
	return l
}
