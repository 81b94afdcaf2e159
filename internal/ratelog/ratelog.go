// Package ratelog writes log lines to a logger (slog.Default() unless one
// is given) at a bounded rate, so
// that the library's failures are visible when nobody configured an
// observer, and a consumer whose every delivery fails does not flood the
// log. [Reporter] is the rule every component of this module follows:
// events to the observer when there is one, rate-limited lines otherwise.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"effectively.dev/effects"
)

// Defaults of a zero [Limiter].
const (
	// DefaultBurst is how many lines pass at once before the rate applies.
	DefaultBurst = 10
	// DefaultEvery is the pause between lines after the burst.
	DefaultEvery = time.Second
)

// Limiter is a token bucket in front of a logger: Burst lines pass at
// once, then one per Every. Lines it holds back are counted, and the next
// line it lets through carries the count as the attribute "suppressed".
// The zero Limiter uses [DefaultBurst] and [DefaultEvery]. A Limiter is
// safe for concurrent use.
type Limiter struct {
	// Burst and Every set the rate; zero values mean the defaults.
	Burst int
	Every time.Duration
	// Logger receives the lines; nil means slog.Default() at the time of
	// each line.
	Logger *slog.Logger
	// Now replaces time.Now, for tests.
	Now func() time.Time

	mu         sync.Mutex
	started    bool
	tokens     float64
	last       time.Time
	suppressed int
}

// Log writes msg with attrs at level to the Limiter's logger when the
// rate allows, and otherwise counts it.
func (l *Limiter) Log(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	logger := l.Logger
	if logger == nil {
		logger = slog.Default()
	}
	if !logger.Enabled(ctx, level) {
		return
	}
	n, ok := l.allow()
	if !ok {
		return
	}
	if n > 0 {
		attrs = append(attrs, slog.Int("suppressed", n))
	}
	logger.LogAttrs(ctx, level, msg, attrs...)
}

// allow takes a token; it returns the number of lines held back since the
// last one that passed.
func (l *Limiter) allow() (suppressed int, ok bool) {
	burst, every := l.Burst, l.Every
	if burst <= 0 {
		burst = DefaultBurst
	}
	if every <= 0 {
		every = DefaultEvery
	}
	now := time.Now()
	if l.Now != nil {
		now = l.Now()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.started {
		l.started, l.tokens, l.last = true, float64(burst), now
	}
	if el := now.Sub(l.last); el > 0 {
		l.tokens = min(float64(burst), l.tokens+float64(el)/float64(every))
		l.last = now
	}
	if l.tokens < 1 {
		l.suppressed++
		return 0, false
	}
	l.tokens--
	suppressed, l.suppressed = l.suppressed, 0
	return suppressed, true
}

// Reporter is how a component of this module reports what it handles on
// its own (an error it retries, a row it parks, a record it could not
// write): as an event to its observer when it has one, and otherwise as a
// log line through its Limiter. The zero Reporter logs to slog.Default(),
// rate-limited. A Reporter is safe for concurrent use.
type Reporter struct {
	// Observer receives the events; nil means log them instead.
	Observer effects.Observer
	// Limiter writes the lines when there is no observer.
	Limiter Limiter
}

// Report sends ev to the observer, or, without one, logs msg at level
// with attrs, followed by ev's key and error when it has them.
func (r *Reporter) Report(ctx context.Context, ev effects.Event, level slog.Level, msg string, attrs ...slog.Attr) {
	if ctx == nil {
		ctx = context.Background()
	}
	if r.Observer != nil {
		r.Observer.Observe(ctx, ev)
		return
	}
	if ev.Key != "" {
		attrs = append(attrs, slog.String("key", Bound(string(ev.Key))))
	}
	if ev.Err != nil {
		attrs = append(attrs, slog.Any("error", ev.Err))
	}
	r.Limiter.Log(ctx, level, msg, attrs...)
}
