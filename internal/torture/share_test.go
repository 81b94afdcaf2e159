package torture_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"effectively.dev/internal/torture"
	"effectively.dev/kafka/kafkatest"
)

// The share torture: several workers (chargehook-worker share, each a
// kafka.ShareSource of two members with eight handlers) consume one share
// group of the 8-partition input topic at once, while the test kills one
// with SIGKILL (and starts a replacement) or freezes one with SIGSTOP for
// longer than the acquisition lock, then lets it go on (SIGCONT). A frozen
// worker cannot renew its locks: the broker hands its records to the
// others while its handlers are suspended mid-effect, and when it resumes
// they finish the same effects concurrently with, or after, the other
// workers' deliveries. Then every worker drains and stops with SIGTERM.
//
// The broker's record of every acknowledgement (ShareFetch and
// ShareAcknowledge requests, stamped on arrival) says when each input
// record was first accepted; the ledger's commit timestamps say when its
// event's effect committed. The history checker ([torture.Check]) then
// finds lost events (accepted, or archived by the broker, without a
// ledger row), duplicated ledger rows and the rest; this test adds the
// share group's ack-after-commit rule: no record accepted before its
// event's ledger row committed.
const (
	shareWorkers       = 3
	shareLock          = 2 * time.Second
	shareDeliveryLimit = 10 // Kafka's largest share.delivery.count.limit
	shareEvents        = 1500
	shareRounds        = 8
	shareTopUp         = 300 // events produced before each round, so no round hits idle workers
	shareDrainTimeout  = 90 * time.Second
)

func TestShareTorture(t *testing.T) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	seed := envInt(t, "TORTURE_SEED", defaultSeed)
	rounds, events := shareRounds, shareEvents
	if testing.Short() {
		rounds, events = rounds/2, events/3
	}

	bin := workerBinary(t)
	cluster := kafkatest.Start(t, kafkatest.ShareBrokerConfigs(shareLock, shareDeliveryLimit))
	fake := cluster.RequireFake(t)
	dbURL, db := commitTimesDB(ctx, t)

	input := cluster.Topic(t, "share-torture-in", partitions)
	output := cluster.Topic(t, "share-torture-out", 3)
	group := input + "-workers"
	cluster.ShareFromEarliest(t, group)
	accepts := observeAccepts(fake, input)

	st := newStream(t, cluster, input, seed)
	st.produce(ctx, events)

	args := []string{
		"share", "-brokers", strings.Join(cluster.Brokers(), ","), "-database-url", dbURL,
		"-topic", input, "-output", output, "-group", group, "-scope", scope,
		"-concurrency", "8", "-members", "2", "-max-poll", "16", "-delivery-limit", strconv.Itoa(shareDeliveryLimit),
		"-lease", lease.String(), "-trace",
	}
	tl := newTraceLog(false)
	// The first worker creates the tables; the others start once it
	// handles its first delivery.
	workers := []*workerProc{startWorker(t, bin, append(slices.Clone(args), "-migrate"), tl)}
	select {
	case <-tl.begun():
	case <-workers[0].exited:
		t.Fatalf("worker exited on its own (%v) before its first delivery:\n%s", workers[0].err, workers[0].stderrTail())
	case <-time.After(firstDelivery):
		t.Fatalf("worker handled nothing in %v after its start:\n%s", firstDelivery, workers[0].stderrTail())
	}
	for len(workers) < shareWorkers {
		workers = append(workers, startWorker(t, bin, args, tl))
	}

	rng := rand.New(rand.NewPCG(seed, 0x5a4e))
	var kills, stops int
	for round := range rounds {
		st.produce(ctx, shareTopUp)
		if round%2 == 0 {
			time.Sleep(300*time.Millisecond + time.Duration(rng.Int64N(int64(700*time.Millisecond))))
		} else {
			// A freeze must catch handlers mid-delivery: soon after the
			// top-up, while the workers are still on it (without -race
			// they finish a top-up within a few hundred milliseconds).
			time.Sleep(20*time.Millisecond + time.Duration(rng.Int64N(int64(80*time.Millisecond))))
		}
		i := rng.IntN(len(workers))
		w := workers[i]
		select {
		case <-w.exited:
			t.Fatalf("round %d: worker %d exited on its own (%v):\n%s", round, i, w.err, w.stderrTail())
		default:
		}
		if round%2 == 0 {
			w.kill()
			kills++
			workers[i] = startWorker(t, bin, args, tl)
			continue
		}
		// Frozen past the lock and the group's session: its records go
		// to the others, its handlers wait mid-effect.
		_ = w.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(shareLock + time.Second + time.Duration(rng.Int64N(int64(2*time.Second))))
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		stops++
	}

	drainStart := time.Now()
	spso, err := waitShareDrained(ctx, kadm.NewClient(cluster.Client(t)), group, input, st.ends, workers)
	if err != nil {
		var tails []string
		for _, w := range workers {
			tails = append(tails, w.stderrTail())
		}
		t.Fatalf("%v\nworker stderr:\n%s", err, strings.Join(tails, "\n---\n"))
	}
	drain := time.Since(drainStart)
	for i, w := range workers {
		if err := w.terminate(20 * time.Second); err != nil {
			t.Errorf("graceful stop of worker %d: %v\n%s", i, err, w.stderrTail())
		}
	}
	if raceEnabled {
		for _, s := range tl.stderrs() {
			if strings.Contains(s, "WARNING: DATA RACE") {
				t.Errorf("a worker reported a data race:\n%s", s)
			}
		}
	}

	h := &torture.History{Scope: scope, Sent: st.sent}
	readHistory(t, ctx, cluster, fake, db, group, input, output, h)
	h.Committed = spso // a share group's start offsets: everything below was accepted or archived
	v := torture.Check(h)
	early := acceptedBeforeCommit(h, accepts.all())
	tot := tl.totals()
	t.Logf("share torture, seed %d, race %t, %v (drain %v): %d events in %d records; %d workers, %d SIGKILLs, %d SIGSTOPs past the %v lock; "+
		"%d deliveries in %d handler attempts, %d absorbed (ledger step replayed on a delivery's first attempt); ledger step %v, output step %v; "+
		"retries by cause %v; %d records accepted, %d accepted before their effect committed; checker: %s",
		seed, raceEnabled, time.Since(start).Round(time.Millisecond), drain.Round(time.Millisecond), len(st.sent), len(h.Input),
		shareWorkers, kills, stops, shareLock, tot.deliveries, tot.attempts, tot.absorbed,
		tot.steps[torture.StepLedger], tot.steps[torture.StepOutput], tot.retries, len(accepts.all()), len(early), v)
	if vs := v.Violations(); len(vs) > 0 {
		t.Errorf("share torture broke effectively-once: %s", strings.Join(vs, "; "))
	}
	if len(early) > 0 {
		t.Errorf("%d records accepted before their event's ledger row committed: %s", len(early), strings.Join(early[:min(5, len(early))], ", "))
	}
	if tot.absorbed == 0 {
		t.Errorf("no delivery replayed its ledger step: neither the duplicate records, the kills nor the stops caused a redelivery")
	}
	if tot.retries["lock_expired"] == 0 {
		t.Errorf("no handler outlived its acquisition lock: the SIGSTOPs did not freeze a worker mid-delivery")
	}
	if kills == 0 || stops == 0 {
		t.Errorf("%d kills and %d stops: the schedule did not run", kills, stops)
	}
}

// acceptLog records, per input record (partition and offset), the arrival
// time of the first request that accepted it.
type acceptLog struct {
	mu    sync.Mutex
	first map[[2]int64]time.Time
}

func (l *acceptLog) all() map[[2]int64]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[[2]int64]time.Time, len(l.first))
	for k, v := range l.first {
		out[k] = v
	}
	return out
}

// add records the accepts of offsets first to last of partition p (of
// the observed topic, if ours), by their acknowledge types.
func (l *acceptLog) add(ours bool, at time.Time, p int32, first, last int64, types []int8) {
	if !ours {
		return
	}
	for o := first; o <= last; o++ {
		typ := int8(1) // no types: accept
		switch {
		case len(types) == 1:
			typ = types[0]
		case len(types) > 1 && int(o-first) < len(types):
			typ = types[o-first]
		}
		if typ != 1 {
			continue
		}
		k := [2]int64{int64(p), o}
		if _, ok := l.first[k]; !ok {
			l.first[k] = at
		}
	}
}

// observeAccepts stamps every acknowledgement of topic's records, in
// ShareFetch and ShareAcknowledge requests, with its arrival time, and lets
// the broker handle the request as usual. The broker may refuse an accept
// (a lock that expired): a worker must not even send one before the
// effect committed.
func observeAccepts(fake *kfake.Cluster, topic string) *acceptLog {
	l := &acceptLog{first: map[[2]int64]time.Time{}}
	id := fake.TopicInfo(topic).TopicID
	observe := func(req kmsg.Request) (kmsg.Response, error, bool) {
		at := time.Now()
		l.mu.Lock()
		defer l.mu.Unlock()
		switch r := req.(type) {
		case *kmsg.ShareFetchRequest:
			for _, tp := range r.Topics {
				for _, p := range tp.Partitions {
					for _, b := range p.AcknowledgementBatches {
						l.add(tp.TopicID == id, at, p.Partition, b.FirstOffset, b.LastOffset, b.AcknowledgeTypes)
					}
				}
			}
		case *kmsg.ShareAcknowledgeRequest:
			for _, tp := range r.Topics {
				for _, p := range tp.Partitions {
					for _, b := range p.AcknowledgementBatches {
						l.add(tp.TopicID == id, at, p.Partition, b.FirstOffset, b.LastOffset, b.AcknowledgeTypes)
					}
				}
			}
		}
		return nil, nil, false // observed, not handled
	}
	fake.ControlKey(kmsg.ShareFetch.Int16(), observe)
	fake.ControlKey(kmsg.ShareAcknowledge.Int16(), observe)
	return l
}

// acceptedBeforeCommit returns the input records (as "event@partition/
// offset") first accepted before their event's first ledger row committed,
// or accepted with no ledger row at all.
func acceptedBeforeCommit(h *torture.History, accepts map[[2]int64]time.Time) []string {
	done := map[string]time.Time{}
	for _, r := range h.Ledger {
		if t, ok := done[r.EventID]; !ok || r.CommittedAt.Before(t) {
			done[r.EventID] = r.CommittedAt
		}
	}
	var out []string
	for _, r := range h.Input {
		at, ok := accepts[[2]int64{int64(r.Partition), r.Offset}]
		if !ok {
			continue
		}
		d, ok := done[r.EventID]
		// Microseconds: PostgreSQL's resolution; both are the machine's
		// wall clock.
		if !ok || d.UnixMicro() > at.UnixMicro() {
			out = append(out, fmt.Sprintf("%s@%d/%d", r.EventID, r.Partition, r.Offset))
		}
	}
	slices.Sort(out)
	return out
}

// waitShareDrained waits until the share group's start offset of every
// partition of topic reached its end (every record accepted or archived),
// and returns the start offsets; it fails if a worker exits or
// shareDrainTimeout passes.
func waitShareDrained(ctx context.Context, adm *kadm.Client, group, topic string, ends map[int32]int64, ws []*workerProc) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, shareDrainTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		got := map[int32]int64{}
		if ds, err := adm.DescribeShareGroupOffsets(ctx, group); err == nil {
			for p, o := range ds[group].Offsets[topic] {
				if o.Err == nil {
					got[p] = o.StartOffset
				}
			}
		}
		behind := 0
		for p, end := range ends {
			behind += int(end - got[p])
		}
		if behind == 0 {
			return got, nil
		}
		for i, w := range ws {
			select {
			case <-w.exited:
				return nil, fmt.Errorf("worker %d exited (%v) with %d records not accepted", i, w.err, behind)
			default:
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%d records not accepted after %v (start offsets %v, ends %v)", behind, shareDrainTimeout, got, ends)
		case <-tick.C:
		}
	}
}
