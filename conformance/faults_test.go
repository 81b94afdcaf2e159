package conformance_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"effectively.dev/conformance"
)

// lineServer answers each complete line with "ok\n" and counts the lines it
// processed: a minimal request/reply protocol over a real socket.
type lineServer struct {
	ln        net.Listener
	processed atomic.Int64
	wg        sync.WaitGroup
}

func startLineServer(t *testing.T) *lineServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &lineServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return // a partial line is never processed
					}
					_ = line
					s.processed.Add(1)
					if _, err := io.WriteString(c, "ok\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); s.wg.Wait() })
	return s
}

// call sends one line and reads the reply.
func call(c net.Conn, r *bufio.Reader) error {
	if _, err := io.WriteString(c, "req\n"); err != nil {
		return err
	}
	_, err := r.ReadString('\n')
	return err
}

func dial(t *testing.T, f *conformance.Faults, s *lineServer) (net.Conn, *bufio.Reader) {
	c, err := f.DialContext(context.Background(), "tcp", s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func TestFaultsCountRoundTrips(t *testing.T) {
	s := startLineServer(t)
	f := new(conformance.Faults)
	c, r := dial(t, f, s)
	for i := 0; i < 3; i++ {
		if err := call(c, r); err != nil {
			t.Fatal(err)
		}
	}
	c2, r2 := dial(t, f, s)
	if err := call(c2, r2); err != nil {
		t.Fatal(err)
	}
	if got := f.RoundTrips(); got != 4 {
		t.Fatalf("RoundTrips = %d, want 4 across two connections", got)
	}
}

func TestDropReplyAfterServerProcessed(t *testing.T) {
	s := startLineServer(t)
	f := new(conformance.Faults)
	f.Arm(2, conformance.DropReply, nil)
	c, r := dial(t, f, s)
	if err := call(c, r); err != nil {
		t.Fatalf("round trip 1: %v", err)
	}
	err := call(c, r)
	if !errors.Is(err, conformance.ErrInjected) {
		t.Fatalf("round trip 2: %v, want ErrInjected", err)
	}
	if !f.Fired() {
		t.Fatal("Fired() = false after the fault")
	}
	if got := s.processed.Load(); got != 2 {
		t.Fatalf("server processed %d requests, want 2: the dropped reply's request must have been processed", got)
	}
	if err := call(c, r); err == nil {
		t.Fatal("connection still usable after a dropped reply")
	}
}

func TestCutRequestNeverReachesServerWhole(t *testing.T) {
	s := startLineServer(t)
	f := new(conformance.Faults)
	f.Arm(1, conformance.CutRequest, nil)
	c, r := dial(t, f, s)
	if err := call(c, r); !errors.Is(err, conformance.ErrInjected) {
		t.Fatalf("cut request: %v, want ErrInjected", err)
	}
	c2, r2 := dial(t, f, s) // a new connection works: the fault fired once
	if err := call(c2, r2); err != nil {
		t.Fatal(err)
	}
	if got := s.processed.Load(); got != 1 {
		t.Fatalf("server processed %d requests, want 1 (only the uncut one)", got)
	}
}

func TestCancelAfterSend(t *testing.T) {
	s := startLineServer(t)
	f := new(conformance.Faults)
	ctx, cancel := context.WithCancel(context.Background())
	f.Arm(1, conformance.CancelAfterSend, cancel)
	c, r := dial(t, f, s)
	if err := call(c, r); err == nil {
		t.Fatal("the reply to a cancelled request reached the client; want it dropped")
	}
	if ctx.Err() == nil {
		t.Fatal("context not cancelled after the request was sent")
	}
}

// TestSlowReplyHeldPastDeadline: a reply held past the client's read
// deadline stays held, as on a real network: a read whose deadline passes
// times out, a read with the deadline still in the past times out at
// once, a read with no deadline waits until the hold ends, and only then
// is the reply handed over, whole.
func TestSlowReplyHeldPastDeadline(t *testing.T) {
	const hold = 600 * time.Millisecond
	s := startLineServer(t)
	f := new(conformance.Faults)
	f.SetSlowReply(hold)
	f.Arm(1, conformance.SlowReply, nil)
	c, r := dial(t, f, s)
	start := time.Now()
	if _, err := io.WriteString(c, "req\n"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := r.ReadString('\n'); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	again := time.Now()
	if _, err := c.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read again with the deadline passed: %v, want os.ErrDeadlineExceeded: the held reply leaked", err)
	}
	if d := time.Since(again); d > hold/2 {
		t.Errorf("read with the deadline passed took %v, want it to fail at once", d)
	}
	if got := s.processed.Load(); got != 1 {
		t.Fatalf("server processed %d requests, want 1: the held reply's request was processed", got)
	}
	c.SetReadDeadline(time.Time{})
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "ok\n" {
		t.Fatalf("read with no deadline: %q, %v, want the held reply", line, err)
	}
	if d := time.Since(start); d < hold {
		t.Errorf("the held reply arrived after %v, want no sooner than the hold, %v", d, hold)
	}
}

func TestTransportFaults(t *testing.T) {
	var processed atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			return // an incomplete body is never processed
		}
		processed.Add(1)
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	post := func(f *conformance.Faults, ctx context.Context) error {
		tr := f.Transport(nil)
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr}
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(strings.Repeat("x", 4096)))
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}

	f := new(conformance.Faults)
	f.Arm(2, conformance.DropReply, nil)
	if err := post(f, context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := post(f, context.Background()); !errors.Is(err, conformance.ErrInjected) {
		t.Fatalf("drop reply: %v", err)
	}
	if processed.Load() != 2 || f.RoundTrips() != 2 {
		t.Fatalf("processed %d, round trips %d; want 2 and 2", processed.Load(), f.RoundTrips())
	}

	f = new(conformance.Faults)
	f.Arm(1, conformance.CutRequest, nil)
	if err := post(f, context.Background()); !errors.Is(err, conformance.ErrInjected) {
		t.Fatalf("cut request: %v", err)
	}
	if processed.Load() != 2 {
		t.Fatalf("a cut request was processed (%d)", processed.Load())
	}

	f = new(conformance.Faults)
	ctx, cancel := context.WithCancel(context.Background())
	f.Arm(1, conformance.CancelAfterSend, cancel)
	// Cancelled once the request is on the wire: the server may or may not
	// process it, and the client sees the cancellation or, if the reply won
	// the race, the reply. Either way the outcome is unknown to the adapter
	// until it retries.
	if err := post(f, ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel after send: %v", err)
	}
	if ctx.Err() == nil || !f.Fired() {
		t.Fatal("cancel after send: the context was not cancelled")
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
