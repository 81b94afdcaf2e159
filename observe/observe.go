package observe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"effectively.dev/effects"
	"effectively.dev/internal/ratelog"
)

// Names of what this package reports, for dashboards, alerts and views.
const (
	// ScopeName is the instrumentation scope of the meter.
	ScopeName = "effectively.dev/observe"
	// EventsMetric is the Int64Counter counting events, unit {event}.
	EventsMetric = "effectively.events"
	// DurationMetric is the Float64Histogram of event durations, unit s.
	DurationMetric = "effectively.event.duration"
)

// Attribute keys, on metrics and on log records. Key, delivery id,
// attempt, duration and error appear on log records only.
const (
	AttrEffect     = "effect"      // the name given to effects.Observe
	AttrStep       = "step"        // the plan step's name
	AttrOutcome    = "outcome"     // effects.EventKind.String(): applied, replayed, ...
	AttrKey        = "key"         // the idempotency key (logs only)
	AttrDeliveryID = "delivery_id" // the message's id (logs only)
	AttrAttempt    = "attempt"     // a consumer's attempt, from 1 (logs only)
	AttrDuration   = "duration"    // how long it took (logs only; metrics: DurationMetric)
	AttrCount      = "count"       // records an EventPruned deleted (logs only)
	AttrError      = "error"       // the failure (logs only)
)

// durationBuckets are the histogram's advisory bucket bounds, in seconds:
// from a local database's millisecond to a slow remote API's half minute.
// A view in the MeterProvider overrides them.
var durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// maxCached bounds the cache of attribute sets. Effect and step names come
// from code, so a process has a few dozen; past the bound (names built from
// data, which would also flood the metrics backend) sets are built per
// event instead of growing memory without end.
const maxCached = 1024

// lastKind is the highest EventKind this package knows a level for.
const lastKind = effects.EventPruned

// defaultLevels maps each kind to its log level; see the package doc.
var defaultLevels = [lastKind + 1]slog.Level{
	effects.EventApplied:      slog.LevelDebug,
	effects.EventReplayed:     slog.LevelDebug,
	effects.EventInFlight:     slog.LevelInfo,
	effects.EventRetried:      slog.LevelInfo,
	effects.EventFailed:       slog.LevelWarn,
	effects.EventKeyReused:    slog.LevelError,
	effects.EventDeadLettered: slog.LevelError,
	effects.EventPruned:       slog.LevelDebug,
}

// messages holds each kind's log message, "effectively: " and the outcome,
// built once rather than per record.
var messages = func() (m [lastKind + 1]string) {
	for k := effects.EventApplied; k <= lastKind; k++ {
		m[k] = "effectively: " + k.String()
	}
	return m
}()

// unknownLevel is the level of a kind this package does not know (a newer
// effects, or a zero Event): loud enough to be noticed.
const unknownLevel = slog.LevelWarn

// Observer is an [effects.Observer] that logs each event through log/slog
// and counts it with OpenTelemetry metrics. Build it with [New]. It is
// safe for concurrent use, and a nil *Observer observes nothing.
type Observer struct {
	logger   *slog.Logger
	levels   [lastKind + 1]slog.Level
	events   metric.Int64Counter
	duration metric.Float64Histogram
	attrs    []attribute.KeyValue

	tracer     trace.Tracer // nil: no spans
	propagator propagation.TextMapPropagator
	link       bool // WithDeliveryLinks

	// sets caches the measurement options per (effect, step, outcome):
	// copy on write, so the hot path reads it without a lock.
	sets atomic.Pointer[map[setKey]*measureOpts]
	mu   sync.Mutex // serializes writers of sets
}

var _ effects.Observer = (*Observer)(nil)

type setKey struct {
	effect, step, component string
	kind                    effects.EventKind
}

type measureOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

// Option configures an [Observer]. Options only record their values;
// [New] validates them all at once and refuses a bad one with an
// *effects.ConfigError. A nil Option is ignored.
type Option interface{ apply(*config) }

type option func(*config)

func (f option) apply(c *config) { f(c) }

type config struct {
	logger *slog.Logger
	mp     metric.MeterProvider
	tp     trace.TracerProvider
	prop   propagation.TextMapPropagator
	attrs  []attribute.KeyValue
	levels []levelOverride // in order; New applies them over defaultLevel
	link   bool
}

type levelOverride struct {
	kind  effects.EventKind
	level slog.Level
}

// WithLogger logs every event to l, at the level of its kind (see
// the package doc's Logs and [WithLevel]). Without it, or with a nil l, the
// Observer logs to slog.Default() (as it is at the time of each record),
// so failures and dead letters are never silent; to log nothing, pass
// slog.New(slog.DiscardHandler). To add attributes to every record, pass
// l.With(...).
func WithLogger(l *slog.Logger) Option {
	return option(func(c *config) { c.logger = l })
}

// WithMeterProvider records metrics with mp. Without it, or with a nil mp,
// the Observer uses the global otel.GetMeterProvider() at the time of
// [New]; the global provider forwards to one installed later with
// otel.SetMeterProvider, and costs next to nothing until then. To turn
// metrics off, pass go.opentelemetry.io/otel/metric/noop.NewMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return option(func(c *config) { c.mp = mp })
}

// WithTracerProvider starts spans with tp (see [Observer.Start]). Without
// it, or with a nil tp, the Observer uses the global
// otel.GetTracerProvider() at the time of [New], which forwards to one
// installed later with otel.SetTracerProvider and drops spans until then.
// The propagator that reads and writes trace context is
// [WithPropagator]'s. To turn tracing off, pass
// go.opentelemetry.io/otel/trace/noop.NewTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return option(func(c *config) { c.tp = tp })
}

// WithPropagator reads and writes trace context in message headers with
// p: [Observer.Start] continues the trace a delivery's headers carry, and
// [Observer.Inject] writes the headers producers send (kafka.Producer and
// outbox.Enqueue call it when given this Observer). Without it, or with a
// nil p, the Observer uses propagation.TraceContext{} (the W3C
// traceparent and tracestate headers), so traces cross the broker with no
// global set up; pass otel.GetTextMapPropagator() to use the global one
// (for instance to carry baggage too).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return option(func(c *config) { c.prop = p })
}

// WithDeliveryLinks makes each delivery's span the root of a trace of its
// own, linked to the producer's span that the delivery's headers carry,
// instead of its child (the default). As a child, the delivery joins the
// producer's trace: the producer's trace id and sampling decision (the
// sampled flag of its traceparent, which whoever writes to the topic
// chooses) decide the consumer's, and a parent-based sampler follows
// them. With links, the consumer's own sampler decides, a trace stays
// within one service, and the producer's span is still one click away.
// Choose it when producers are outside your control or when one
// producer's trace would otherwise gather a fan-out of consumers.
func WithDeliveryLinks() Option {
	return option(func(c *config) { c.link = true })
}

// WithAttributes adds attrs to every metric point, for instance the name of
// the pipeline when one process runs several; it may be given more than
// once. Keep them few and bounded: each distinct value is a separate time
// series. [New] refuses the keys the Observer sets itself (effect, step,
// outcome). Log records do not get them: give WithLogger a logger built
// with slog.Logger.With.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return option(func(c *config) { c.attrs = append(c.attrs, attrs...) })
}

// WithLevel logs events of kind at level instead of its default (the package
// doc's Logs: Debug for applied, replayed and pruned, Info for in_flight and
// retried, Warn for failed and for a kind this package does not know, Error
// for key_reused and dead_lettered), e.g. replayed at Info while
// investigating redeliveries, or in_flight at Debug where concurrent
// duplicates are routine. [New] refuses a kind this package does not know.
func WithLevel(kind effects.EventKind, level slog.Level) Option {
	return option(func(c *config) { c.levels = append(c.levels, levelOverride{kind, level}) })
}

// defaultLevel returns the level an event of kind is logged at unless
// [WithLevel] says otherwise.
func defaultLevel(kind effects.EventKind) slog.Level {
	if kind < effects.EventApplied || kind > lastKind {
		return unknownLevel
	}
	return defaultLevels[kind]
}

// New returns an Observer configured by opts. With no options it logs to
// slog.Default() (so, with the default levels, failures at Warn and dead
// letters at Error reach the default handler) and records metrics with the
// global MeterProvider, which drops them until one is installed with
// otel.SetMeterProvider. It returns an *effects.ConfigError for an
// invalid option, and an error if the meter refuses an instrument.
func New(opts ...Option) (*Observer, error) {
	const op = "observe.New"
	c := config{}
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&c)
		}
	}
	for _, kv := range c.attrs {
		switch kv.Key {
		case AttrEffect, AttrStep, AttrComponent, AttrOutcome:
			return nil, &effects.ConfigError{Op: op, Option: "WithAttributes",
				Reason: fmt.Sprintf("%q is set by the Observer from each event", kv.Key)}
		}
		if !kv.Valid() {
			return nil, &effects.ConfigError{Op: op, Option: "WithAttributes",
				Reason: fmt.Sprintf("attribute %q is invalid (empty key or no value)", kv.Key)}
		}
	}
	levels := defaultLevels
	for _, l := range c.levels {
		if l.kind < effects.EventApplied || l.kind > lastKind {
			return nil, &effects.ConfigError{Op: op, Option: "WithLevel",
				Reason: fmt.Sprintf("unknown event kind %d", int(l.kind))}
		}
		levels[l.kind] = l.level
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	meter := c.mp.Meter(ScopeName)
	events, err1 := meter.Int64Counter(EventsMetric,
		metric.WithUnit("{event}"),
		metric.WithDescription("Events of effectively's effects, plans and consumers, by outcome."))
	duration, err2 := meter.Float64Histogram(DurationMetric,
		metric.WithUnit("s"),
		metric.WithDescription("How long the apply, plan step or handler behind an event took."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("observe: creating instruments: %w", err)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.prop == nil {
		c.prop = propagation.TraceContext{}
	}
	return &Observer{
		logger:     c.logger,
		levels:     levels,
		events:     events,
		duration:   duration,
		attrs:      append([]attribute.KeyValue(nil), c.attrs...),
		tracer:     c.tp.Tracer(ScopeName),
		propagator: c.prop,
		link:       c.link,
	}, nil
}

// Observe logs and counts ev. It never blocks on I/O of its own; a
// logger's handler or a metric reader may.
func (o *Observer) Observe(ctx context.Context, ev effects.Event) {
	if o == nil {
		return
	}
	if ctx == nil {
		ctx = context.Background()
	}
	countEvent := o.events.Enabled(ctx)
	timeEvent := ev.Duration > 0 && o.duration.Enabled(ctx)
	if countEvent || timeEvent {
		m := o.measureOpts(ev)
		if countEvent {
			o.events.Add(ctx, 1, m.add...)
		}
		if timeEvent {
			o.duration.Record(ctx, ev.Duration.Seconds(), m.rec...)
		}
	}
	logger := o.logger
	if logger == nil {
		logger = slog.Default()
	}
	level := o.level(ev.Kind)
	if logger.Enabled(ctx, level) {
		o.log(ctx, logger, level, ev)
	}
}

func (o *Observer) level(k effects.EventKind) slog.Level {
	if k < effects.EventApplied || k > lastKind {
		return unknownLevel
	}
	return o.levels[k]
}

func (o *Observer) log(ctx context.Context, logger *slog.Logger, level slog.Level, ev effects.Event) {
	outcome := ev.Kind.String()
	msg := "effectively: unknown"
	if ev.Kind >= effects.EventApplied && ev.Kind <= lastKind {
		msg = messages[ev.Kind]
	}
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs, slog.String(AttrOutcome, outcome))
	if ev.Effect != "" {
		attrs = append(attrs, slog.String(AttrEffect, ev.Effect))
	}
	if ev.Step != "" {
		attrs = append(attrs, slog.String(AttrStep, ev.Step))
	}
	if ev.Component != "" {
		attrs = append(attrs, slog.String(AttrComponent, ev.Component))
	}
	if ev.Key != "" {
		attrs = append(attrs, slog.String(AttrKey, ratelog.Bound(string(ev.Key))))
	}
	if ev.DeliveryID != "" {
		attrs = append(attrs, slog.String(AttrDeliveryID, ratelog.Bound(ev.DeliveryID)))
	}
	if ev.Attempt > 0 {
		attrs = append(attrs, slog.Int(AttrAttempt, ev.Attempt))
	}
	if ev.Duration > 0 {
		attrs = append(attrs, slog.Duration(AttrDuration, ev.Duration))
	}
	if ev.Kind == effects.EventPruned {
		attrs = append(attrs, slog.Int64(AttrCount, ev.Count))
	}
	if ev.Err != nil {
		attrs = append(attrs, slog.Any(AttrError, ev.Err))
	}
	logger.LogAttrs(ctx, level, msg, attrs...)
}

// measureOpts returns the options carrying ev's metric attributes, built
// once per (effect, step, outcome).
func (o *Observer) measureOpts(ev effects.Event) *measureOpts {
	k := setKey{effect: ev.Effect, step: ev.Step, component: ev.Component, kind: ev.Kind}
	if p := o.sets.Load(); p != nil {
		if m, ok := (*p)[k]; ok {
			return m
		}
	}
	m := o.buildOpts(k)
	o.mu.Lock()
	defer o.mu.Unlock()
	old := o.sets.Load()
	if old != nil {
		if cached, ok := (*old)[k]; ok {
			return cached
		}
		if len(*old) >= maxCached {
			return m
		}
	}
	next := make(map[setKey]*measureOpts, 1+lenOf(old))
	if old != nil {
		for kk, v := range *old {
			next[kk] = v
		}
	}
	next[k] = m
	o.sets.Store(&next)
	return m
}

func lenOf(p *map[setKey]*measureOpts) int {
	if p == nil {
		return 0
	}
	return len(*p)
}

func (o *Observer) buildOpts(k setKey) *measureOpts {
	kvs := make([]attribute.KeyValue, 0, len(o.attrs)+4)
	kvs = append(kvs, o.attrs...)
	if k.effect != "" {
		kvs = append(kvs, attribute.String(AttrEffect, k.effect))
	}
	if k.step != "" {
		kvs = append(kvs, attribute.String(AttrStep, k.step))
	}
	if k.component != "" {
		kvs = append(kvs, attribute.String(AttrComponent, k.component))
	}
	kvs = append(kvs, attribute.String(AttrOutcome, k.kind.String()))
	opt := metric.WithAttributeSet(attribute.NewSet(kvs...))
	return &measureOpts{add: []metric.AddOption{opt}, rec: []metric.RecordOption{opt}}
}
