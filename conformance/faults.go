package conformance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Errors of the suite.
var (
	// ErrInjected is the error a fault returns to the adapter in place of
	// the lost reply or the cut request.
	ErrInjected = errors.New("conformance: injected fault: connection lost")
	// ErrSevered is the error a severed Faults returns for new connections
	// and for every read and write on the ones it cut: the process is
	// gone, as far as the network can tell.
	ErrSevered = errors.New("conformance: connections severed (a crashed process)")
	// ErrAppFault is what every [AppError] matches with errors.Is.
	ErrAppFault = errors.New("conformance: injected application error")
	// ErrUnverified is what [Report.Verify] returns (wrapped) when a field
	// of the declared contract cannot be verified and [AllowUnverified]
	// gave no reason.
	ErrUnverified = errors.New("the declared contract cannot be verified")
)

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
	// was sent, while the adapter waits for the reply, and drops the reply
	// as DropReply does: it comes after the caller gave up, so a reply
	// quicker than the client's check of its context cannot turn the fault
	// into a plain success.
	CancelAfterSend
	// SlowReply lets the request reach the backend and the backend process
	// it, then holds the reply back, the connection up, for the Faults'
	// slow-reply time ([Faults.SetSlowReply]), as a slow network would:
	// every read before the hold ends waits for the reply, and one whose
	// read deadline passes (at once if it had passed) times out without
	// it, leaving it held for a later read; closing the connection, or,
	// for [Faults.RoundTrip], the end of the caller's context, gives up on
	// it for good. An adapter whose own
	// deadline is shorter than the hold learns nothing about the outcome
	// and must say so (ErrAmbiguous, never ErrTransient, never success);
	// one that waits gets the reply, late.
	SlowReply

	// Application-level faults: the backend itself fails a request while
	// the connection stays up. They are armed at a round trip like the
	// network faults ([Faults.Arm]), with the error the backend answers
	// set by [Faults.SetAppError].

	// AppErrorBefore makes the backend answer the request with an
	// application error ([AppError]) without applying it: a serialization
	// failure (SQLSTATE 40001), a deadlock (40P01), a lock timeout
	// (55P03), a busy database, an HTTP 503 or 409 the server sends before
	// it does anything.
	AppErrorBefore FaultKind = 100
	// AppErrorAfter makes the backend apply the request and then answer it
	// with an application error: an HTTP 500 or 502 from a server that
	// did the work and failed on the way out. An adapter cannot know from
	// the error that nothing was applied, and must not say so
	// (ErrTransient); its retry must replay the work, not do it again.
	AppErrorAfter FaultKind = 101
	// SlowBackend makes the backend take the Faults' slow-backend time
	// ([Faults.SetSlowBackend]) to do the work of the request, before it
	// applies it: whatever lock or lease the adapter or the backend holds
	// meanwhile must outlast it, while duplicates arrive.
	SlowBackend FaultKind = 102
)

// defaultSlowReply is how long a [SlowReply] fault holds a reply when
// [Faults.SetSlowReply] was not called.
const defaultSlowReply = time.Second

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
	case SlowReply:
		return "slow reply"
	}
	if s := k.appString(); s != "" {
		return s
	}
	return fmt.Sprintf("FaultKind(%d)", int(k))
}

// slug names the fault in keys and subtest names.
func (k FaultKind) slug() string {
	return strings.ReplaceAll(k.String(), " ", "-")
}

// Faults injects deterministic faults into an adapter's traffic. The harness
// wires every connection the adapter makes through it: [Faults.DialContext]
// for adapters that dial TCP (pgx's ConnConfig.DialFunc, franz-go's
// kgo.Dialer, go-mail's WithDialContextFunc), [Faults.Transport] for HTTP
// adapters (stripe-go's HTTPClient, aws-sdk-go-v2's HTTPClient), and
// [Faults.SQLConnector] for a database/sql driver.
//
// A round trip is one request and its reply: over a connection, a write that
// follows a read (or is the connection's first write) starts a new round
// trip. A server's greeting before the client's first write (SMTP's 220) is
// not a round trip of its own. Round trips are numbered from 1
// across all connections of one Faults, in the order their requests start.
// The suite first counts the round trips of a clean apply, then arms a fault
// at each number in turn. The zero Faults is ready to use: it passes
// everything through until armed. A Faults must not be copied after first
// use.
type Faults struct {
	trips atomic.Int64

	mu      sync.Mutex
	at      int64 // round trip to fault; 0 = none
	kind    FaultKind
	cancel  context.CancelFunc
	fired   bool
	delay   time.Duration
	slow    time.Duration // how long SlowReply holds a reply; 0: defaultSlowReply
	conns   map[severable]struct{}
	severed bool

	appf appState // application faults (appfault.go)
}

// severable is a connection (a TCP connection, a database/sql driver
// connection) that Sever cuts.
type severable interface{ sever() }

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

// SetSlowReply sets how long a [SlowReply] fault holds the reply (default
// 1s). Set it above the adapter's own per-call deadline,
// or the reply arrives before the adapter gives up and only its patience
// is tested.
func (f *Faults) SetSlowReply(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slow = d
}

// slowReply returns the hold of a SlowReply fault.
func (f *Faults) slowReply() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.slow <= 0 {
		return defaultSlowReply
	}
	return f.slow
}

// RoundTrips returns how many round trips have started.
func (f *Faults) RoundTrips() int { return int(f.trips.Load()) }

// Sever cuts every connection made through f and makes every later dial
// through it fail with [ErrSevered]: what the backend sees when a process
// dies. The suites use it to crash an instance (a lease holder, a
// consumer) and to free a call that hangs.
func (f *Faults) Sever() {
	f.mu.Lock()
	f.severed = true
	conns := make([]severable, 0, len(f.conns))
	for c := range f.conns {
		conns = append(conns, c)
	}
	f.conns = nil
	f.mu.Unlock()
	for _, c := range conns {
		c.sever()
	}
}

// describe says where f's traffic stands, for a hang's report, counting
// round trips after the first base (those Make made).
func (f *Faults) describe(base int) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := fmt.Sprintf("it was on round trip %d of its instance", int(f.trips.Load())-base)
	if f.at != 0 {
		state := "had not fired"
		if f.fired {
			state = "had fired"
		}
		s += fmt.Sprintf(" (the %s armed at round trip %d %s)", f.kind, int(f.at)-base, state)
	}
	return s
}

// track registers a new connection, or refuses it once f is severed.
func (f *Faults) track(c net.Conn) (net.Conn, error) {
	fc := &faultConn{Conn: c, f: f, reading: true, wake: make(chan struct{})}
	if !f.register(fc) {
		c.Close()
		return nil, ErrSevered
	}
	return fc, nil
}

// register adds c to the connections Sever cuts; it reports false (and
// adds nothing) once f is severed.
func (f *Faults) register(c severable) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.severed {
		return false
	}
	if f.conns == nil {
		f.conns = map[severable]struct{}{}
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Faults) untrack(c severable) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
}

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

// unbegin takes back the round trip begin numbered last, for a call that
// reached nothing; fired says its fault fired, which arms it again.
func (f *Faults) unbegin(fired bool) {
	f.trips.Add(-1)
	if fired {
		f.mu.Lock()
		f.fired = false
		f.mu.Unlock()
	}
}

// DialContext dials a TCP connection whose traffic goes through f. Its
// signature fits pgconn.DialFunc, kgo.Dialer and go-mail's DialContextFunc.
func (f *Faults) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if f.isSevered() {
		return nil, ErrSevered
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return f.track(c)
}

func (f *Faults) isSevered() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.severed
}

// faultConn numbers round trips on one connection and applies faults.
type faultConn struct {
	net.Conn
	f *Faults

	mu        sync.Mutex
	reading   bool          // data was read since the last write (or nothing written yet)
	pending   FaultKind     // DropReply or SlowReply: what the next reply that arrives suffers
	hold      time.Duration // SlowReply: how long to hold it
	held      []byte        // a held reply's bytes not yet handed to the client
	heldUntil time.Time     // when the held reply arrives
	deadline  time.Time     // the client's read deadline, which ends a wait for a held reply
	broken    error         // ErrInjected or ErrSevered once the connection was cut
	closed    bool
	wake      chan struct{} // closed when the connection is closed or cut
	moved     chan struct{} // closed and replaced when the read deadline moves
}

// Close closes the connection and forgets it.
func (c *faultConn) Close() error {
	c.f.untrack(c)
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.wake)
	}
	c.mu.Unlock()
	return c.Conn.Close()
}

func (c *faultConn) sever() {
	c.mu.Lock()
	c.broken = ErrSevered
	if !c.closed {
		c.closed = true
		close(c.wake)
	}
	c.mu.Unlock()
	c.Conn.Close()
}

// SetDeadline sets both deadlines; the read deadline also ends a hold.
func (c *faultConn) SetDeadline(t time.Time) error {
	c.setReadDeadline(t)
	return c.Conn.SetDeadline(t)
}

// SetReadDeadline sets the read deadline, which also ends a hold.
func (c *faultConn) SetReadDeadline(t time.Time) error {
	c.setReadDeadline(t)
	return c.Conn.SetReadDeadline(t)
}

func (c *faultConn) setReadDeadline(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	if c.moved != nil {
		close(c.moved)
		c.moved = nil
	}
}

func (c *faultConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.broken != nil {
		err := c.broken
		c.mu.Unlock()
		return 0, err
	}
	var kind FaultKind
	var cancel context.CancelFunc
	var delay time.Duration
	if c.reading {
		c.reading = false
		kind, cancel, delay = c.f.begin()
		if kind.isApp() {
			delay += c.f.appOverConn(kind)
			kind = NoFault
		}
	}
	if kind == CutRequest {
		c.broken = ErrInjected
		c.mu.Unlock()
		if len(p) > 1 {
			_, _ = c.Conn.Write(p[:len(p)/2])
		}
		c.Conn.Close()
		return 0, ErrInjected
	}
	switch kind {
	case DropReply, CancelAfterSend:
		c.pending = DropReply // see CancelAfterSend
	case SlowReply:
		c.pending, c.hold = SlowReply, c.f.slowReply()
	}
	c.mu.Unlock()
	if delay > 0 {
		time.Sleep(delay)
	}
	n, err := c.Conn.Write(p)
	if kind == CancelAfterSend && cancel != nil {
		cancel() // the request is on the wire; the adapter now waits for its reply
	}
	return n, err
}

// Read reads the backend's reply. When the reply to a round trip armed with
// DropReply arrives (so the backend has processed the request), it is
// thrown away and the connection closed; one armed with SlowReply is held
// back (see [SlowReply]). The check runs after the read returns, because
// some clients (net/http's persistConn) start reading before they write.
func (c *faultConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.broken != nil {
		err := c.broken
		c.mu.Unlock()
		return 0, err
	}
	if len(c.held) > 0 { // a reply that is held, or the rest of it
		c.mu.Unlock()
		return c.readHeld(p)
	}
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	if c.broken == ErrSevered {
		c.mu.Unlock()
		return 0, ErrSevered
	}
	if n > 0 {
		c.reading = true // a reply (or a greeting) arrived: the next write is a new request
	}
	pending := c.pending
	if n > 0 && pending != NoFault {
		c.pending = NoFault
	}
	drop := pending == DropReply && n > 0
	if drop {
		c.broken = ErrInjected
	}
	hold := c.hold
	c.mu.Unlock()
	switch {
	case drop:
		c.Conn.Close()
		return 0, ErrInjected
	case pending == SlowReply && n > 0:
		return c.holdReply(p[:n], hold)
	}
	return n, err
}

// holdReply holds the first bytes of a reply for d, the connection up,
// and then hands them over (see [faultConn.readHeld]).
func (c *faultConn) holdReply(p []byte, d time.Duration) (int, error) {
	c.mu.Lock()
	c.held = append([]byte(nil), p...)
	c.heldUntil = time.Now().Add(d)
	c.mu.Unlock()
	return c.readHeld(p)
}

// readHeld reads the rest of a held reply. Until the hold ends the reply
// is still on its way, as on a real network: every read waits for it,
// and gives up without it when the client's read deadline passes (at
// once if it has passed) or the connection is closed. A read that gave
// up leaves the reply held for the next.
func (c *faultConn) readHeld(p []byte) (int, error) {
	for {
		c.mu.Lock()
		deadline, until, wake := c.deadline, c.heldUntil, c.wake
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			c.mu.Unlock()
			return 0, os.ErrDeadlineExceeded // as net.Conn: a passed deadline fails a read even with data waiting
		}
		if !time.Now().Before(until) {
			n := copy(p, c.held)
			c.held = c.held[n:]
			c.mu.Unlock()
			return n, nil
		}
		if c.moved == nil {
			c.moved = make(chan struct{})
		}
		moved := c.moved
		c.mu.Unlock()
		wait := time.Until(until)
		if !deadline.IsZero() {
			wait = min(wait, time.Until(deadline))
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-wake:
			t.Stop()
			return 0, net.ErrClosed
		case <-moved:
			t.Stop()
		}
	}
}

// RoundTrip runs fn as one round trip of f, for a backend an adapter does
// not reach over a connection f can wrap: an embedded database, a store in
// process memory, a client with no dialer to hook. fn is one request and
// its reply (one driver call, one method of the store); it runs to
// completion or not at all, and RoundTrip applies the armed fault around
// it, as a network would:
//
//   - DropReply: fn runs, its result is lost, RoundTrip returns
//     [ErrInjected];
//   - CutRequest: fn does not run, RoundTrip returns ErrInjected;
//   - CancelAfterSend: fn runs, then the attempt's context is cancelled
//     and the result lost: RoundTrip returns ctx's error, or ErrInjected
//     if ctx was not the attempt's;
//   - SlowReply: fn runs, then the result is held for the slow-reply
//     time; if ctx ends first RoundTrip returns ctx's error (the caller
//     gave up on a reply that was coming).
//
// A severed f runs nothing and returns [ErrSevered]. The delay of
// [Faults.SetDelay] comes before fn. A caller that holds a connection (a
// driver connection) must treat ErrInjected and ErrSevered as a broken
// connection, as [Faults.SQLConnector] does. RoundTrip is how a harness puts an
// in-process backend under the suite's faults: the round trips count and
// the sweeps visit each, just as for a network.
func (f *Faults) RoundTrip(ctx context.Context, fn func() error) error {
	_, err := f.roundTrip(ctx, fn, nil)
	return err
}

// roundTrip is RoundTrip, also reporting the fault that fired (NoFault if
// none, or if a slow reply came before ctx ended). When skipped (if not
// nil) accepts fn's error, fn reached nothing (a driver's ErrSkip): the
// call is not a round trip, so it is not counted, a fault that fired on it
// is armed again for the next round trip, and its error is returned as
// it is.
func (f *Faults) roundTrip(ctx context.Context, fn func() error, skipped func(error) bool) (FaultKind, error) {
	if f.isSevered() {
		return NoFault, ErrSevered
	}
	kind, cancel, delay := f.begin()
	if kind.isApp() {
		// Reported as fired, so that SQLConnector closes the driver
		// connection: its open transaction rolls back, as a server's does
		// after such an error. RoundTrip returns the error alone.
		return kind, f.appRoundTrip(ctx, kind, fn)
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return NoFault, ctx.Err()
		}
	}
	run := func() (bool, error) {
		err := fn()
		if skipped != nil && skipped(err) {
			f.unbegin(kind != NoFault)
			return true, err
		}
		return false, err
	}
	switch kind {
	case CutRequest:
		return kind, ErrInjected
	case DropReply:
		if skip, err := run(); skip {
			return NoFault, err
		}
		return kind, ErrInjected
	case CancelAfterSend:
		if skip, err := run(); skip {
			return NoFault, err
		}
		if cancel != nil {
			cancel()
		}
		if err := ctx.Err(); err != nil {
			return kind, err
		}
		return kind, ErrInjected
	case SlowReply:
		skip, err := run()
		if skip {
			return NoFault, err
		}
		t := time.NewTimer(f.slowReply())
		defer t.Stop()
		select {
		case <-t.C:
			return NoFault, err // the reply came, late
		case <-ctx.Done():
			return kind, ctx.Err()
		}
	}
	_, err := run()
	return NoFault, err
}

// Transport wires an HTTP transport's connections through f and returns
// it: base's DialContext (or a plain net.Dialer's) is wrapped so that every
// connection it dials suffers f's faults, exactly as [Faults.DialContext]
// does for TCP adapters. HTTP/1.1 is request then response on a connection,
// so a round trip is one HTTP request: DropReply lets the server answer and
// loses the answer, CutRequest sends half of the request's first write (the
// server never sees a whole request), CancelAfterSend cancels once the
// request was written and loses the answer. base is modified in place (so its
// CloseIdleConnections keeps working); nil means a new transport. Use it
// for stripe-go's and aws-sdk-go-v2's HTTPClient:
//
//	tr := f.Transport(nil)
//	client := &http.Client{Transport: tr}
//	defer tr.CloseIdleConnections()
func (f *Faults) Transport(base *http.Transport) *http.Transport {
	if base == nil {
		base = &http.Transport{MaxIdleConnsPerHost: 16}
	}
	dial := base.DialContext
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if f.isSevered() {
			return nil, ErrSevered
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return f.track(c)
	}
	base.ForceAttemptHTTP2 = false
	return base
}
