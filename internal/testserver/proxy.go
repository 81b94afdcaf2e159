package testserver

import (
	"errors"
	"fmt"
	"net"
	"sync"
)

// A Proxy forwards TCP connections from a loopback port to a target
// address, and can stall them: a network link the test controls. Put one
// between a primary and its standby (pgtest.Options.Upstream) to hold back WAL
// the primary has committed, and then crash the primary: what the standby
// never received is lost in the failover, which is how asynchronous
// replication loses acknowledged commits.
//
// Its methods are safe for concurrent use. Close it when done; it leaves no
// goroutines behind.
type Proxy struct {
	target string
	l      net.Listener
	done   chan struct{} // closed by Close
	wg     sync.WaitGroup

	mu      sync.Mutex
	stalled chan struct{} // non-nil while stalled; closed by Resume
	conns   map[net.Conn]struct{}
	closed  bool
}

// NewProxy starts a proxy to target ("host:port") on a free loopback port.
func NewProxy(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("testserver: proxy: %w", err)
	}
	p := &Proxy{target: target, l: l, done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the "127.0.0.1:port" the proxy listens on.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Stall stops forwarding, in both directions, on every connection, current
// and future, until [Proxy.Resume]: bytes sent either way are held, not
// delivered, and no connection is closed, so both ends see a silent link
// (like a network partition without resets). Bytes already forwarded stay
// delivered.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// Resume forwards again, delivering the held bytes first.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// Close stops listening, closes every connection (held bytes are dropped)
// and waits for the proxy's goroutines to end. Calling it again does
// nothing.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	err := p.l.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.l.Accept()
		if err != nil {
			return // closed
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		p.wg.Add(2)
		go p.pipe(server, client)
		go p.pipe(client, server)
	}
}

// track registers conns for Close, or closes them if the proxy is closed.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst, waiting while the proxy is stalled, until either
// side fails or the proxy closes; then it closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
		dst.Close()
		src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitForward() {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitForward waits while the proxy is stalled; it reports false if the
// proxy closed meanwhile.
func (p *Proxy) waitForward() bool {
	for {
		p.mu.Lock()
		stalled := p.stalled
		p.mu.Unlock()
		if stalled == nil {
			select {
			case <-p.done:
				return false
			default:
				return true
			}
		}
		select {
		case <-stalled:
		case <-p.done:
			return false
		}
	}
}
