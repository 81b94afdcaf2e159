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

func ExampleNew() {
	src := newListSource(
		effects.Delivery{ID: "evt_1", Ordering: "acct_1", Body: []byte(`{"amount": 1200}`)},
		effects.Delivery{ID: "evt_2", Ordering: "acct_1", Body: []byte(`{"amount": -300}`)},
		effects.Delivery{ID: "evt_1", Ordering: "acct_1", Body: []byte(`{"amount": 1200}`)}, // redelivered
		effects.Delivery{ID: "evt_3", Ordering: "acct_2", Body: []byte(`not json`)},
	)
	var ledger effects.Effect[string] = &memoryEffect{done: map[effects.Key]string{}}

	// The handler does the side effect under a key derived from the
	// delivery's id; the consumer acks only after it returned nil.
	handle := func(ctx context.Context, d effects.Delivery) error {
		var ev struct{ Amount int }
		if err := json.Unmarshal(d.Body, &ev); err != nil {
			return fmt.Errorf("decoding %s: %w: %w", d.ID, effects.ErrPoison, err)
		}
		key, err := effects.NewKey("billing", d.ID, "ledger")
		if err != nil {
			return err
		}
		res, err := ledger.Apply(ctx, key, fmt.Sprint(ev.Amount))
		if err != nil {
			return err // not acked: retried with backoff, then dead-lettered
		}
		fmt.Println(d.ID, res.Status, res.Ref)
		return nil
	}
	c, err := consume.New(src, handle,
		// One delivery at a time, none taken ahead, so that the output
		// follows the source's order; the defaults run 8 handlers, and
		// deliveries of different Orderings in any order.
		consume.WithConcurrency(1), consume.WithMaxPending(1),
		consume.WithDeadLetter(func(ctx context.Context, d effects.Delivery, err error) error {
			fmt.Println(d.ID, "dead-lettered, poison:", errors.Is(err, effects.ErrPoison))
			return nil // taken: the consumer acks it
		}),
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
	fmt.Printf("%+v\n", c.Stats())
	// Output:
	// evt_1 applied note-1
	// evt_2 applied note-2
	// evt_1 replayed note-1
	// evt_3 dead-lettered, poison: true
	// {Delivered:4 Acked:4 Retried:0 DeadLettered:1 Failed:0 Released:0 Dropped:0}
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
	)
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
	// {Delivered:4 Acked:4 Retried:0 DeadLettered:0 Failed:0 Released:0 Dropped:0}
}
