package consume_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
)

// TestConsumerReportsOverrun: a handler that ignores its context and runs
// past its attempt time limit is counted in Stats.Overran, reported as an
// EventFailed with ErrAttemptOverrun naming the delivery (a Warn line
// without an observer), and counted in TimedOut when it returns, even
// with nil.
func TestConsumerReportsOverrun(t *testing.T) {
	for _, observed := range []bool{true, false} {
		name := "logger"
		if observed {
			name = "observer"
		}
		t.Run(name, func(t *testing.T) {
			release := make(chan struct{})
			h := func(_ context.Context, d effects.Delivery) error {
				if d.ID == "stuck" {
					<-release // ignores its context
				}
				return nil
			}
			obs := &events{}
			var log syncBuffer
			opts := []consume.Option{consume.WithAttemptTimeout(50 * time.Millisecond), consume.WithoutDeadLetter()}
			if observed {
				opts = append(opts, consume.WithObserver(obs))
			} else {
				opts = append(opts, consume.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
			}
			src := newMemSource(delivery("stuck", ""))
			c := newConsumer(t, src, h, opts...)
			stop := start(t, c)
			waitFor(t, 10*time.Second, "the overrun reported", func() bool { return c.Stats().Overran == 1 })
			close(release)
			waitFor(t, 10*time.Second, "the ack", func() bool { return src.ackCount("stuck") == 1 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if st := c.Stats(); st.TimedOut != 1 || st.Overran != 1 {
				t.Errorf("stats %+v, want TimedOut 1 and Overran 1", st)
			}
			if observed {
				f := obs.of(effects.EventFailed)
				if len(f) != 1 || f[0].DeliveryID != "stuck" || !errors.Is(f[0].Err, consume.ErrAttemptOverrun) {
					t.Errorf("EventFailed = %+v, want one naming stuck with ErrAttemptOverrun", f)
				}
				return
			}
			if out := log.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "delivery_id=stuck") || !strings.Contains(out, "ignores its context") {
				t.Errorf("log:\n%s\nwant a Warn line naming stuck", out)
			}
		})
	}
}

// TestConsumerShutdownNamesWhatItWaitsFor: a handler that ignores its
// context past the shutdown grace is named, and Run waits for it.
func TestConsumerShutdownNamesWhatItWaitsFor(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{})
	h := func(_ context.Context, d effects.Delivery) error {
		close(started)
		<-release
		return nil
	}
	obs := &events{}
	c := newConsumer(t, newMemSource(delivery("deaf", "")), h, consume.WithObserver(obs),
		consume.WithShutdownGrace(10*time.Millisecond), consume.WithAttemptTimeout(0), consume.WithoutDeadLetter())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-started
	cancel()
	waitFor(t, 10*time.Second, "the waited-for delivery named", func() bool {
		for _, ev := range obs.of(effects.EventFailed) {
			if ev.DeliveryID == "deaf" && errors.Is(ev.Err, consume.ErrShutdownWait) {
				return true
			}
		}
		return false
	})
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while the handler still ran", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
