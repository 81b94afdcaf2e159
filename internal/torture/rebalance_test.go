package torture_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"effectively.dev/internal/torture"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/postgres/pgtest"
)

// The rebalance torture: three worker processes (internal/cmd/chargehook-worker)
// in one group with dynamic membership consume the 8 partitions of the
// input topic, while a seeded schedule, for REBALANCE_TORTURE_DURATION
// (default 25 s, the form scripts/test runs, about 40 s in all with the
// race detector; 15 s with -short), picks one fault at a time:
//
//   - freeze: SIGSTOP a worker past the session timeout, then SIGCONT. The
//     group drops it and gives its partitions to the others; the zombie
//     resumes with deliveries in flight, acks and commits, and must not
//     get any of it applied (Source.Owns drops its queued deliveries, the
//     broker refuses its commits).
//   - pause: SIGSTOP for 0.1 to 1 s, shorter than the session timeout.
//   - kill: SIGKILL a worker and start a replacement.
//   - join and leave: a fourth worker joins, runs 1 to 3 s, and leaves
//     with SIGTERM (a clean exit, bounded by the shutdown grace and
//     Source.Close's bound).
//   - PostgreSQL restart (fast shutdown, start) under the workers.
//   - commit cut: the next one to three OffsetCommit requests of the group
//     are answered REQUEST_TIMED_OUT after the broker applied them (kfake's
//     Fault), or the next one's connection is cut before the broker sees
//     it (a control that returns an error; see commitCutter).
//
// The backlog is topped up with seeded events so the workers never idle.
// At the end every worker is thawed, the group drains, and the workers stop
// with SIGTERM. The history checker ([torture.Check]) then says whether an
// event was lost, booked twice, booked without its dedup row, or acked
// before its ledger row committed; and [torture.CheckCommits] whether an
// offset the broker applied ever moved backwards or came from a member the
// group had dropped. The broker's applied offsets are sampled from kfake
// every millisecond (GroupInfo: the offset and the time the broker stored
// it), and matched with the requests the control hook saw: a commit
// applied and overwritten within one sample goes unchecked, which the log
// reports as the number of applied commits checked.
//
// Knobs: REBALANCE_TORTURE_SEED, REBALANCE_TORTURE_DURATION (a Go
// duration), REBALANCE_TORTURE_FAULTS (a comma-separated subset of freeze,
// pause, kill, join-leave, pg-restart, commit-cut; default all). The long
// form, three seeds for two and a half minutes each, is where the results
// in RELIABILITY.md come from:
//
//	for s in 1 2 3; do REBALANCE_TORTURE_SEED=$s REBALANCE_TORTURE_DURATION=150s go test -race -count=1 -run TestRebalanceTorture -timeout 20m -v ./internal/torture/; done
//
// kfake caveat: it does not refresh a member's session while the member's
// JoinGroup is parked waiting for the others, and it restarts the
// rebalance timer on every join or session expiry. With a rebalance timeout
// above the session timeout, a member parked in a long rebalance (one
// member frozen, others joining) expires although it is alive and well,
// the rebalance restarts, and the group can churn for as long as members
// keep expiring. Kafka refreshes the session of a member whose join is in
// flight. So the workers run with a rebalance timeout below the session
// timeout, so that every rebalance ends before a parked member's session
// could.
const (
	rbDefaultSeed     = 20261203
	rbDefaultDuration = 25 * time.Second
	rbShortDuration   = 15 * time.Second
	rbWorkers         = 3
	rbConcurrency     = 4 // handlers per worker: four workers' pools stay under PostgreSQL's 100 connections
	rbSession         = 3 * time.Second
	rbRebalance       = 2 * time.Second // below rbSession: see the kfake caveat above
	rbHeartbeat       = 250 * time.Millisecond
	rbEvents          = 2000
	rbTopUpBelow      = 3000 // records: the workers never run dry, even through a freeze
	rbTopUp           = 2000
	rbScope           = "rebalance"
)

// TestRebalanceTorture: see the comment above; nothing may be lost, done
// twice, done without its dedup row or acked before it was done, and no
// applied offset may move backwards or come from a dropped member.
func TestRebalanceTorture(t *testing.T) {
	start := time.Now()
	duration := rbDefaultDuration
	if testing.Short() {
		duration = rbShortDuration
	}
	if s := os.Getenv("REBALANCE_TORTURE_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("REBALANCE_TORTURE_DURATION: %v", err)
		}
		duration = d
	}
	seed := envInt(t, "REBALANCE_TORTURE_SEED", rbDefaultSeed)
	only := os.Getenv("REBALANCE_TORTURE_FAULTS") // e.g. "freeze,kill": only these
	ctx, cancel := context.WithTimeout(context.Background(), duration+8*time.Minute)
	defer cancel()

	bin := workerBinary(t)
	cluster := kafkatest.Start(t)
	fake := cluster.RequireFake(t)
	pg := pgtest.Start(t, pgtest.Options{Settings: map[string]string{"track_commit_timestamp": "on"}})
	if err := pg.CreateDatabase(ctx, "rebalance"); err != nil {
		t.Fatal(err)
	}
	dbURL := pg.URL("rebalance")

	input := cluster.Topic(t, "rebalance-in", partitions)
	output := cluster.Topic(t, "rebalance-out", 3)
	group := input + "-workers"
	commits := observeCommits(fake, group, input) // first: it sees the requests that are cut too
	cutter := cutCommits(fake, group)
	applied := sampleGroup(fake, group, input)
	defer applied.stop()

	st := newStream(t, cluster, input, seed)
	st.produce(ctx, rbEvents)
	args := []string{
		"-brokers", strings.Join(cluster.Brokers(), ","), "-database-url", dbURL,
		"-topic", input, "-output", output, "-group", group, "-scope", rbScope,
		"-concurrency", strconv.Itoa(rbConcurrency), "-lease", lease.String(),
		"-session-timeout", rbSession.String(), "-rebalance-timeout", rbRebalance.String(),
		"-heartbeat-interval", rbHeartbeat.String(), "-trace",
	}
	f := &fleet{t: t, bin: bin, args: args}
	// The first worker creates the tables; the others start once it
	// handles its first delivery (a worker that finds no table stops with
	// a configuration error, as it should).
	first := f.start(append(slices.Clone(args), "-migrate"))
	select {
	case <-f.traces[0].begun():
	case <-first.exited:
		t.Fatalf("worker exited on its own (%v) before its first delivery:\n%s", first.err, first.stderrTail())
	case <-time.After(firstDelivery):
		t.Fatalf("worker handled nothing in %v after its start:\n%s", firstDelivery, first.stderrTail())
	}
	for range rbWorkers - 1 {
		f.start(args)
	}

	rng := rand.New(rand.NewPCG(seed, 0x7eba1))
	counts := map[string]int{}
	var leaveTimes []time.Duration
	chaosStart := time.Now()
	for time.Since(chaosStart) < duration {
		if st.backlog(fake, group) < rbTopUpBelow {
			st.produce(ctx, rbTopUp)
			counts["top-up"]++
		}
		sleep(ctx, time.Duration(200+rng.IntN(1300))*time.Millisecond)
		x := rng.IntN(100)
		if only != "" && !strings.Contains(only, faultAt(x)) {
			continue
		}
		switch {
		case x < 25: // freeze past the session timeout: the zombie
			w := f.pick(rng)
			w.signal(syscall.SIGSTOP)
			sleep(ctx, rbSession+time.Duration(500+rng.IntN(2000))*time.Millisecond)
			w.signal(syscall.SIGCONT)
			counts["freeze"]++
		case x < 45:
			w := f.pick(rng)
			w.signal(syscall.SIGSTOP)
			sleep(ctx, time.Duration(100+rng.IntN(900))*time.Millisecond)
			w.signal(syscall.SIGCONT)
			counts["pause"]++
		case x < 60:
			f.kill(f.pick(rng))
			f.start(args)
			counts["kill"]++
		case x < 75:
			w := f.start(args)
			sleep(ctx, time.Duration(1000+rng.IntN(2000))*time.Millisecond)
			took, err := f.leave(w)
			if err != nil {
				t.Errorf("a joined worker's SIGTERM leave: %v\n%s", err, w.stderrTail())
			}
			leaveTimes = append(leaveTimes, took)
			counts["join-leave"]++
		case x < 85:
			if err := pg.Restart(); err != nil {
				t.Fatalf("restarting PostgreSQL: %v", err)
			}
			counts["pg-restart"]++
		default:
			if rng.IntN(2) == 0 {
				fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.RequestTimedOut, Count: 1 + rng.IntN(3)})
				counts["commit-timed-out-after-apply"]++
			} else {
				cutter.armed.Store(true)
				counts["commit-cut-armed"]++
			}
		}
	}
	chaos := time.Since(chaosStart)
	cutter.armed.Store(false)
	counts["commit-cut"] = int(cutter.cuts.Load())

	// The drain: every worker runs, the group commits every offset.
	drainStart := time.Now()
	w := f.live()[0]
	if err := waitDrained(ctx, fake, group, input, st.ends, w); err != nil {
		t.Fatalf("%v\nworker stderr:\n%s", err, w.stderrTail())
	}
	drain := time.Since(drainStart)
	for _, w := range slices.Clone(f.live()) {
		took, err := f.leave(w)
		if err != nil {
			t.Errorf("graceful stop: %v\n%s", err, w.stderrTail())
		}
		leaveTimes = append(leaveTimes, took)
	}
	applied.stop()
	if raceEnabled {
		for _, w := range f.all {
			if s := w.stderr.String(); strings.Contains(s, "WARNING: DATA RACE") {
				t.Errorf("a worker reported a data race:\n%s", s)
			}
		}
	}

	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	h := &torture.History{Scope: rbScope, Sent: st.sent, Commits: commits.all()}
	readHistory(t, ctx, cluster, fake, db, group, input, output, h)
	v := torture.Check(h)
	cv := torture.CheckCommits(h.Commits, applied.commits(), applied.droppedMembers())
	var tr traceTotals
	for _, tl := range f.traces {
		x := tl.totals()
		tr.attempts += x.attempts
		tr.deliveries += x.deliveries
		tr.absorbed += x.absorbed
	}
	dropped := 0 // deliveries the workers' consumers dropped as no longer owned (Source.Owns)
	for _, w := range f.all {
		for _, line := range strings.Split(w.stderr.String(), "\n") {
			var n int
			if _, after, ok := strings.Cut(line, "dead-lettered, "); ok {
				if _, err := fmt.Sscanf(after, "%d dropped", &n); err == nil {
					dropped += n
				}
			}
		}
	}
	slices.Sort(leaveTimes)
	t.Logf("rebalance torture, seed %d, worker race detector %t, %v (chaos %v, drain %v): %d events in %d input records; faults %v; "+
		"%d worker processes, %d members gone from the group (dropped, killed or left); SIGTERM leaves took %v to %v; %d deliveries in %d attempts, %d absorbed, %d dropped as revoked by the workers that stopped cleanly; "+
		"checker: %s; commits: %s",
		seed, raceEnabled, time.Since(start).Round(time.Millisecond), chaos.Round(time.Millisecond), drain.Round(time.Millisecond),
		len(st.sent), len(h.Input), counts, len(f.all), len(applied.droppedMembers()),
		leaveTimes[0].Round(time.Millisecond), leaveTimes[len(leaveTimes)-1].Round(time.Millisecond),
		tr.deliveries, tr.attempts, tr.absorbed, dropped, v, cv)
	if vs := append(v.Violations(), cv.Violations()...); len(vs) > 0 {
		t.Errorf("rebalance torture broke effectively-once: %s", strings.Join(vs, "; "))
	}
	if counts["freeze"] == 0 && only == "" && duration >= rbShortDuration {
		t.Errorf("the schedule froze no worker past the session timeout: faults %v", counts)
	}
	if len(applied.droppedMembers()) == 0 {
		t.Errorf("the group dropped no member: no rebalance was tortured")
	}
}

// faultAt names the fault the schedule's draw x (0..99) picks.
func faultAt(x int) string {
	switch {
	case x < 25:
		return "freeze"
	case x < 45:
		return "pause"
	case x < 60:
		return "kill"
	case x < 75:
		return "join-leave"
	case x < 85:
		return "pg-restart"
	default:
		return "commit-cut"
	}
}

// fleet is the worker processes of one run.
type fleet struct {
	t      *testing.T
	bin    string
	args   []string
	all    []*workerProc
	traces []*traceLog
	alive  []*workerProc
}

func (f *fleet) start(args []string) *workerProc {
	tl := newTraceLog(false)
	w := startWorker(f.t, f.bin, args, tl)
	f.all = append(f.all, w)
	f.traces = append(f.traces, tl)
	f.alive = append(f.alive, w)
	return w
}

// live returns the workers still running, dropping those that exited.
func (f *fleet) live() []*workerProc {
	f.alive = slices.DeleteFunc(f.alive, func(w *workerProc) bool {
		select {
		case <-w.exited:
			f.t.Errorf("a worker exited on its own (%v):\n%s", w.err, w.stderrTail())
			return true
		default:
			return false
		}
	})
	if len(f.alive) == 0 {
		f.t.Fatal("no worker left")
	}
	return f.alive
}

func (f *fleet) pick(rng *rand.Rand) *workerProc {
	l := f.live()
	return l[rng.IntN(len(l))]
}

func (f *fleet) kill(w *workerProc) {
	f.alive = slices.DeleteFunc(f.alive, func(x *workerProc) bool { return x == w })
	w.kill()
}

// leave stops w with SIGTERM and returns how long its exit took.
func (f *fleet) leave(w *workerProc) (time.Duration, error) {
	f.alive = slices.DeleteFunc(f.alive, func(x *workerProc) bool { return x == w })
	start := time.Now()
	err := w.terminate(30 * time.Second)
	return time.Since(start), err
}

func (w *workerProc) signal(sig syscall.Signal) { _ = w.cmd.Process.Signal(sig) }

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// commitCutter cuts the connection of the group's OffsetCommit requests
// before the broker handles them, as many as were armed. Arming is
// capped at one pending cut: on kfake, a second cut in a row leaves the
// client waiting about 30 s for a reply before it sees EOF (observed; the
// first cut is retried at once), which would stall the run, not test it.
type commitCutter struct {
	armed atomic.Bool
	cuts  atomic.Int64
}

func cutCommits(fake *kfake.Cluster, group string) *commitCutter {
	c := &commitCutter{}
	fake.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		if r, ok := req.(*kmsg.OffsetCommitRequest); !ok || r.Group != group || !c.armed.CompareAndSwap(true, false) {
			return nil, nil, false
		}
		c.cuts.Add(1)
		return nil, errors.New("torture: connection cut"), true
	})
	return c
}

// groupSampler polls kfake for a group's committed offsets and members:
// every change of a partition's commit is an applied commit, and a member
// seen once and then gone was dropped.
type groupSampler struct {
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup

	mu      sync.Mutex
	applied []torture.AppliedCommit
	seen    map[string]bool
	gone    map[string]time.Time
}

func sampleGroup(fake *kfake.Cluster, group, topic string) *groupSampler {
	s := &groupSampler{done: make(chan struct{}), seen: map[string]bool{}, gone: map[string]time.Time{}}
	last := map[int32]kfake.GroupCommit{}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			select {
			case <-s.done:
				return
			case <-time.After(time.Millisecond):
			}
			gi := fake.GroupInfo(group)
			at := time.Now() // after the snapshot: a member missing from it was gone by now
			if gi == nil {
				continue
			}
			s.mu.Lock()
			for p, c := range gi.Commits[topic] {
				if l, ok := last[p]; !ok || !l.At.Equal(c.At) || l.Offset != c.Offset {
					s.applied = append(s.applied, torture.AppliedCommit{At: c.At, Partition: p, Offset: c.Offset})
					last[p] = c
				}
			}
			now := map[string]bool{}
			for _, m := range gi.Members {
				now[m.MemberID] = true
				s.seen[m.MemberID] = true
			}
			for id := range s.seen {
				if _, ok := s.gone[id]; !ok && !now[id] {
					s.gone[id] = at
				}
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *groupSampler) stop() {
	s.once.Do(func() { close(s.done) })
	s.wg.Wait()
}

func (s *groupSampler) commits() []torture.AppliedCommit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.applied)
}

func (s *groupSampler) droppedMembers() map[string]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]time.Time, len(s.gone))
	for k, v := range s.gone {
		out[k] = v
	}
	return out
}
