package consume_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
)

// listSource is a Source over a fixed list of deliveries, standing in for
// kafka.NewSource or a queue of your own. Ack reports each ack on acked.
type listSource struct {
	next  chan effects.Delivery
	acked chan string
}

func newListSource(ds ...effects.Delivery) *listSource {
	s := &listSource{next: make(chan effects.Delivery, len(ds)), acked: make(chan string, len(ds))}
	for _, d := range ds {
		s.next <- d
	}
	return s
}

func (s *listSource) Next(ctx context.Context) (effects.Delivery, error) {
	select {
	case d := <-s.next:
		return d, nil
	case <-ctx.Done():
		return effects.Delivery{}, ctx.Err()
	}
}

func (s *listSource) Ack(_ context.Context, d effects.Delivery) error {
	s.acked <- d.ID
	return nil
}

// memoryEffect is a toy Effect: a map guarded by a mutex is its "backend",
// and the map's key is the dedup record.
type memoryEffect struct {
	mu   sync.Mutex
	done map[effects.Key]string
}

func (m *memoryEffect) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "memory: map key under a mutex"}
}

func (m *memoryEffect) Apply(ctx context.Context, key effects.Key, note string) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ref, ok := m.done[key]; ok {
		return effects.Result{Status: effects.Replayed, Ref: ref}, nil
	}
	ref := fmt.Sprintf("note-%d", len(m.done)+1)
	m.done[key] = ref
	return effects.Result{Status: effects.Applied, Ref: ref}, nil
}

// charges is a toy card processor: it declines amounts over 1000, for
// good, as a card network would (effects.ErrRefused).
type charges struct{ memoryEffect }

func (c *charges) Apply(ctx context.Context, key effects.Key, amount int) (effects.Result, error) {
	if amount > 1000 {
		return effects.Result{}, effects.Refused("charges.Apply", key, errors.New("card_declined"))
	}
	return c.memoryEffect.Apply(ctx, key, fmt.Sprint(amount))
}

type payment struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func ExampleNew() {
	src := newListSource(
		effects.Delivery{ID: "kafka/0/0", Ordering: "acct_1", Body: []byte(`{"id": "evt_1", "amount": 120}`)},
		effects.Delivery{ID: "kafka/0/1", Ordering: "acct_1", Body: []byte(`{"id": "evt_2", "amount": 5000}`)},
		effects.Delivery{ID: "kafka/0/2", Ordering: "acct_1", Body: []byte(`{"id": "evt_1", "amount": 120}`)}, // resent upstream
		effects.Delivery{ID: "kafka/1/0", Ordering: "acct_2", Body: []byte(`not json`)},
	)
	ledger := &memoryEffect{done: map[effects.Key]string{}}
	card := &charges{memoryEffect{done: map[effects.Key]string{}}}
	plan, err := effects.NewPlan("billing",
		effects.NewStep("ledger", effects.Effect[string](ledger), func(p payment, _ effects.Results) (string, error) {
			return fmt.Sprint(p.Amount), nil
		}),
		effects.NewStep("charge", effects.Effect[int](card), func(p payment, _ effects.Results) (int, error) {
			return p.Amount, nil
		}),
	)
	if err != nil {
		panic(err)
	}

	// The handler runs the plan keyed by the event's own id, so that the
	// same event produced twice replays; the consumer acks only after it
	// returned nil.
	handle := func(ctx context.Context, d effects.Delivery) error {
		var p payment
		if err := json.Unmarshal(d.Body, &p); err != nil {
			return fmt.Errorf("decoding %s: %w: %w", d.ID, effects.ErrPoison, err)
		}
		if err := effects.CheckID(p.ID); err != nil {
			return err
		}
		res, err := plan.Run(ctx, p.ID, p)
		if err != nil {
			return err // retried, waited for, dead-lettered or stopping Run, by its class
		}
		fmt.Println(p.ID, "ledger", res["ledger"].Status, "charge", res["charge"].Status)
		return nil
	}
	c, err := consume.New(src, handle,
		// One delivery at a time, none taken ahead, so that the output
		// follows the source's order; the defaults run 8 handlers, and
		// deliveries of different Orderings in any order.
		consume.WithConcurrency(1), consume.WithMaxPending(1),
		consume.WithDeadLetter(func(ctx context.Context, d effects.Delivery, err error) error {
			fmt.Printf("%s dead-lettered: %s\n", d.ID, effects.ClassOf(err))
			return nil // taken: the consumer acks it
		}),
		consume.WithObserver(effects.ObserverFunc(func(context.Context, effects.Event) {})), // no log lines here
	)
	if err != nil {
		panic(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { // a real program cancels on SIGTERM instead
		for range 4 {
			<-src.acked
		}
		cancel()
	}()
	if err := c.Run(ctx); err != nil { // returns nil after a graceful shutdown
		panic(err)
	}
	st := c.Stats()
	fmt.Printf("acked %d, dead-lettered %d, retried %d\n", st.Acked, st.DeadLettered, st.Retried)
	// Output:
	// evt_1 ledger applied charge applied
	// kafka/0/1 dead-lettered: permanent
	// evt_1 ledger replayed charge replayed
	// kafka/1/0 dead-lettered: permanent
	// acked 4, dead-lettered 2, retried 0
}

// A configuration error stops Run: nothing is acked or dead-lettered for
// it, and the error names the setting to fix.
func ExampleConsumer_Run_configurationError() {
	src := newListSource(effects.Delivery{ID: "evt_1", Ordering: "acct_1"})
	handle := func(ctx context.Context, d effects.Delivery) error {
		// What an adapter returns when the vendor rejects its API key.
		return &effects.ConfigError{Op: "stripe.PaymentIntents", Option: "API key", Reason: "401: the key was rejected"}
	}
	c, err := consume.New(src, handle, consume.WithoutDeadLetter(),
		consume.WithObserver(effects.ObserverFunc(func(context.Context, effects.Event) {})))
	if err != nil {
		panic(err)
	}
	err = c.Run(context.Background())
	var ce *effects.ConfigError
	fmt.Println(errors.Is(err, effects.ErrInvalidConfig), errors.As(err, &ce) && ce.Option == "API key")
	fmt.Println(err)
	fmt.Printf("acked %d\n", c.Stats().Acked)
	// Output:
	// true true
	// consume.Consumer: stopped by a configuration error; delivery "evt_1" left unacked: stripe.PaymentIntents: API key: 401: the key was rejected
	// acked 0
}

// Without a dead-letter hook, a delivery given up on is parked: held
// unacked, its Ordering waiting behind it, while the others go on.
func ExampleWithoutDeadLetter() {
	src := newListSource(
		effects.Delivery{ID: "a-1", Ordering: "a", Body: []byte("not json")},
		effects.Delivery{ID: "a-2", Ordering: "a", Body: []byte("{}")},
		effects.Delivery{ID: "b-1", Ordering: "b", Body: []byte("{}")},
	)
	handle := func(ctx context.Context, d effects.Delivery) error {
		if !json.Valid(d.Body) {
			return fmt.Errorf("%w: not JSON", effects.ErrPoison)
		}
		return nil
	}
	c, err := consume.New(src, handle, consume.WithoutDeadLetter(),
		consume.WithObserver(effects.ObserverFunc(func(context.Context, effects.Event) {})))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	fmt.Println("acked", <-src.acked)
	for c.Stats().Parked == 0 {
		time.Sleep(time.Millisecond)
	}
	fmt.Println("parked", c.Stats().Parked)
	cancel()
	if err := <-done; err != nil {
		panic(err)
	}
	// Output:
	// acked b-1
	// parked 1
}

// Batches take a run of one Ordering (a Kafka partition's records) in
// order, so one transaction carries many events of a partition.
func ExampleWithBatch() {
	src := newListSource(
		effects.Delivery{ID: "a-1", Ordering: "orders/0"},
		effects.Delivery{ID: "a-2", Ordering: "orders/0"},
		effects.Delivery{ID: "a-3", Ordering: "orders/0"},
		effects.Delivery{ID: "b-1", Ordering: "orders/1"},
	)
	handle := func(ctx context.Context, ds []effects.Delivery) []error {
		fmt.Print("batch:")
		for _, d := range ds {
			fmt.Print(" ", d.ID)
		}
		fmt.Println()
		// ... claim every key and write every effect in one transaction,
		// in the order of ds (postgres.ApplyBatch does), then:
		return make([]error, len(ds)) // all done: all acked
	}
	c, err := consume.New(src, nil,
		// A batch waits up to the linger for more deliveries, but not once
		// the consumer holds its maximum: nothing more can arrive. (With
		// the defaults, many more are taken ahead.)
		consume.WithBatch(100, time.Hour, handle),
		consume.WithConcurrency(1), consume.WithMaxPending(4),
		consume.WithoutDeadLetter())
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for range 4 {
			<-src.acked
		}
		cancel()
	}()
	if err := c.Run(ctx); err != nil {
		panic(err)
	}
	fmt.Printf("%+v\n", c.Stats())
	// Output:
	// batch: a-1 a-2 a-3 b-1
	// {Delivered:4 Acked:4 Retried:0 InFlight:0 TimedOut:0 Overran:0 DeadLettered:0 Failed:0 Released:0 Dropped:0 Parked:0}
}
