package ratelog_test

import (
	"context"
	"log/slog"
	"os"
	"time"

	"effectively.dev/internal/ratelog"
)

// A Limiter lets Burst lines through at once, then one per Every; the next
// line it lets through says how many it held back.
func ExampleLimiter() {
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	text := slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // keep the output stable
			}
			return a
		},
	})
	l := &ratelog.Limiter{Burst: 2, Every: time.Second, Logger: slog.New(text), Now: func() time.Time { return now }}
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		l.Log(ctx, slog.LevelWarn, "fetch failed", slog.Int("try", i))
	}
	now = now.Add(time.Second)
	l.Log(ctx, slog.LevelWarn, "fetch failed", slog.Int("try", 5))
	// Output:
	// level=WARN msg="fetch failed" try=0
	// level=WARN msg="fetch failed" try=1
	// level=WARN msg="fetch failed" try=5 suppressed=3
}
