// Package chargehook is the billing pipeline from the essay, run twice on one
// fault schedule: once with the naive handler (check the dedup table, insert
// the ledger row, mark the event seen, each in its own transaction) and once
// with the effectively-once handler (package postgres: the dedup row and the
// ledger row in one transaction). It counts what each did to the ledger.
//
// The schedule injects the duplicates every hop of a webhook pipeline makes:
// the processor retrying after a slow answer, the load balancer retrying to a
// sibling pod at the same time, and the worker crashing after its effect was
// durable but before it finished (a failover or a crash before the ack), so
// the broker redelivers.
package chargehook

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// Config sets the size and the fault rates of a run.
type Config struct {
	Events  int     // payment events the processor emits
	Workers int     // concurrent workers (consumer group members)
	Seed    uint64  // seeds the fault schedule
	Sender  float64 // probability the processor retries an event (sequential duplicate)
	Sibling float64 // probability the load balancer retries to a sibling pod (concurrent duplicate)
	Crash   float64 // probability a worker crashes after the effect, before it finished (redelivery)
}

// DefaultConfig is the schedule the demo runs by default.
func DefaultConfig() Config {
	return Config{Events: 2000, Workers: 8, Seed: 42, Sender: 0.05, Sibling: 0.03, Crash: 0.02}
}

// Validate reports a configuration that cannot run.
func (c Config) Validate() error {
	switch {
	case c.Events <= 0:
		return fmt.Errorf("chargehook: events must be positive, got %d", c.Events)
	case c.Workers <= 0:
		return fmt.Errorf("chargehook: workers must be positive, got %d", c.Workers)
	}
	for name, p := range map[string]float64{"sender": c.Sender, "sibling": c.Sibling, "crash": c.Crash} {
		if p < 0 || p > 1 {
			return fmt.Errorf("chargehook: %s rate %v is not a probability", name, p)
		}
	}
	return nil
}

// Event is a payment-success webhook.
type Event struct {
	ID      string
	Account string
	Cents   int64
}

// delivery is one arrival of an event at a worker.
type delivery struct {
	event   Event
	hop     string // "first", "sender-retry", "sibling-retry", "redelivery"
	crash   bool   // the worker crashes after the effect on this delivery
	attempt int
}

// Schedule is the deterministic list of deliveries for a config.
type Schedule struct {
	Events     []Event
	deliveries [][]delivery // per batch: deliveries handed out together
	Hops       map[string]int
}

// NewSchedule draws the fault schedule from cfg.Seed.
func NewSchedule(cfg Config) Schedule {
	r := rand.New(rand.NewPCG(cfg.Seed, 0x6368617267656870))
	s := Schedule{Hops: map[string]int{}}
	for i := range cfg.Events {
		ev := Event{ID: fmt.Sprintf("evt_%06d", i), Account: fmt.Sprintf("acct_%03d", r.IntN(500)), Cents: int64(100 + r.IntN(100000))}
		s.Events = append(s.Events, ev)
		batch := []delivery{{event: ev, hop: "first", crash: r.Float64() < cfg.Crash}}
		if r.Float64() < cfg.Sibling {
			batch = append(batch, delivery{event: ev, hop: "sibling-retry"})
		}
		s.deliveries = append(s.deliveries, batch)
		if r.Float64() < cfg.Sender {
			// The processor's retry arrives a little later.
			s.deliveries = append(s.deliveries, []delivery{{event: ev, hop: "sender-retry"}})
		}
	}
	r.Shuffle(len(s.deliveries), func(i, j int) {
		// Keep retries after their event's first delivery: only shuffle
		// within small windows, as network reordering would.
		if j > i-8 && j < i+8 {
			s.deliveries[i], s.deliveries[j] = s.deliveries[j], s.deliveries[i]
		}
	})
	return s
}

// Handler processes one delivery of an event. crash asks it to crash after
// its effect became durable and before it finished.
type Handler interface {
	Name() string
	Handle(ctx context.Context, ev Event, crash bool) error
}

// errCrash is what a handler returns when the schedule crashed it.
var errCrash = errors.New("worker crashed after the effect, before finishing")

// Side reports what one handler did under the schedule.
type Side struct {
	Handler       string
	Deliveries    int            // deliveries handled, redeliveries included
	Hops          map[string]int // deliveries per hop
	LedgerRows    int            // rows in the ledger
	DoubleCharged int            // events with more than one ledger row
	ExtraRows     int            // ledger rows beyond one per event
	Lost          int            // events with no ledger row
	Elapsed       time.Duration
}

// Run plays the schedule through h and counts the ledger table.
func Run(ctx context.Context, db *pgxpool.Pool, h Handler, ledger string, s Schedule, workers int) (Side, error) {
	side := Side{Handler: h.Name(), Hops: map[string]int{}}
	queue := make(chan delivery, workers*4)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		pending  sync.WaitGroup
		firstErr error
		handled  atomic.Int64
	)
	redeliver := func(d delivery) {
		d.attempt++
		d.hop = "redelivery"
		d.crash = false
		go func() { queue <- d }() // the broker redelivers later
	}
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range queue {
				err := h.Handle(ctx, d.event, d.crash)
				handled.Add(1)
				mu.Lock()
				side.Hops[d.hop]++
				mu.Unlock()
				switch {
				case err == nil:
					pending.Done() // acked
				case (errors.Is(err, errCrash) || effects.Retryable(err)) && d.attempt < 20 && ctx.Err() == nil:
					redeliver(d) // not acked: the broker delivers it again
				default:
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("%s: event %s: %w", h.Name(), d.event.ID, err)
					}
					mu.Unlock()
					pending.Done()
				}
			}
		}()
	}
	for _, batch := range s.deliveries {
		pending.Add(len(batch))
		for _, d := range batch {
			queue <- d
		}
	}
	pending.Wait()
	close(queue)
	wg.Wait()
	side.Elapsed = time.Since(start)
	side.Deliveries = int(handled.Load())
	if firstErr != nil {
		return side, firstErr
	}
	rows, err := db.Query(ctx, fmt.Sprintf(`SELECT event_id, count(*) FROM %s GROUP BY event_id`, pgx.Identifier{ledger}.Sanitize()))
	if err != nil {
		return side, err
	}
	counts := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return side, err
		}
		counts[id] = n
	}
	if err := rows.Err(); err != nil {
		return side, err
	}
	for _, ev := range s.Events {
		n := counts[ev.ID]
		side.LedgerRows += n
		switch {
		case n == 0:
			side.Lost++
		case n > 1:
			side.DoubleCharged++
			side.ExtraRows += n - 1
		}
	}
	return side, nil
}

// Schema creates both handlers' tables. The ledgers have no unique index on
// event_id: nothing but the handler stops a double charge.
const Schema = `
CREATE TABLE IF NOT EXISTS naive_ledger (id bigserial PRIMARY KEY, event_id text NOT NULL, account text NOT NULL, cents bigint NOT NULL);
CREATE TABLE IF NOT EXISTS naive_seen (event_id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS ledger (id bigserial PRIMARY KEY, event_id text NOT NULL, account text NOT NULL, cents bigint NOT NULL);
`

// Setup creates the tables of both handlers and the keys table.
func Setup(ctx context.Context, db *pgxpool.Pool) error {
	if err := postgres.Migrate(ctx, db); err != nil {
		return err
	}
	_, err := db.Exec(ctx, Schema)
	return err
}

// Naive is the essay's first handler: check, insert and mark in three
// transactions on pooled connections.
type Naive struct{ DB *pgxpool.Pool }

// Name names the handler in reports.
func (Naive) Name() string { return "naive (check, insert, mark: 3 transactions)" }

// Handle checks the seen table, inserts the ledger row, marks the event. A
// crash between the insert and the mark leaves a charge without a mark.
func (n Naive) Handle(ctx context.Context, ev Event, crash bool) error {
	var one int
	err := n.DB.QueryRow(ctx, `SELECT 1 FROM naive_seen WHERE event_id = $1`, ev.ID).Scan(&one)
	if err == nil {
		return nil // seen: ack
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	if _, err := n.DB.Exec(ctx, `INSERT INTO naive_ledger (event_id, account, cents) VALUES ($1, $2, $3)`, ev.ID, ev.Account, ev.Cents); err != nil {
		return err
	}
	if crash {
		return errCrash // the failover: the connection dies before mark_seen
	}
	_, err = n.DB.Exec(ctx, `INSERT INTO naive_seen (event_id) VALUES ($1) ON CONFLICT DO NOTHING`, ev.ID)
	return err
}

// EffectivelyOnce is the fixed handler: the dedup row and the ledger row in
// one transaction, through package postgres.
type EffectivelyOnce struct{ eff *postgres.Effect[Event] }

// NewEffectivelyOnce builds the fixed handler on db.
func NewEffectivelyOnce(db *pgxpool.Pool) (*EffectivelyOnce, error) {
	eff, err := postgres.New(db, "chargehook", func(ctx context.Context, tx pgx.Tx, ev Event) (string, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO ledger (event_id, account, cents) VALUES ($1, $2, $3) RETURNING id`, ev.ID, ev.Account, ev.Cents).Scan(&id)
		return fmt.Sprint(id), err
	})
	if err != nil {
		return nil, err
	}
	return &EffectivelyOnce{eff: eff}, nil
}

// Name names the handler in reports.
func (*EffectivelyOnce) Name() string { return "effectively-once (dedup row in the same transaction)" }

// Contract is the handler's declared contract.
func (e *EffectivelyOnce) Contract() effects.Contract { return e.eff.Contract() }

// Handle applies the ledger effect under the event's key. A crash after the
// commit, before the ack, makes the broker redeliver; the redelivery replays.
func (e *EffectivelyOnce) Handle(ctx context.Context, ev Event, crash bool) error {
	key, err := effects.NewKey("chargehook", ev.ID, "ledger")
	if err != nil {
		return err
	}
	if _, err := e.eff.Apply(ctx, key, ev); err != nil {
		return err
	}
	if crash {
		return errCrash
	}
	return nil
}

// Result is both sides of a demo run.
type Result struct {
	Naive, Fixed Side
	Contract     effects.Contract
}

// Demo sets up the tables on db and runs the schedule drawn from cfg through
// the naive handler and then the effectively-once handler.
func Demo(ctx context.Context, db *pgxpool.Pool, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if err := Setup(ctx, db); err != nil {
		return Result{}, err
	}
	s := NewSchedule(cfg)
	naive, err := Run(ctx, db, Naive{DB: db}, "naive_ledger", s, cfg.Workers)
	if err != nil {
		return Result{}, err
	}
	eo, err := NewEffectivelyOnce(db)
	if err != nil {
		return Result{}, err
	}
	fixed, err := Run(ctx, db, eo, "ledger", s, cfg.Workers)
	if err != nil {
		return Result{}, err
	}
	return Result{Naive: naive, Fixed: fixed, Contract: eo.Contract()}, nil
}

// Crashes returns how many deliveries the schedule crashes after the effect.
func (s Schedule) Crashes() int {
	n := 0
	for _, batch := range s.deliveries {
		for _, d := range batch {
			if d.crash {
				n++
			}
		}
	}
	return n
}
