package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"effectively.dev/effects"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/kafka/outbox"
	"effectively.dev/observe"
)

// TestRelayReportsToItsObserver: with an observer, a parked row is an
// EventDeadLettered of outbox.Relay carrying the message id and the
// *ParkedError, and nothing is logged.
func TestRelayReportsToItsObserver(t *testing.T) {
	pool := outboxPool(t)
	c := kafkatest.Start(t)
	topic := smallTopic(t, c, "observed", 1, 4<<10)
	enqueue(t, pool, msg("poison-0", topic, "", 64<<10), msg("good-0", topic, "", 10))
	var (
		mu     sync.Mutex
		events []effects.Event
		logs   syncBuffer
	)
	relay, err := outbox.NewRelay(pool, c.Client(t), outbox.WithBatchSize(1), outbox.WithPollInterval(20*time.Millisecond),
		outbox.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		outbox.WithObserver(effects.ObserverFunc(func(_ context.Context, ev effects.Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, ev)
		})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	eventually(t, 20*time.Second, "the good row published", func() bool { return relay.Stats().Sent == 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	var p *outbox.ParkedError
	if len(events) != 1 || events[0].Kind != effects.EventDeadLettered || events[0].Component != "outbox.Relay" ||
		events[0].Key != "poison-0" || !errors.As(events[0].Err, &p) {
		t.Errorf("observed %+v; want one dead_lettered event of outbox.Relay for poison-0 with its *ParkedError", events)
	}
	if s := logs.String(); s != "" {
		t.Errorf("logged %q with an observer; want the events only", s)
	}
}

// TestTraceCrossesTheOutbox: Enqueue with an observe.Observer stores the
// trace of its context with the row, the relay publishes it, and a
// delivery span started from the record's headers is a child of the
// enqueueing span. Enqueueing the message again in another trace is a
// duplicate, not a reused id: the trace headers are not in the
// fingerprint.
func TestTraceCrossesTheOutbox(t *testing.T) {
	pool := outboxPool(t)
	c := kafkatest.Start(t)
	topic := c.Topic(t, "traced", 1)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	obs, err := observe.New(observe.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	m := outbox.Message{ID: "order-1", Topic: topic, Value: []byte("created")}
	enqueueIn := func(name string) (bool, error) {
		ctx, span := tp.Tracer("app").Start(context.Background(), name)
		defer span.End()
		var inserted bool
		err := inTx(t, pool, false, func(tx pgx.Tx) error {
			var err error
			inserted, err = outbox.Enqueue(ctx, tx, m, outbox.WithObserver(obs))
			return err
		})
		return inserted, err
	}
	if ok, err := enqueueIn("create order"); !ok || err != nil {
		t.Fatalf("Enqueue = %v, %v; want inserted", ok, err)
	}
	if ok, err := enqueueIn("create order again"); ok || err != nil {
		t.Fatalf("Enqueue again in another trace = %v, %v; want a duplicate (false, nil)", ok, err)
	}
	relay, err := outbox.NewRelay(pool, c.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RelayBatch(context.Background()); n != 1 || err != nil {
		t.Fatalf("RelayBatch = %d, %v; want 1 sent", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := c.ReadAll(ctx, topic)
	if err != nil || len(recs) != 1 {
		t.Fatalf("read %d records, %v; want 1", len(recs), err)
	}
	headers := map[string]string{}
	for _, h := range recs[0].Headers {
		headers[h.Key] = string(h.Value)
	}
	if headers["traceparent"] == "" {
		t.Fatalf("published headers %v; want a traceparent", headers)
	}
	_, end := obs.Start(context.Background(), effects.SpanDelivery, effects.Event{DeliveryID: "order-1", Headers: headers})
	end(effects.Event{Kind: effects.EventApplied})
	var enqueued, delivery sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "create order":
			enqueued = s
		case observe.SpanDelivery:
			delivery = s
		}
	}
	if enqueued == nil || delivery == nil {
		t.Fatal("missing the enqueueing or the delivery span")
	}
	if delivery.SpanContext().TraceID() != enqueued.SpanContext().TraceID() ||
		delivery.Parent().SpanID() != enqueued.SpanContext().SpanID() {
		t.Errorf("delivery span in trace %s under %s; want the enqueueing span's trace %s, under it (%s)",
			delivery.SpanContext().TraceID(), delivery.Parent().SpanID(),
			enqueued.SpanContext().TraceID(), enqueued.SpanContext().SpanID())
	}
}
