package outbox

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/postgres/pgtest"
)

// TestRelayCrashAfterAck shows the relay's declared duplicate window: a
// relay that dies after the broker's ack and before the rows are marked
// sent leaves them unsent, and they are published again; nothing else is
// duplicated and nothing is lost.
func TestRelayCrashAfterAck(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	c := kafkatest.Start(t)
	topic := c.Topic(t, "crash", 2)
	const n, batch = 30, 10
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if _, err := Enqueue(ctx, tx, Message{ID: effects.Key(fmt.Sprint("m", i)), Topic: topic, Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	crashing, err := NewRelay(pool, c.Client(t), WithBatchSize(batch), WithProduceTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	crash := errors.New("relay process died")
	crashing.afterProduce = func(context.Context) error { return crash }
	if _, err := crashing.RelayBatch(ctx); !errors.Is(err, crash) {
		t.Fatalf("RelayBatch = %v, want the crash", err)
	}

	healthy, err := NewRelay(pool, c.Client(t), WithBatchSize(batch), WithPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- healthy.Run(rctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var unsent int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM effectively_outbox WHERE sent_at IS NULL`).Scan(&unsent); err != nil {
			t.Fatal(err)
		}
		if unsent == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still unsent", unsent)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}

	recs, err := c.ReadAll(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, r := range recs {
		id, _ := kafkatest.Header(r, kafka.KeyHeader)
		counts[id]++
	}
	dups := 0
	for i := 0; i < n; i++ {
		id := fmt.Sprint("m", i)
		switch got := counts[id]; {
		case got == 0:
			t.Errorf("%s lost", id)
		case got == 2 && i < batch:
			dups++ // in the crashed batch: the declared window
		case got != 1:
			t.Errorf("%s published %d times; only the crashed batch may repeat", id, got)
		}
	}
	if dups != batch {
		t.Errorf("%d duplicates, want the %d rows of the crashed batch", dups, batch)
	}
}

// TestRelayTorture runs three relays at once over an outbox of good rows
// with poison rows mixed in (over the topic's max.message.bytes), enqueued
// while they run. Each relay dies in the duplicate window (after the
// produce, before the mark) in about one batch in ten and carries on as a
// restarted relay would, its claims left to expire; Kafka goes down twice
// for longer than a produce timeout. Afterwards every good row was
// published, none lost; duplicates only from the batches of a crash; every
// poison row parked as permanent and never published.
func TestRelayTorture(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	c := kafkatest.Start(t)
	fake := c.RequireFake(t)
	topic := c.Topic(t, "torture", 3)
	v := "4096"
	if resp, err := kadm.NewClient(c.Client(t)).AlterTopicConfigs(ctx,
		[]kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &v}}, topic); err != nil {
		t.Fatal(err)
	} else if _, err := resp.On(topic, nil); err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	fake.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		if !down.Load() {
			return nil, nil, false
		}
		fake.KeepControl()
		return nil, errors.New("broker down"), true
	})

	const (
		rounds, perRound = 10, 40 // good rows
		batch            = 8
	)
	var crashes atomic.Int64
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	relays := make([]*Relay, 3)
	for i := range relays {
		r, err := NewRelay(pool, c.Client(t), WithBatchSize(batch), WithProduceTimeout(300*time.Millisecond),
			WithPollInterval(10*time.Millisecond), WithObserver(effects.ObserverFunc(func(context.Context, effects.Event) {})))
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(uint64(i), 42))
		r.afterProduce = func(context.Context) error {
			if rng.IntN(10) == 0 {
				crashes.Add(1)
				return errors.New("relay process died")
			}
			return nil
		}
		relays[i] = r
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(rctx); err != nil {
				t.Errorf("Run = %v", err)
			}
		}()
	}
	poison := map[string]bool{}
	for round := range rounds {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := range perRound {
			id := fmt.Sprintf("g-%d-%d", round, i)
			size := 10
			if i%10 == 5 {
				id, size = fmt.Sprintf("p-%d-%d", round, i), 8<<10
				poison[id] = true
			}
			value := make([]byte, size)
			_, _ = crand.Read(value) // incompressible
			if _, err := Enqueue(ctx, tx, Message{ID: effects.Key(id), Topic: topic, Value: value}); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if round == 3 || round == 7 {
			down.Store(true)
			time.Sleep(time.Second) // the outage: several produce timeouts
			down.Store(false)
		} else {
			time.Sleep(100 * time.Millisecond)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var pending int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM effectively_outbox WHERE sent_at IS NULL AND parked_at IS NULL`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still pending", pending)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()

	recs, err := c.ReadAll(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, r := range recs {
		id, _ := kafkatest.Header(r, kafka.KeyHeader)
		counts[id]++
	}
	lost, dups := 0, 0
	for round := range rounds {
		for i := range perRound {
			id := fmt.Sprintf("g-%d-%d", round, i)
			if i%10 == 5 {
				continue
			}
			switch n := counts[id]; {
			case n == 0:
				lost++
			case n > 1:
				dups += n - 1
			}
		}
	}
	for id := range poison {
		if counts[id] != 0 {
			t.Errorf("poison row %s published %d times", id, counts[id])
		}
	}
	var parked int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM effectively_outbox WHERE parked_at IS NOT NULL AND error_class = 'permanent'`).Scan(&parked); err != nil {
		t.Fatal(err)
	}
	if lost != 0 {
		t.Errorf("%d good rows lost", lost)
	}
	var st RelayStats
	for _, r := range relays {
		s := r.Stats()
		st.Batches, st.Sent, st.Failed, st.Parked, st.Repeated = st.Batches+s.Batches, st.Sent+s.Sent, st.Failed+s.Failed, st.Parked+s.Parked, st.Repeated+s.Repeated
	}
	// The declared window: the rows of a crashed batch, and rows a relay
	// produced after its claim expired (Repeated: another relay had them).
	if max := int(crashes.Load())*batch + int(st.Repeated); dups > max {
		t.Errorf("%d duplicates, more than the %d rows of the %d crashed batches and the %d repeated rows", dups, int(crashes.Load())*batch, crashes.Load(), st.Repeated)
	}
	if parked != len(poison) {
		t.Errorf("%d rows parked as permanent, want the %d poison rows", parked, len(poison))
	}
	if crashes.Load() == 0 {
		t.Error("no relay crashed: the test tested nothing")
	}
	t.Logf("%d good rows, %d poison; %d crashes, %d duplicates, 0 lost; relays: %+v", rounds*perRound-len(poison), len(poison), crashes.Load(), dups, st)
}
