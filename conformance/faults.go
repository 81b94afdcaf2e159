package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// ErrInjected is the error a fault returns to the adapter in place of the
// lost reply or the cut request.
var ErrInjected = errors.New("conformance: injected fault: connection lost")

// FaultKind is a kind of fault the suite injects at one round trip.
type FaultKind int

const (
	// NoFault passes traffic through.
	NoFault FaultKind = iota
	// DropReply lets the request reach the backend and the backend process
	// it, then drops the reply and closes the connection: the adapter cannot
	// know whether its request was applied.
	DropReply
	// CutRequest sends only the first half of the request's first write,
	// then closes the connection: the backend never sees a whole request.
	CutRequest
	// CancelAfterSend cancels the attempt's context right after the request
	// was sent, while the adapter waits for the reply.
	CancelAfterSend
)

// String names the fault.
func (k FaultKind) String() string {
	switch k {
	case NoFault:
		return "none"
	case DropReply:
		return "drop reply"
	case CutRequest:
		return "cut request"
	case CancelAfterSend:
		return "cancel after send"
	}
	return fmt.Sprintf("FaultKind(%d)", int(k))
}

// Faults injects deterministic faults into an adapter's traffic. The harness
// wires every connection the adapter makes through it: [Faults.DialContext]
// for adapters that dial TCP (pgx's ConnConfig.DialFunc, franz-go's
// kgo.Dialer, go-mail's WithDialContextFunc), [Faults.Transport] for HTTP
// adapters (stripe-go's HTTPClient, aws-sdk-go-v2's HTTPClient).
//
// A round trip is one request and its reply: over a connection, a write that
// follows a read (or is the connection's first write) starts a new round
// trip; over HTTP, each RoundTrip is one. Round trips are numbered from 1
// across all connections of one Faults, in the order their requests start.
// The suite first counts the round trips of a clean apply, then arms a fault
// at each number in turn. A zero Faults is not usable; use [NewFaults].
type Faults struct {
	trips atomic.Int64

	mu     sync.Mutex
	at     int64 // round trip to fault; 0 = none
	kind   FaultKind
	cancel context.CancelFunc
	fired  bool
	delay  time.Duration
}

// NewFaults returns a Faults that passes everything through until armed.
func NewFaults() *Faults { return &Faults{} }

// Arm makes round trip number n (counted from 1 over the Faults' lifetime)
// suffer kind. For CancelAfterSend, cancel is called once the request was
// sent. Arm replaces an earlier arming.
func (f *Faults) Arm(n int, kind FaultKind, cancel context.CancelFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.at, f.kind, f.cancel, f.fired = int64(n), kind, cancel, false
}

// Disarm removes the armed fault.
func (f *Faults) Disarm() { f.Arm(0, NoFault, nil) }

// Fired reports whether the armed fault has happened.
func (f *Faults) Fired() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fired
}

// SetDelay adds d of latency before every request is sent; the concurrency
// scenarios use it to widen race windows.
func (f *Faults) SetDelay(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delay = d
}

// RoundTrips returns how many round trips have started.
func (f *Faults) RoundTrips() int { return int(f.trips.Load()) }

// begin numbers a new round trip and returns the fault, if any, it must
// suffer, plus the latency to add.
func (f *Faults) begin() (FaultKind, context.CancelFunc, time.Duration) {
	n := f.trips.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at != 0 && n == f.at && !f.fired {
		f.fired = true
		return f.kind, f.cancel, f.delay
	}
	return NoFault, nil, f.delay
}

// DialContext dials a TCP connection whose traffic goes through f. Its
// signature fits pgconn.DialFunc, kgo.Dialer and go-mail's DialContextFunc.
func (f *Faults) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &faultConn{Conn: c, f: f, reading: true}, nil
}

// faultConn numbers round trips on one connection and applies faults.
type faultConn struct {
	net.Conn
	f *Faults

	mu      sync.Mutex
	reading bool      // last operation was a read (or none yet)
	pending FaultKind // fault to apply when the reply is read
	cancel  context.CancelFunc
	broken  bool
}

func (c *faultConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.broken {
		c.mu.Unlock()
		return 0, ErrInjected
	}
	var kind FaultKind
	var cancel context.CancelFunc
	var delay time.Duration
	if c.reading {
		c.reading = false
		kind, cancel, delay = c.f.begin()
	}
	if kind == CutRequest {
		c.broken = true
		c.mu.Unlock()
		if len(p) > 1 {
			_, _ = c.Conn.Write(p[:len(p)/2])
		}
		c.Conn.Close()
		return 0, ErrInjected
	}
	if kind != NoFault {
		c.pending, c.cancel = kind, cancel
	}
	c.mu.Unlock()
	if delay > 0 {
		time.Sleep(delay)
	}
	return c.Conn.Write(p)
}

func (c *faultConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.broken {
		c.mu.Unlock()
		return 0, ErrInjected
	}
	c.reading = true
	kind, cancel := c.pending, c.cancel
	c.pending, c.cancel = NoFault, nil
	c.mu.Unlock()
	switch kind {
	case CancelAfterSend:
		if cancel != nil {
			cancel()
		}
	case DropReply:
		// Wait until the backend answers (it has processed the request),
		// then lose the answer.
		buf := make([]byte, 1)
		_, _ = io.ReadAtLeast(c.Conn, buf, 1)
		c.mu.Lock()
		c.broken = true
		c.mu.Unlock()
		c.Conn.Close()
		return 0, ErrInjected
	}
	return c.Conn.Read(p)
}

// Transport returns an http.RoundTripper that sends requests through base
// (http.DefaultTransport if nil) with f's faults applied. DropReply returns
// an error after the server answered; CutRequest sends half the body and
// aborts (a request without a body is not sent); CancelAfterSend cancels
// the attempt's context after the server answered and returns the
// context's error.
func (f *Faults) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &faultTransport{base: base, f: f}
}

type faultTransport struct {
	base http.RoundTripper
	f    *Faults
}

func (t *faultTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	kind, cancel, delay := t.f.begin()
	if delay > 0 {
		time.Sleep(delay)
	}
	switch kind {
	case CutRequest:
		if req.Body == nil || req.Body == http.NoBody || req.ContentLength == 0 {
			return nil, ErrInjected
		}
		r2 := req.Clone(req.Context())
		r2.Body = &cutBody{rc: req.Body, left: max(req.ContentLength/2, 1)}
		resp, err := t.base.RoundTrip(r2)
		if err == nil {
			resp.Body.Close()
		}
		return nil, ErrInjected
	case DropReply, CancelAfterSend:
		resp, err := t.base.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if kind == CancelAfterSend && cancel != nil {
			cancel()
			return nil, req.Context().Err()
		}
		return nil, ErrInjected
	}
	return t.base.RoundTrip(req)
}

// cutBody yields left bytes of rc, then fails.
type cutBody struct {
	rc   io.ReadCloser
	left int64
}

func (b *cutBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, ErrInjected
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *cutBody) Close() error { return b.rc.Close() }
