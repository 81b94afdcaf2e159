package ratelog_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"effectively.dev/internal/ratelog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// capture makes slog.Default() write text lines to a buffer for the test.
func capture(t *testing.T, level slog.Level) *bytes.Buffer {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level})))
	t.Cleanup(func() { slog.SetDefault(old) })
	return &buf
}

func TestLimiterBurstThenRate(t *testing.T) {
	buf := capture(t, slog.LevelInfo)
	now := time.Unix(0, 0)
	l := &ratelog.Limiter{Burst: 3, Every: time.Second, Now: func() time.Time { return now }}
	ctx := context.Background()
	for i := range 10 {
		l.Log(ctx, slog.LevelWarn, "failed", slog.Int("i", i))
	}
	if got := strings.Count(buf.String(), "msg=failed"); got != 3 {
		t.Fatalf("%d lines passed at once, want the burst of 3:\n%s", got, buf)
	}
	buf.Reset()
	now = now.Add(time.Second)
	l.Log(ctx, slog.LevelWarn, "failed", slog.Int("i", 10))
	l.Log(ctx, slog.LevelWarn, "failed", slog.Int("i", 11))
	out := buf.String()
	if strings.Count(out, "msg=failed") != 1 || !strings.Contains(out, "i=10") || !strings.Contains(out, "suppressed=7") {
		t.Fatalf("after one interval: %q, want one line for i=10 that reports the 7 held back", out)
	}
}

func TestLimiterSkipsDisabledLevels(t *testing.T) {
	buf := capture(t, slog.LevelError)
	l := &ratelog.Limiter{Burst: 1}
	ctx := context.Background()
	l.Log(ctx, slog.LevelInfo, "quiet") // disabled: takes no token
	l.Log(ctx, slog.LevelError, "loud")
	if out := buf.String(); strings.Contains(out, "quiet") || !strings.Contains(out, "msg=loud") || strings.Contains(out, "suppressed") {
		t.Fatalf("got %q, want only the error line, and nothing counted as suppressed", out)
	}
}

func TestLimiterWritesToItsLogger(t *testing.T) {
	def := capture(t, slog.LevelInfo)
	var own bytes.Buffer
	l := &ratelog.Limiter{Logger: slog.New(slog.NewTextHandler(&own, nil))}
	l.Log(context.Background(), slog.LevelWarn, "failed")
	if !strings.Contains(own.String(), "msg=failed") || def.Len() != 0 {
		t.Fatalf("given logger got %q, slog.Default() got %q; want the line in the given logger only", own.String(), def.String())
	}
}
