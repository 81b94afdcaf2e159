package observe

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"effectively.dev/effects"
	"effectively.dev/internal/ratelog"
)

// Span names, one per [effects.Span]: low-cardinality, as OpenTelemetry
// asks; what varies (the step, the effect, the key) is in attributes.
const (
	SpanDelivery = "effectively.delivery"
	SpanPlan     = "effectively.plan"
	SpanStep     = "effectively.step"
	SpanEffect   = "effectively.effect"
)

// Span attribute keys, beside the log and metric ones (effect, step,
// outcome, key, delivery_id, attempt).
const (
	// AttrClass is the class of a span's error, in the words of the log
	// records' class and of kafka's dead-letter class header
	// (ratelog.Class): poison, permanent, retryable, configuration or
	// unclassified.
	AttrClass = "error.class"
	// AttrComponent names what reported an event or a span when it is
	// not an effect or a step ([effects.Event].Component): "kafka.Source",
	// "outbox.Relay", "journal", "plan billing". On spans, log records,
	// and metrics (a few bounded values).
	AttrComponent = "component"
)

var spanNames = map[effects.Span]string{
	effects.SpanDelivery: SpanDelivery,
	effects.SpanPlan:     SpanPlan,
	effects.SpanStep:     SpanStep,
	effects.SpanEffect:   SpanEffect,
}

// Start implements [effects.Tracer]: it starts an OpenTelemetry span for
// the unit, a child of the span in ctx. A delivery's span continues the
// trace its headers carry, read with the Observer's propagator
// ([WithPropagator]; W3C TraceContext by default), which kafka.Producer
// and outbox.Enqueue write with ([Observer.Inject]), so one trace runs
// from the producer through the broker to every effect: the producer's
// trace id and sampled flag decide the delivery's. With
// [WithDeliveryLinks], the delivery's span starts a new trace instead,
// linked to the producer's span. The span
// ends with the outcome: its status is Error for a failure, with the
// error recorded and its class (ratelog.Class: poison for
// effects.ErrPoison, else effects.ClassOf) as error.class.
func (o *Observer) Start(ctx context.Context, span effects.Span, ev effects.Event) (context.Context, func(effects.Event)) {
	if o == nil || o.tracer == nil {
		return ctx, func(effects.Event) {}
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(spanAttrs(ev)...)}
	if span == effects.SpanDelivery {
		opts[0] = trace.WithSpanKind(trace.SpanKindConsumer)
		if len(ev.Headers) > 0 {
			remote := o.propagator.Extract(ctx, propagation.MapCarrier(ev.Headers))
			if !o.link {
				ctx = remote
			} else if sc := trace.SpanContextFromContext(remote); sc.IsValid() {
				opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: sc}))
			}
		}
	}
	name, ok := spanNames[span]
	if !ok {
		name = "effectively.unknown"
	}
	ctx, s := o.tracer.Start(ctx, name, opts...)
	return ctx, func(out effects.Event) {
		if out.Kind != 0 {
			s.SetAttributes(attribute.String(AttrOutcome, out.Kind.String()))
		}
		if out.Err != nil {
			s.RecordError(out.Err)
			s.SetAttributes(attribute.String(AttrClass, ratelog.Class(out.Err)))
			s.SetStatus(codes.Error, out.Kind.String())
		}
		s.End()
	}
}

var _ effects.Tracer = (*Observer)(nil)

// Inject implements [effects.Propagator]: it calls set with the headers
// that carry the trace of the span in ctx, written by the Observer's
// propagator ([WithPropagator]; W3C traceparent and tracestate by
// default). With no valid span in ctx it calls nothing.
func (o *Observer) Inject(ctx context.Context, set func(key, value string)) {
	if o == nil || o.propagator == nil {
		return
	}
	o.propagator.Inject(ctx, setCarrier(set))
}

var _ effects.Propagator = (*Observer)(nil)

// setCarrier is a write-only propagation.TextMapCarrier over a set
// function.
type setCarrier func(key, value string)

func (f setCarrier) Get(string) string     { return "" }
func (f setCarrier) Set(key, value string) { f(key, value) }
func (f setCarrier) Keys() []string        { return nil }

// spanAttrs are the attributes a span starts with.
func spanAttrs(ev effects.Event) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 6)
	if ev.Effect != "" {
		attrs = append(attrs, attribute.String(AttrEffect, ev.Effect))
	}
	if ev.Step != "" {
		attrs = append(attrs, attribute.String(AttrStep, ev.Step))
	}
	if ev.Component != "" {
		attrs = append(attrs, attribute.String(AttrComponent, ev.Component))
	}
	if ev.Key != "" {
		attrs = append(attrs, attribute.String(AttrKey, ratelog.Bound(string(ev.Key))))
	}
	if ev.DeliveryID != "" {
		attrs = append(attrs, attribute.String(AttrDeliveryID, ratelog.Bound(ev.DeliveryID)))
	}
	if ev.Attempt > 0 {
		attrs = append(attrs, attribute.Int(AttrAttempt, ev.Attempt))
	}
	return attrs
}
