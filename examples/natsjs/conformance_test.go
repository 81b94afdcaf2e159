package natsjs_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/effects/retry"

	"example.com/natsjs"
)

// TestConformance holds the adapter to its declared contract in every
// scenario of the suite, on an embedded nats-server that the suite may
// restart.
//
// This harness cannot move the server's clock, so the horizon scenario is
// not run here (the matrix shows the 2-minute horizon as not verified,
// with the reason given to AllowUnverified); TestConformanceHorizon
// verifies the same mechanism on a short window. The server runs inside
// the test process: the harness neither crashes it nor hands a child
// process its address (no CrashRestarter, no Attacher), which
// AllowUnverified names too. WithSlowReply holds each reply 1.5 s, past
// the Publisher's 1 s ack timeout: giving up must be an unknown outcome.
func TestConformance(t *testing.T) {
	srv := startServer(t)
	conformance.Run(t, "natsjs", func(t testing.TB) conformance.Harness[natsjs.Message] {
		return newHarness(t, srv, jetstream.StreamConfig{})
	}, conformance.WithSlowReply(1500*time.Millisecond),
		conformance.AllowUnverified("nats-server's clock cannot be moved (TestConformanceHorizon verifies the horizon on a 5-second window); "+
			"the server runs inside the test process, and this harness neither crashes it nor attaches a child process to it, "+
			"nor can make it answer an application error on demand",
			conformance.ScenarioHorizon, conformance.ScenarioCrashRestart, conformance.ScenarioProcess, conformance.ScenarioAppFaults))
}

// TestConformanceHorizon runs the horizon scenario on a stream whose
// duplicate window is 5 seconds, so the adapter declares a 5-second
// horizon: a redelivery just inside it must replay. nats-server has no
// clock a test can move, so the harness ages its records by waiting
// (agingHarness). The other scenarios stay on the default window: their
// retries would outlast a short one.
func TestConformanceHorizon(t *testing.T) {
	srv := startServer(t)
	rep := conformance.Run(t, "natsjs (5s duplicate window)", func(t testing.TB) conformance.Harness[natsjs.Message] {
		return agingHarness{newHarness(t, srv, jetstream.StreamConfig{Duplicates: 5 * time.Second})}
	}, conformance.Only(conformance.ScenarioRedelivery, conformance.ScenarioHorizon),
		conformance.AllowUnverified("the horizon on a short window: TestConformance runs the other scenarios"))
	if row, ok := rep.Row(conformance.ScenarioHorizon); !ok || row.Verdict != conformance.Pass {
		t.Errorf("horizon scenario: %+v, want it run and passed", row)
	}
}

// agingHarness is a harness whose Age waits: the only way to move a real
// nats-server's duplicate window along.
type agingHarness struct{ *harness }

// Age waits d (or until ctx ends): conformance.Ager.
func (h agingHarness) Age(ctx context.Context, d time.Duration) error {
	return retry.Sleep(ctx, d)
}

// harness gives each scenario a stream of its own on a shared server, and
// counts effects as the stream's messages: one per publish it stored.
type harness struct {
	srv        *jsServer
	admin      jetstream.Stream // reads counts outside the faults
	stream     string
	ackTimeout time.Duration // the Publisher's: a second, or a third of a shorter window
}

// newHarness creates a stream (cfg plus a fresh name and subjects) for t.
// With cfg.Duplicates zero the server's default window, 2 minutes,
// applies.
func newHarness(t testing.TB, srv *jsServer, cfg jetstream.StreamConfig) *harness {
	t.Helper()
	nc, err := nats.Connect(srv.URL(), nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	sum := sha256.Sum256([]byte(t.Name() + time.Now().String()))
	copy(b[:], sum[:])
	cfg.Name = "conf_" + hex.EncodeToString(b[:])
	cfg.Subjects = []string{cfg.Name + ".>"}
	s, err := js.CreateStream(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{srv: srv, admin: s, stream: cfg.Name, ackTimeout: min(time.Second, s.CachedInfo().Config.Duplicates/3)}
}

// Restart makes the backend-restart scenario run.
func (h *harness) Restart(ctx context.Context) error { return h.srv.Restart(ctx) }

// Make connects a new client whose every connection goes through the
// faults. It reconnects quickly (the backend-restart scenario), and the
// Publisher waits at most a second (less for a short window) for an
// acknowledgement, so a lost reply shows as ErrAmbiguous without stalling
// the sweep.
func (h *harness) Make(ctx context.Context, f *conformance.Faults) (effects.Effect[natsjs.Message], func(), error) {
	nc, err := nats.Connect(h.srv.URL(), nats.SetCustomDialer(dialer{f}),
		nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err == nil {
		var p *natsjs.Publisher
		if p, err = natsjs.New(ctx, js, h.stream, natsjs.WithAckTimeout(h.ackTimeout)); err == nil {
			return p, nc.Close, nil
		}
	}
	nc.Close()
	return nil, nil, err
}

// dialer is a nats.CustomDialer that dials through the suite's faults.
type dialer struct{ f *conformance.Faults }

func (d dialer) Dial(network, address string) (net.Conn, error) {
	return d.f.DialContext(context.Background(), network, address)
}

// Input publishes to a subject named after the key (hashed: a subject
// token cannot hold every byte a key may), so Count can find it; variant 1
// changes the data.
func (h *harness) Input(key effects.Key, variant int) natsjs.Message {
	return natsjs.Message{Subject: h.subject(key), Data: fmt.Appendf(nil, "payment %q, variant %d", key, variant)}
}

func (h *harness) subject(key effects.Key) string {
	sum := sha256.Sum256([]byte(key))
	return h.stream + "." + hex.EncodeToString(sum[:16])
}

// Count reads the stream itself: how many messages it stored on the key's
// subject.
func (h *harness) Count(ctx context.Context, key effects.Key) (int, error) {
	info, err := h.admin.Info(ctx, jetstream.WithSubjectFilter(h.subject(key)))
	if err != nil {
		return 0, err
	}
	return int(info.State.Subjects[h.subject(key)]), nil
}

// Total is the number of messages in the stream.
func (h *harness) Total(ctx context.Context) (int, error) {
	info, err := h.admin.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int(info.State.Msgs), nil
}
