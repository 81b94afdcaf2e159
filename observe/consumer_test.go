package observe_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/observe"
)

// sliceSource hands out its deliveries once, then blocks until ctx is done.
type sliceSource struct {
	mu    sync.Mutex
	queue []effects.Delivery
	acked chan string
}

func (s *sliceSource) Next(ctx context.Context) (effects.Delivery, error) {
	s.mu.Lock()
	if len(s.queue) > 0 {
		d := s.queue[0]
		s.queue = s.queue[1:]
		s.mu.Unlock()
		return d, nil
	}
	s.mu.Unlock()
	<-ctx.Done()
	return effects.Delivery{}, ctx.Err()
}

func (s *sliceSource) Ack(_ context.Context, d effects.Delivery) error {
	s.acked <- d.ID
	return nil
}

// TestConsumerEvents wires one Observer into a real consume.Consumer and the
// effect its handler applies: a good delivery is applied and acked, a
// poison one is retried and dead-lettered, and both show in the metrics and
// the logs with the delivery's id and attempt.
func TestConsumerEvents(t *testing.T) {
	mf := newMeterFixture(t)
	rec := &recorder{level: slog.LevelInfo}
	obs, err := observe.New(observe.WithLogger(slog.New(rec)), observe.WithMeterProvider(mf.provider))
	if err != nil {
		t.Fatal(err)
	}
	ledger := effects.Observe("ledger", effects.Effect[string](newScriptedEffect()), obs)
	src := &sliceSource{
		queue: []effects.Delivery{{ID: "ok-1"}, {ID: "poison"}},
		acked: make(chan string, 2),
	}
	deadLettered := make(chan string, 1)
	handler := func(ctx context.Context, d effects.Delivery) error {
		if d.ID == "poison" {
			return errors.New("cannot parse the body")
		}
		_, err := ledger.Apply(ctx, effects.Key("billing:"+d.ID+":ledger"), "x")
		return err
	}
	c, err := consume.New(src, handler,
		consume.WithObserver(obs),
		consume.WithMaxAttempts(3),
		consume.WithBackoff(time.Millisecond, 2*time.Millisecond),
		consume.WithDeadLetter(func(_ context.Context, d effects.Delivery, _ error) error {
			deadLettered <- d.ID
			return nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	wait := func(ch chan string, want string) {
		t.Helper()
		select {
		case got := <-ch:
			if got != want {
				t.Errorf("got %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out waiting for %q", want)
		}
	}
	wait(deadLettered, "poison")
	for range 2 { // ok-1, and the dead-lettered delivery, which is acked too
		select {
		case <-src.acked:
		case <-time.After(10 * time.Second):
			t.Fatal("timed out waiting for acks")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}

	want := map[string]int64{
		"effect=ledger,outcome=applied": 1,
		"outcome=retried":               2,
		"outcome=dead_lettered":         1,
	}
	if got := mf.collect(t).counts; !maps.Equal(got, want) {
		t.Errorf("counts %v, want %v", got, want)
	}
	var got []string
	for _, r := range rec.records() { // Info and above: the consumer's events
		got = append(got, r.level.String()+" "+r.attrs["outcome"]+" "+r.attrs["delivery_id"]+" attempt="+r.attrs["attempt"])
	}
	wantLogs := []string{
		"INFO retried poison attempt=1",
		"INFO retried poison attempt=2",
		"ERROR dead_lettered poison attempt=3",
	}
	if !slices.Equal(got, wantLogs) {
		t.Errorf("log records\n got %q\nwant %q", got, wantLogs)
	}
}

// TestDeliverySpanOutcomeIsTheMetricOutcome: a delivery dead-lettered at
// its first attempt ends its span with outcome dead_lettered and error
// class poison, as the metric and the log record say; a retried attempt's
// span says retried.
func TestDeliverySpanOutcomeIsTheMetricOutcome(t *testing.T) {
	mf := newMeterFixture(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	logs := &recorder{level: slog.LevelInfo}
	obs, err := observe.New(observe.WithTracerProvider(tp), observe.WithMeterProvider(mf.provider), observe.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	src := &sliceSource{queue: []effects.Delivery{{ID: "poison"}, {ID: "flaky"}}, acked: make(chan string, 2)}
	var flaky sync.Once
	handler := func(_ context.Context, d effects.Delivery) error {
		if d.ID == "poison" {
			return fmt.Errorf("bad body: %w", effects.ErrPoison)
		}
		var err error
		flaky.Do(func() { err = effects.ErrTransient })
		return err
	}
	c, err := consume.New(src, handler, consume.WithObserver(obs), consume.WithBackoff(time.Millisecond, time.Millisecond),
		consume.WithDeadLetter(func(context.Context, effects.Delivery, error) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	runUntilAcked(t, c, src, 2)
	spans := map[string][]string{}
	for _, s := range rec.Ended() {
		if s.Name() != observe.SpanDelivery {
			continue
		}
		id, _ := attr(s, observe.AttrDeliveryID)
		out, _ := attr(s, observe.AttrOutcome)
		class, _ := attr(s, observe.AttrClass)
		spans[id.AsString()] = append(spans[id.AsString()], out.AsString()+"/"+class.AsString())
	}
	want := map[string][]string{"poison": {"dead_lettered/poison"}, "flaky": {"retried/retryable", "applied/"}}
	if !maps.EqualFunc(spans, want, slices.Equal[[]string]) {
		t.Errorf("delivery spans %v, want %v", spans, want)
	}
	if got := mf.collect(t).counts; got["outcome=dead_lettered"] != 1 || got["outcome=retried"] != 1 {
		t.Errorf("metric counts %v, want dead_lettered 1 and retried 1", got)
	}
	var logged []string
	for _, r := range logs.records() {
		logged = append(logged, r.attrs["outcome"]+" "+r.attrs["delivery_id"])
	}
	if !slices.Contains(logged, "dead_lettered poison") || !slices.Contains(logged, "retried flaky") {
		t.Errorf("log records %q, want dead_lettered poison and retried flaky", logged)
	}
}

// TestDocumentedWorkerLogsDeadLetters: the worker of docs/operations.md
// builds its Observer with observe.New() and no options; a dead letter
// still reaches slog.Default, at Error, with the delivery id.
func TestDocumentedWorkerLogsDeadLetters(t *testing.T) {
	var buf syncBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	obs, err := observe.New() // as in docs/operations.md
	if err != nil {
		t.Fatal(err)
	}
	src := &sliceSource{queue: []effects.Delivery{{ID: "pay-17"}}, acked: make(chan string, 1)}
	handler := func(context.Context, effects.Delivery) error {
		return fmt.Errorf("json: cannot unmarshal: %w", effects.ErrPoison)
	}
	c, err := consume.New(src, handler, consume.WithConcurrency(16), consume.WithObserver(obs),
		consume.WithDeadLetter(func(context.Context, effects.Delivery, error) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	runUntilAcked(t, c, src, 1)
	out := buf.String()
	if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "outcome=dead_lettered") ||
		!strings.Contains(out, "delivery_id=pay-17") {
		t.Errorf("slog.Default got:\n%s\nwant an Error record of the dead letter", out)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runUntilAcked runs c until src acked n deliveries, then stops it.
func runUntilAcked(t *testing.T, c *consume.Consumer, src *sliceSource, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for range n {
		select {
		case <-src.acked:
		case <-time.After(10 * time.Second):
			cancel()
			<-done
			t.Fatal("timed out waiting for acks")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
