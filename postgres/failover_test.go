package postgres_test

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
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/internal/testserver"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// The failover tests run the seed's incident on purpose: a worker applies a
// stream of payment events through postgres.New with several goroutines,
// acking each event once Apply returns nil, while the primary crashes
// mid-stream and its standby is promoted. Afterwards a history checker
// compares what was acked with what the new primary holds.
//
// The schedule:
//
//  1. a first part of the stream flows normally;
//  2. a burst of events is applied, in the "stalled" runs with the
//     replication link stalled (a pgtest.Proxy between primary and standby
//     holds back WAL);
//  3. the primary is killed (immediate shutdown): in the stalled runs right
//     after the burst is acked, or after burstWait if it cannot be; in the
//     "flowing" run when half of the burst is acked, with commits in flight;
//  4. after failoverDelay the standby is promoted, the worker's pool
//     reconnects to it through the multi-host connection string
//     (target_session_attrs=read-write), and the rest of the stream is
//     applied, retrying every error effects.ClassOf calls Retryable with the
//     same key.
//
// With a synchronous standby and a stalled link the burst's commits wait
// for the standby, so none is acked before the crash: they fail
// ambiguously and their retries apply them on the new primary. With an
// asynchronous standby the same faults lose the acked burst, which never
// reached the standby: that run is the negative control that proves the
// checker can see a loss.
const (
	failoverEvents  = 2000                   // distinct events in the stream
	failoverWorkers = 8                      // goroutines applying events
	redeliverRate   = 0.1                    // chance that a delivery is followed by a redelivery
	burstWait       = 2 * time.Second        // longest the burst may run before the crash
	failoverDelay   = 300 * time.Millisecond // between the crash and the promotion
	attemptTimeout  = 30 * time.Second       // per Apply; longer than burstWait, see TestFailover
	standbyName     = "failover_standby"
	failoverScope   = "failover"
)

// TestFailover is the failover with a synchronous standby: no acked event
// may be lost, none duplicated, no effect may lack its dedup row, and no
// effect may appear that was never sent.
//
// Each Apply gets attemptTimeout, longer than the stall, so no caller gives
// up on a COMMIT that waits for the standby: when one does, pgx closes the
// connection with a cancel request, which ends the wait with the commit
// visible on the primary only, and the retry replays it.
// TestFailoverCancelledSyncWait shows that loss; RELIABILITY.md has the
// details.
func TestFailover(t *testing.T) {
	for _, stall := range []bool{true, false} {
		t.Run(map[bool]string{true: "stalled", false: "flowing"}[stall], func(t *testing.T) {
			r := runFailover(t, failoverConfig{sync: true, stall: stall, seed: failoverSeed(t)})
			if r.lost != 0 || r.duplicated != 0 || r.effectWithoutKey != 0 || r.unexpected != 0 || r.keyWithoutEffect != 0 || r.wrongPayload != 0 {
				t.Errorf("synchronous failover broke effectively-once: %s", r.verdict())
			}
			if r.acked != r.events {
				t.Errorf("%d of %d events acked: the worker gave up on some (%d permanent errors)", r.acked, r.events, r.permanent)
			}
			if r.ambiguous+r.transient == 0 {
				t.Errorf("no Apply failed during the failover: the fault did not hit the worker")
			}
		})
	}
}

// TestFailoverAsyncControl is the negative control: the same run with an
// asynchronous standby. The primary acks the burst without waiting for the
// standby, the stalled link keeps it from the standby, and the crash loses
// it: the checker must report lost acked events. Should a run lose none, it
// must show why: the standby had received all of the primary's WAL when the
// primary died, so there was nothing to lose.
func TestFailoverAsyncControl(t *testing.T) {
	r := runFailover(t, failoverConfig{sync: false, stall: true, seed: failoverSeed(t)})
	switch {
	case r.lost > 0:
		t.Logf("negative control: the checker caught %d acked events lost with asynchronous replication (%s); the standby had received WAL up to %s of the primary's %s",
			r.lost, strings.Join(r.lostSample, ", "), r.receivedLSN, r.killLSN)
		if r.lost < r.burstAcked {
			t.Errorf("negative control: %d burst events were acked after the link stalled, all beyond the standby's WAL, but the checker reports only %d lost",
				r.burstAcked, r.lost)
		}
	case r.burstAcked == 0:
		t.Errorf("negative control: no event of the burst was acked before the crash, so none could be lost: the fault schedule did not work")
	case r.caughtUp:
		t.Logf("negative control: no acked event was lost, because the standby had received all WAL (%s) of the primary (%s) when it was killed: the stall did not hold anything back",
			r.receivedLSN, r.killLSN)
	default:
		t.Errorf("negative control: the standby lacked WAL (received %s, primary at %s) holding %d acked burst events, yet the checker reports none lost: the checker is broken",
			r.receivedLSN, r.killLSN, r.burstAcked)
	}
	if r.duplicated != 0 || r.effectWithoutKey != 0 || r.unexpected != 0 || r.keyWithoutEffect != 0 || r.wrongPayload != 0 {
		t.Errorf("asynchronous failover: %s", r.verdict())
	}
}

// failoverSeed is FAILOVER_SEED, or a fixed seed.
func failoverSeed(t *testing.T) uint64 {
	if s := os.Getenv("FAILOVER_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FAILOVER_SEED: %v", err)
		}
		return seed
	}
	return 20240917
}

type failoverConfig struct {
	sync  bool // synchronous_standby_names names the standby
	stall bool // stall the replication link for the burst; else crash mid-burst
	seed  uint64
}

// delivery is one delivery of an event to the worker.
type delivery struct {
	event      payment
	redelivery bool
}

// stream returns the seeded deliveries in three parts: before the stall,
// the burst, and after the crash. A redelivery repeats a recent event of
// its own part, as a broker does when an ack is slow, so a redelivery never
// resurrects an event that the crash lost.
func stream(seed uint64) (parts [3][]delivery, sent map[string]payment) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	sent = make(map[string]payment, failoverEvents)
	bounds := [4]int{0, failoverEvents * 40 / 100, failoverEvents * 55 / 100, failoverEvents}
	for p := range parts {
		for i := bounds[p]; i < bounds[p+1]; i++ {
			ev := payment{EventID: fmt.Sprintf("evt-%05d", i), Amount: 100 + rng.Int64N(100_000)}
			sent[ev.EventID] = ev
			parts[p] = append(parts[p], delivery{event: ev})
			if rng.Float64() < redeliverRate {
				j := i - rng.IntN(min(32, i-bounds[p]+1))
				parts[p] = append(parts[p], delivery{event: sent[fmt.Sprintf("evt-%05d", j)], redelivery: true})
			}
		}
	}
	return parts, sent
}

func failoverKey(eventID string) effects.Key {
	return effects.MustKey(failoverScope, eventID, "ledger")
}

// failoverResult is what a run saw and what the checker found.
type failoverResult struct {
	events, deliveries, redeliveries int
	acked, burstAcked                int // distinct events acked; of them, in the burst before the crash
	applied, replayed                int // Apply results
	ambiguous, transient, canceled   int // retryable errors, by kind (canceled: any other retryable one)
	permanent                        int // errors the worker could not retry
	recovered                        int // events acked after at least one failed Apply
	downtime                         time.Duration

	killLSN, receivedLSN string // primary's WAL flush position at the crash; standby's receive position
	caughtUp             bool   // receivedLSN >= killLSN

	lost, duplicated, effectWithoutKey, keyWithoutEffect, unexpected, wrongPayload int
	lostSample                                                                     []string
}

func (r *failoverResult) verdict() string {
	return fmt.Sprintf("lost %d, duplicated %d, effect without dedup row %d, dedup row without effect %d, unexpected effect %d, wrong payload %d",
		r.lost, r.duplicated, r.effectWithoutKey, r.keyWithoutEffect, r.unexpected, r.wrongPayload)
}

// worker applies deliveries and keeps the history the checker reads.
type worker struct {
	eff *postgres.Effect[payment]

	mu       sync.Mutex
	acked    map[string]bool
	failed   map[string]bool // events with at least one failed Apply
	firstAck time.Time       // first ack after since (the failover), zero before
	since    time.Time

	applied, replayed, ambiguous, transient, canceled, permanent atomic.Int64
}

// run applies ds with failoverWorkers goroutines and returns when all are
// acked or given up.
func (w *worker) run(ctx context.Context, t *testing.T, ds []delivery) {
	next := make(chan delivery)
	var wg sync.WaitGroup
	for range failoverWorkers {
		wg.Go(func() {
			for d := range next {
				w.deliver(ctx, t, d)
			}
		})
	}
	for _, d := range ds {
		next <- d
	}
	close(next)
	wg.Wait()
}

// deliver applies one delivery until Apply returns nil (ack) or an error
// that effects.ClassOf does not call Retryable, retrying with the same key
// and backoff.
func (w *worker) deliver(ctx context.Context, t *testing.T, d delivery) {
	key := failoverKey(d.event.EventID)
	backoff := 5 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		res, err := w.eff.Apply(actx, key, d.event)
		cancel()
		if err == nil {
			w.ack(d.event.EventID, res)
			return
		}
		w.mu.Lock()
		w.failed[d.event.EventID] = true
		w.mu.Unlock()
		switch {
		case errors.Is(err, effects.ErrAmbiguous):
			w.ambiguous.Add(1)
		case errors.Is(err, effects.ErrTransient):
			w.transient.Add(1)
		case effects.ClassOf(err) == effects.Retryable:
			w.canceled.Add(1)
		}
		if effects.ClassOf(err) != effects.Retryable || ctx.Err() != nil {
			w.permanent.Add(1)
			t.Errorf("event %s: giving up: %v", d.event.EventID, err)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

func (w *worker) ack(eventID string, res effects.Result) {
	if res.Status == effects.Replayed {
		w.replayed.Add(1)
	} else {
		w.applied.Add(1)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.acked[eventID] = true
	if !w.since.IsZero() && w.firstAck.IsZero() {
		w.firstAck = time.Now()
	}
}

func (w *worker) ackedCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

func runFailover(t *testing.T, cfg failoverConfig) *failoverResult {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	start := time.Now()

	fp := startFailoverPair(t, ctx, cfg.sync)
	primary, standby, link, admin := fp.primary, fp.standby, fp.link, fp.admin
	const db = failoverDB

	// The worker connects as an application would in front of a failover
	// pair: every host, and only a read-write one will do.
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?target_session_attrs=read-write&sslmode=disable",
		primary.Port(), standby.Port(), db)
	pool := newPool(t, url, func(c *pgxpool.Config) { c.MaxConns = failoverWorkers })
	eff, err := postgres.New(pool, failoverScope, writeLedger)
	if err != nil {
		t.Fatal(err)
	}
	w := &worker{eff: eff, acked: map[string]bool{}, failed: map[string]bool{}}
	parts, sent := stream(cfg.seed)
	r := &failoverResult{events: len(sent)}
	for _, p := range parts {
		r.deliveries += len(p)
		for _, d := range p {
			if d.redelivery {
				r.redeliveries++
			}
		}
	}

	// 1. The first part flows normally.
	w.run(ctx, t, parts[0])
	before := w.ackedCount()

	// 2. Apply the burst, stalling the link first or not; 3. kill the
	// primary when the burst is done (stalled, async: all acked), after
	// burstWait (stalled, sync: the commits wait for the standby and cannot
	// be acked), or when half of the burst's events are acked (flowing).
	if cfg.stall {
		link.Stall()
	}
	burstEvents := 0
	for _, d := range parts[1] {
		if !d.redelivery {
			burstEvents++
		}
	}
	burstDone := make(chan struct{})
	go func() {
		defer close(burstDone)
		w.run(ctx, t, parts[1])
	}()
	timeout := time.After(burstWait)
wait:
	for {
		select {
		case <-burstDone:
			break wait
		case <-timeout:
			break wait
		case <-time.After(time.Millisecond):
			if !cfg.stall && w.ackedCount() >= before+burstEvents/2 {
				break wait
			}
		}
	}
	r.burstAcked = w.ackedCount() - before
	if err := admin.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text").Scan(&r.killLSN); err != nil {
		t.Fatal(err)
	}
	if err := primary.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	w.mu.Lock()
	w.since = killed
	w.mu.Unlock()
	link.Close() // the standby's walreceiver sees the link drop
	sconn, err := pgx.Connect(ctx, standby.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close(context.Background())
	var behind int64
	if err := sconn.QueryRow(ctx, "SELECT coalesce(pg_last_wal_receive_lsn()::text, '0/0'), pg_wal_lsn_diff($1::pg_lsn, coalesce(pg_last_wal_receive_lsn(), '0/0'))::bigint",
		r.killLSN).Scan(&r.receivedLSN, &behind); err != nil {
		t.Fatal(err)
	}
	r.caughtUp = behind <= 0

	// 4. Promote the standby and apply the rest of the stream.
	time.Sleep(failoverDelay)
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	<-burstDone
	w.run(ctx, t, parts[2])
	w.mu.Lock()
	if !w.firstAck.IsZero() {
		r.downtime = w.firstAck.Sub(killed)
	}
	r.acked = len(w.acked)
	for id := range w.failed {
		if w.acked[id] {
			r.recovered++
		}
	}
	w.mu.Unlock()
	r.applied, r.replayed = int(w.applied.Load()), int(w.replayed.Load())
	r.ambiguous, r.transient, r.canceled, r.permanent = int(w.ambiguous.Load()), int(w.transient.Load()), int(w.canceled.Load()), int(w.permanent.Load())

	check(t, ctx, sconn, r, sent, w.acked)
	mode := "asynchronous standby"
	if cfg.sync {
		mode = "synchronous standby"
	}
	if cfg.stall {
		mode += ", stalled link"
	} else {
		mode += ", flowing link"
	}
	t.Logf("%s, seed %d, %v: %d events in %d deliveries (%d redeliveries), %d acked (%d in the burst before the crash); "+
		"results: %d applied, %d replayed (redeliveries and retries absorbed); errors: %d ambiguous, %d transient, %d other retryable; %d events recovered by retrying; "+
		"first ack %v after the crash; primary WAL at crash %s, standby received %s (caught up: %t); checker: %s",
		mode, cfg.seed, time.Since(start).Round(time.Millisecond), r.events, r.deliveries, r.redeliveries, r.acked, r.burstAcked,
		r.applied, r.replayed, r.ambiguous, r.transient, r.canceled, r.recovered,
		r.downtime.Round(time.Millisecond), r.killLSN, r.receivedLSN, r.caughtUp, r.verdict())
	return r
}

const failoverDB = "failover"

// failoverPair is a primary with the schema and a standby that streams
// from it through link, synchronous or not; admin is connected to the
// primary.
type failoverPair struct {
	primary, standby *pgtest.Cluster
	link             *testserver.Proxy
	admin            *pgx.Conn
}

func startFailoverPair(t *testing.T, ctx context.Context, sync bool) *failoverPair {
	t.Helper()
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("DATABASE_URL is set: the failover tests need clusters of their own")
	}
	primary, err := pgtest.New(pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() })
	if err := primary.CreateDatabase(ctx, failoverDB); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, primary.URL(failoverDB))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	if err := postgres.Migrate(ctx, admin); err != nil {
		t.Fatal(err)
	}
	mustExec(t, admin, ledgerDDL)
	link, err := testserver.NewProxy(fmt.Sprintf("127.0.0.1:%d", primary.Port()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	standby, err := primary.StartStandby(pgtest.Options{Name: standbyName, Upstream: link.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() })
	wantState := "async"
	if sync {
		mustExec(t, admin, "ALTER SYSTEM SET synchronous_standby_names = '"+standbyName+"'")
		mustExec(t, admin, "SELECT pg_reload_conf()")
		wantState = "sync"
	}
	pollUntil(t, ctx, admin, "SELECT coalesce(max(sync_state), '') FROM pg_stat_replication WHERE application_name = '"+standbyName+"' AND state = 'streaming'", wantState)
	var syncCommit string
	if err := admin.QueryRow(ctx, "SHOW synchronous_commit").Scan(&syncCommit); err != nil || syncCommit != "on" {
		t.Fatalf("synchronous_commit = %q (%v), want on", syncCommit, err)
	}
	return &failoverPair{primary: primary, standby: standby, link: link, admin: admin}
}

// check is the history checker: it compares the acked events with the
// ledger and the dedup rows on the new primary.
func check(t *testing.T, ctx context.Context, conn *pgx.Conn, r *failoverResult, sent map[string]payment, acked map[string]bool) {
	type effect struct {
		rows   int
		amount int64
		sameAm bool
	}
	ledger := map[string]*effect{}
	rows, err := conn.Query(ctx, "SELECT event_id, count(*), min(amount), min(amount) = max(amount) FROM ledger GROUP BY event_id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		e := &effect{}
		if err := rows.Scan(&id, &e.rows, &e.amount, &e.sameAm); err != nil {
			t.Fatal(err)
		}
		ledger[id] = e
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	krows, err := conn.Query(ctx, "SELECT key FROM effectively_keys WHERE scope = $1", failoverScope)
	if err != nil {
		t.Fatal(err)
	}
	for krows.Next() {
		var k string
		if err := krows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		keys[k] = true
	}
	if err := krows.Err(); err != nil {
		t.Fatal(err)
	}

	var lost []string
	for id := range acked {
		if ledger[id] == nil {
			lost = append(lost, id)
		}
	}
	slices.Sort(lost)
	r.lost, r.lostSample = len(lost), lost[:min(len(lost), 5)]
	for id, e := range ledger {
		ev, ok := sent[id]
		switch {
		case !ok:
			r.unexpected++
			continue
		case e.rows > 1:
			r.duplicated++
		}
		if !e.sameAm || e.amount != ev.Amount {
			r.wrongPayload++
		}
		if !keys[string(failoverKey(id))] {
			r.effectWithoutKey++
		}
	}
	for id := range sent {
		if keys[string(failoverKey(id))] && ledger[id] == nil {
			r.keyWithoutEffect++
		}
	}
}

// TestFailoverCancelledSyncWait: the standby is slow, the caller's context
// expires while COMMIT waits for it, and pgx closes the connection. PostgreSQL
// then ends the wait with only a WARNING, and the transaction is visible on
// the primary although the standby never got it. Apply reports ErrAmbiguous;
// the retry it asks for finds the key, and a plain replay would be acked and
// then lost in the failover. The replay barrier makes the retry wait for the
// standby too, so nothing is acked while the standby lags; after the
// failover, the redelivery applies on the new primary: one effect, none lost.
// It runs for New and for NewPipelined, each in its default shape (the
// key's INSERT finds the earlier commit, and the lookup after the rollback
// replays it) and WithLookupFirst (the lookup before the write finds it):
// every path replays through the barrier.
func TestFailoverCancelledSyncWait(t *testing.T) {
	for _, lookupFirst := range []bool{false, true} {
		var opts []postgres.EffectOption
		name := ""
		if lookupFirst {
			opts, name = []postgres.EffectOption{postgres.WithLookupFirst()}, " (WithLookupFirst)"
		}
		pipelined := func(pool *pgxpool.Pool) (*postgres.Effect[payment], error) {
			return postgres.NewPipelined(pool, failoverScope, func(_ context.Context, k effects.Key, p payment) (string, []postgres.Statement, error) {
				return "ledger:" + p.EventID, []postgres.Statement{{SQL: `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, Args: []any{p.EventID, p.Amount}}}, nil
			}, opts...)
		}
		plain := func(pool *pgxpool.Pool) (*postgres.Effect[payment], error) {
			return postgres.New(pool, failoverScope, writeLedger, opts...)
		}
		t.Run("New"+name, func(t *testing.T) { failoverCancelledSyncWait(t, plain) })
		t.Run("NewPipelined"+name, func(t *testing.T) { failoverCancelledSyncWait(t, pipelined) })
	}
}

func failoverCancelledSyncWait(t *testing.T, newEffect func(*pgxpool.Pool) (*postgres.Effect[payment], error)) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fp := startFailoverPair(t, ctx, true)
	pool := newPool(t, fp.primary.URL(failoverDB), nil)
	eff, err := newEffect(pool)
	if err != nil {
		t.Fatal(err)
	}
	ev := payment{EventID: "evt-slow-standby", Amount: 4200}
	key := failoverKey(ev.EventID)

	fp.link.Stall() // the standby stops confirming
	var acked *effects.Result
	attempts := 0
	for deadline := time.Now().Add(3 * time.Second); acked == nil && time.Now().Before(deadline); attempts++ {
		actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond) // a caller's per-attempt timeout
		res, err := eff.Apply(actx, key, ev)
		cancel()
		t.Logf("Apply while the standby lags: %v, %v", res.Status, err)
		switch {
		case err == nil:
			acked = &res
		case effects.ClassOf(err) != effects.Retryable:
			t.Fatal(err)
		}
	}
	if acked != nil {
		t.Errorf("Apply returned %v (the worker acks) while the synchronous standby had not confirmed the commit", acked.Status)
	}
	if attempts < 2 {
		t.Fatalf("only %d attempts: the replay path was not exercised", attempts)
	}
	if err := fp.primary.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	fp.link.Close()
	if err := fp.standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	// The broker redelivers the unacked message to a worker on the new primary.
	pool2 := newPool(t, fp.standby.URL(failoverDB), nil)
	eff2, err := newEffect(pool2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eff2.Apply(ctx, key, ev); err != nil {
		t.Fatalf("redelivery after the failover: %v", err)
	}
	conn, err := pgx.Connect(ctx, fp.standby.URL(failoverDB))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if n := count(t, conn, "SELECT count(*) FROM ledger WHERE event_id = $1", ev.EventID); n != 1 {
		t.Errorf("%d ledger rows on the new primary after the redelivery, want 1", n)
	}
}
