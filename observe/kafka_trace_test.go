package observe_test

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/observe"
)

// TestTraceCrossesKafka: a record produced by a kafka.Producer inside a
// span carries the span's trace in its headers, and the delivery span a
// consume.Consumer starts for it on the other side of the broker (kfake)
// is in that trace, a child of the producing span, with the handler's
// spans under it. Producing the same key again in another trace replays
// (the trace headers are not in the journal's fingerprint).
func TestTraceCrossesKafka(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "trace", 1)
	obs, rec := tracing(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	p, err := kafka.NewProducer(c.Client(t), topic, kafka.WithJournal(memjournal.New(nil)), kafka.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	pctx, pspan := tp.Tracer("producer").Start(context.Background(), "send")
	res, err := p.Apply(pctx, "evt-1", kafka.Message{Value: []byte("v")})
	pspan.End()
	if err != nil || res.Status != effects.Applied {
		t.Fatalf("Apply = %+v, %v; want applied", res, err)
	}
	rctx, rspan := tp.Tracer("producer").Start(context.Background(), "send again")
	again, err := p.Apply(rctx, "evt-1", kafka.Message{Value: []byte("v")})
	rspan.End()
	if err != nil || again.Status != effects.Replayed || again.Ref != res.Ref {
		t.Fatalf("Apply again in another trace = %+v, %v; want replayed %s, not a reused key", again, err, res.Ref)
	}

	src, err := kafka.NewSource(c.Opts(kafkatest.GroupOpts("trace", topic)...))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	type seen struct {
		traceparent string
		span        trace.SpanContext
	}
	handled := make(chan seen, 1)
	consumer, err := consume.New(src, func(ctx context.Context, d effects.Delivery) error {
		handled <- seen{d.Headers["traceparent"], trace.SpanContextFromContext(ctx)}
		return nil
	}, consume.WithObserver(obs), consume.WithoutDeadLetter())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	var got seen
	select {
	case got = <-handled:
	case <-time.After(30 * time.Second):
		t.Fatal("the record was not consumed")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}

	if got.traceparent == "" {
		t.Fatal("the record has no traceparent header")
	}
	var delivery sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == observe.SpanDelivery {
			delivery = s
		}
	}
	if delivery == nil {
		t.Fatal("no delivery span")
	}
	if got, want := delivery.SpanContext().TraceID(), pspan.SpanContext().TraceID(); got != want {
		t.Errorf("delivery span's trace %s, want the producer's %s", got, want)
	}
	if got, want := delivery.Parent().SpanID(), pspan.SpanContext().SpanID(); got != want || !delivery.Parent().IsRemote() {
		t.Errorf("delivery span's parent %s (remote %v), want the producing span %s, remote", got, delivery.Parent().IsRemote(), want)
	}
	if got.span.SpanID() != delivery.SpanContext().SpanID() {
		t.Errorf("the handler ran under span %s, want the delivery span %s", got.span.SpanID(), delivery.SpanContext().SpanID())
	}
}
