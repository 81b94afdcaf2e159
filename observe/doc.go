// Package observe turns the events of effectively's effects, plans and
// consumers into what operators read: log records through log/slog,
// OpenTelemetry metrics and OpenTelemetry traces. It is the ready-made
// [effects.Observer] and [effects.Tracer]; the core package itself stays
// free of these dependencies.
//
// Build one [Observer] per process (or per pipeline, with
// [WithAttributes]) and hand it to every place that reports events:
//
//	obs, err := observe.New(
//		observe.WithLogger(logger),               // nil or absent: slog.Default()
//		observe.WithMeterProvider(meterProvider), // absent: otel.GetMeterProvider()
//	)
//	if err != nil { ... }
//	charge := effects.Observe("stripe.charge", stripeEffect, obs) // each Apply
//	plan = plan.WithObserver(obs)                                 // each step of a plan
//	consumer, err := consume.New(src, handler,
//		consume.WithDeadLetter(toDeadLetterTopic),
//		consume.WithObserver(obs)) // failed attempts: retried, dead_lettered, failed
//
// An effect wrapped with effects.Observe and run as a step of an observed
// plan reports each apply twice, once with the effect attribute and once
// with step: the attributes tell the two apart, so sum over one of them.
//
// # Metrics
//
// Two instruments, under the instrumentation scope "effectively.dev/observe":
//
//   - effectively.events, an Int64Counter (unit {event}): one per event.
//   - effectively.event.duration, a Float64Histogram (unit s): how long the
//     apply, step or handler took, for events that carry a duration.
//
// Both carry the attributes effect, step and component (each only when the
// event has it: [effects.Observe] sets effect, [effects.Plan] sets step, a
// source, relay or journal reporting its own failures sets component, e.g.
// kafka.Source) and outcome,
// one of applied, replayed, key_reused, in_flight, retried, dead_lettered,
// failed, pruned ([effects.EventKind.String]), plus those given with
// [WithAttributes]. Keys, delivery ids and errors are never metric
// attributes: they are unbounded, and belong in the logs. A useful alert is
// any rate of outcome="key_reused" (a bug in how keys are built) or
// outcome="dead_lettered"; a useful panel is replayed/(applied+replayed),
// the share of the work that redeliveries made and the dedup absorbed.
//
// # Logs
//
// One record per event, message "effectively: <outcome>", attributes
// outcome, effect, step, component, key, delivery_id, attempt, duration, count (for
// pruned) and error (each only when the event has it; a key or delivery id
// over 256 bytes shortened to its start and a SHA-256 prefix). Without
// [WithLogger] the records go to slog.Default(). Levels, changeable with
// [WithLevel]:
//
//   - Debug: applied, replayed, pruned. The normal path, one per effect
//     per delivery (or per statement of a pruner): too many to keep at
//     Info.
//   - Info: in_flight, retried. Expected under concurrency and transient
//     faults; worth seeing, not worth waking anyone.
//   - Warn: failed. An attempt failed; the message stays unacked and will be
//     redelivered or retried, so it may still succeed.
//   - Error: key_reused, dead_lettered. Something needs a person: two
//     different payloads share a key (never retried, never treated as a
//     duplicate), or a consumer gave up on a message.
//
// # Traces
//
// The Observer is also an [effects.Tracer]: with WithTracerProvider (or
// the global TracerProvider), each consumer attempt at a delivery, each
// plan run, each step and each Apply of an effect wrapped with
// effects.Observe is a span, nested in that order: effectively.delivery
// (kind consumer), effectively.plan, effectively.step, effectively.effect.
// Spans carry effect, step, component, key, delivery_id and attempt when
// the unit has them, and outcome when it ends; a failure sets status
// Error, records the error and its class (error.class: poison,
// permanent, retryable, configuration, unclassified: the words of the
// consumer's log class and of kafka's dead-letter class header). A
// delivery's span ends with the outcome the consumer decided (applied,
// retried, in_flight, dead_lettered, failed), the outcome of the metric.
// A delivery's span continues the trace its headers carry (see
// [Observer.Start]), which kafka.Producer and outbox.Enqueue write when
// given the Observer (it is an [effects.Propagator]: [Observer.Inject]),
// so a trace crosses the broker; [WithDeliveryLinks] links to it instead.
// Without a TracerProvider installed, spans cost a no-op call.
//
// # Cost
//
// An Observer with nothing enabled does nothing per event but ask its
// instruments and logger whether they are enabled: [New] with no options
// (slog.Default, for events below its level, and the global MeterProvider
// with none installed), or with a noop MeterProvider and a logger on
// slog.DiscardHandler, costs a few
// nanoseconds and no allocation per event, less than the two clock reads
// of the effects.Observe wrapper itself (see BenchmarkObserve). With
// metrics enabled, the attribute sets are built once per (effect, step,
// outcome) and reused, so recording allocates nothing; what is left is the
// SDK's aggregation, a few hundred nanoseconds. A logger costs what its
// handler costs, and only for records at an enabled level.
//
// When not to use it: if you need another shape (one counter per outcome,
// other attribute names), write your own [effects.Observer] (and
// [effects.Tracer] for spans). It is one method, and this package shows the
// pattern: check Enabled first, build attributes once.
package observe
