package testserver

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"
)

// HTTP is an HTTP server on 127.0.0.1 that keeps its address across
// restarts and can answer requests in front of its handler, as a load
// balancer or a gateway does: what the HTTP test kits (stripetest,
// httpkeytest) share. Its methods are safe for concurrent use.
type HTTP struct {
	// URL is the server's base URL, "http://127.0.0.1:port"; it stays the
	// same across Restart.
	URL string

	kit     string
	handler http.Handler
	inFront func(w http.ResponseWriter, status int)

	life sync.Mutex // serializes Restart and Close
	hs   *httptest.Server
	addr string

	mu       sync.Mutex
	requests int
	front    []frontFailure
}

// frontFailure is a request FailInFront answers.
type frontFailure struct {
	status       int
	afterHandler bool
}

// NewHTTP serves handler on a free port of 127.0.0.1. inFront writes the
// answer of a request failed in front of the handler ([HTTP.FailInFront])
// in the kit's format; kit names the kit in errors ("stripetest").
func NewHTTP(kit string, handler http.Handler, inFront func(w http.ResponseWriter, status int)) (*HTTP, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("%s: listen: %w", kit, err)
	}
	s := &HTTP{kit: kit, handler: handler, inFront: inFront, addr: ln.Addr().String()}
	s.URL = "http://" + s.addr
	s.serve(ln)
	return s, nil
}

func (s *HTTP) serve(ln net.Listener) {
	hs := httptest.NewUnstartedServer(s)
	hs.Listener.Close()
	hs.Listener = ln
	hs.Start()
	s.hs = hs
}

// ServeHTTP counts the request and answers it: in front of the handler
// when FailInFront said so, else by the handler.
func (s *HTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests++
	var front *frontFailure
	if len(s.front) > 0 {
		front = &s.front[0]
		s.front = s.front[1:]
	}
	s.mu.Unlock()
	if front == nil {
		s.handler.ServeHTTP(w, r)
		return
	}
	if front.afterHandler {
		s.handler.ServeHTTP(httptest.NewRecorder(), r) // the server answers; the reply is lost in front of it
	}
	s.inFront(w, front.status)
}

// FailInFront makes the next n requests, of any kind, get status from in
// front of the handler: without reaching it, or (afterHandler) after the
// handler ran and its reply was dropped.
func (s *HTTP) FailInFront(n, status int, afterHandler bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.front = append(s.front, frontFailure{status: status, afterHandler: afterHandler})
	}
}

// Requests returns how many requests the server received, those failed
// in front of the handler included.
func (s *HTTP) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// Close stops the server after the requests in progress have finished.
func (s *HTTP) Close() {
	s.life.Lock()
	defer s.life.Unlock()
	if s.hs != nil {
		s.hs.Close()
		s.hs = nil
	}
}

// Restart stops the server and starts it again on the same address:
// after the requests in progress have finished, or (crash) at once,
// cutting every connection with a request in progress.
func (s *HTTP) Restart(crash bool) error {
	s.life.Lock()
	defer s.life.Unlock()
	if s.hs == nil {
		return fmt.Errorf("%s: restart of a closed server", s.kit)
	}
	if crash {
		s.hs.CloseClientConnections()
	}
	s.hs.Close()
	s.hs = nil
	var (
		ln  net.Listener
		err error
	)
	for range 50 {
		if ln, err = net.Listen("tcp", s.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("%s: restart: %w", s.kit, err)
	}
	s.serve(ln)
	return nil
}
