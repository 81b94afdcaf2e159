package observe_test

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"effectively.dev/effects"
	"effectively.dev/observe"
)

// tracing returns an Observer whose spans a recorder keeps.
func tracing(t *testing.T) (*observe.Observer, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	obs, err := observe.New(observe.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	return obs, rec
}

func attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// TestSpansNestDeliveryPlanStepEffect: a delivery's span continues the
// trace of its traceparent header, and the plan run, its step and the
// observed effect's Apply nest inside it, in that order.
func TestSpansNestDeliveryPlanStepEffect(t *testing.T) {
	// The producer's side: a span whose context travels in the headers.
	producer := sdktrace.NewTracerProvider()
	pctx, pspan := producer.Tracer("producer").Start(context.Background(), "send")
	headers := map[string]string{}
	propagation.TraceContext{}.Inject(pctx, propagation.MapCarrier(headers))
	pspan.End()

	// Propagation is configured as OpenTelemetry asks: globally.
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	obs, rec := tracing(t) // after the propagator is set
	eff := effects.Observe("ledger", effects.Effect[string](newScriptedEffect()), obs)
	plan, err := effects.NewPlan("billing", effects.EventStep("ledger", eff))
	if err != nil {
		t.Fatal(err)
	}
	plan = plan.WithObserver(obs)
	ctx, end := obs.Start(context.Background(), effects.SpanDelivery,
		effects.Event{DeliveryID: "evt_1", Attempt: 1, Headers: headers})
	_, runErr := plan.Run(ctx, "evt_1", "100")
	end(effects.Event{Kind: effects.EventApplied, DeliveryID: "evt_1"})
	if runErr != nil {
		t.Fatal(runErr)
	}

	spans := rec.Ended()
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = s
	}
	for _, name := range []string{observe.SpanDelivery, observe.SpanPlan, observe.SpanStep, observe.SpanEffect} {
		if byName[name] == nil {
			t.Fatalf("no %s span among %d spans", name, len(spans))
		}
	}
	delivery := byName[observe.SpanDelivery]
	if got, want := delivery.SpanContext().TraceID(), pspan.SpanContext().TraceID(); got != want {
		t.Errorf("delivery span's trace %s, want the producer's %s (from the traceparent header)", got, want)
	}
	if delivery.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("delivery span kind %v, want consumer", delivery.SpanKind())
	}
	for child, parent := range map[string]string{
		observe.SpanPlan: observe.SpanDelivery, observe.SpanStep: observe.SpanPlan, observe.SpanEffect: observe.SpanStep,
	} {
		if got, want := byName[child].Parent().SpanID(), byName[parent].SpanContext().SpanID(); got != want {
			t.Errorf("%s's parent is %s, want %s", child, got, want)
		}
	}
	if v, ok := attr(byName[observe.SpanStep], observe.AttrStep); !ok || v.AsString() != "ledger" {
		t.Errorf("step span's %s = %v, want ledger", observe.AttrStep, v)
	}
	if v, ok := attr(byName[observe.SpanEffect], observe.AttrOutcome); !ok || v.AsString() != "applied" {
		t.Errorf("effect span's outcome = %v, want applied", v)
	}
}

// TestFailedSpanCarriesTheErrorClass: a failed step's span has status
// Error, the error recorded and its class.
func TestFailedSpanCarriesTheErrorClass(t *testing.T) {
	obs, rec := tracing(t)
	refusing := effects.NewStep("ledger", effects.Effect[string](newScriptedEffect()),
		func(string, effects.Results) (string, error) {
			return "", fmt.Errorf("decoding: %w", effects.ErrPoison)
		})
	plan, err := effects.NewPlan("billing", refusing)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plan.WithObserver(obs).Run(context.Background(), "evt_1", "x"); err == nil {
		t.Fatal("Run with a reused key: no error")
	}
	var step sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == observe.SpanStep {
			step = s
		}
	}
	if step == nil {
		t.Fatal("no step span")
	}
	if step.Status().Code != codes.Error {
		t.Errorf("status %v, want Error", step.Status())
	}
	if v, ok := attr(step, observe.AttrClass); !ok || v.AsString() != "poison" {
		t.Errorf("%s = %v, want poison (the dead-letter class header's word)", observe.AttrClass, v)
	}
	if len(step.Events()) == 0 || step.Events()[0].Name != "exception" {
		t.Errorf("events %v, want the recorded error", step.Events())
	}
}

// TestInjectWritesTheSpansTraceContext: Inject writes the W3C traceparent
// of the span in ctx by default and nothing without a span; WithPropagator
// replaces the format.
func TestInjectWritesTheSpansTraceContext(t *testing.T) {
	obs, _ := tracing(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "send")
	defer span.End()
	got := map[string]string{}
	obs.Inject(ctx, func(k, v string) { got[k] = v })
	want := fmt.Sprintf("00-%s-%s-01", span.SpanContext().TraceID(), span.SpanContext().SpanID())
	if got["traceparent"] != want {
		t.Errorf("injected %v, want traceparent %s", got, want)
	}
	none := map[string]string{}
	obs.Inject(context.Background(), func(k, v string) { none[k] = v })
	if len(none) != 0 {
		t.Errorf("injected %v without a span, want nothing", none)
	}
	baggageOnly, err := observe.New(observe.WithTracerProvider(tp), observe.WithPropagator(propagation.Baggage{}))
	if err != nil {
		t.Fatal(err)
	}
	other := map[string]string{}
	baggageOnly.Inject(ctx, func(k, v string) { other[k] = v })
	if _, ok := other["traceparent"]; ok {
		t.Errorf("a Baggage propagator injected %v, want no traceparent", other)
	}
}

// TestDeliveryLinks: by default a delivery's span is a child of the
// traceparent its headers carry (same trace id); with WithDeliveryLinks it
// starts its own trace and links to that span.
func TestDeliveryLinks(t *testing.T) {
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	headers := map[string]string{"traceparent": tp}
	for _, link := range []bool{false, true} {
		rec := tracetest.NewSpanRecorder()
		provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
		opts := []observe.Option{observe.WithTracerProvider(provider)}
		if link {
			opts = append(opts, observe.WithDeliveryLinks())
		}
		obs, err := observe.New(opts...)
		if err != nil {
			t.Fatal(err)
		}
		_, end := obs.Start(context.Background(), effects.SpanDelivery, effects.Event{DeliveryID: "d", Headers: headers})
		end(effects.Event{Kind: effects.EventApplied})
		spans := rec.Ended()
		if len(spans) != 1 {
			t.Fatalf("link=%v: %d spans", link, len(spans))
		}
		s := spans[0]
		child := s.SpanContext().TraceID().String() == "0af7651916cd43dd8448eb211c80319c" && s.Parent().SpanID().String() == "b7ad6b7169203331"
		linked := len(s.Links()) == 1 && s.Links()[0].SpanContext.SpanID().String() == "b7ad6b7169203331"
		if link && (child || !linked || s.Parent().IsValid()) {
			t.Errorf("with links: trace %s parent %s links %v; want a new root linked to the producer", s.SpanContext().TraceID(), s.Parent().SpanID(), s.Links())
		}
		if !link && (!child || linked) {
			t.Errorf("default: trace %s parent %s links %v; want the producer's child", s.SpanContext().TraceID(), s.Parent().SpanID(), s.Links())
		}
	}
}
