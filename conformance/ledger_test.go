package conformance_test

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// ledgerServer is the backend of the example adapter: a dedup service
// over TCP, one line per request. "APPLY <hex key> <hex payload>" writes
// one ledger entry unless the key was applied before (then it answers
// with the first entry's ref) or was applied with another payload
// (REUSED). The ledger itself keeps every write, so duplicates stay
// visible to Count. Its clock can be moved forward (Age); it forgets a
// key only after ttl, and ttl 0 (the honest server) means never. Told to
// fail the next request (failNext), it answers "BUSY <code>" without
// applying it, or applies it and answers "ERR <code>".
type ledgerServer struct {
	ttl time.Duration

	mu      sync.Mutex
	ln      net.Listener
	addr    string
	conns   map[net.Conn]struct{}
	keys    map[string]ledgerKey
	entries map[string]int // writes per key
	total   int
	offset  time.Duration // added to the wall clock by Age
	fail    []ledgerFailure
	wg      sync.WaitGroup
}

// ledgerFailure is an application error the server answers to the next
// request: code, after applying the request when applied.
type ledgerFailure struct {
	code    string
	applied bool
}

// failNext makes the server answer the next APPLY with code, applying it
// first when applied.
func (s *ledgerServer) failNext(code string, applied bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = append(s.fail, ledgerFailure{code, applied})
}

type ledgerKey struct {
	payload, ref string
	at           time.Time
}

// newLedgerServer starts a server on a free loopback port; stop it when
// done.
func newLedgerServer(ttl time.Duration) (*ledgerServer, error) {
	s := &ledgerServer{ttl: ttl, conns: map[net.Conn]struct{}{}, keys: map[string]ledgerKey{}, entries: map[string]int{}}
	if err := s.listen("127.0.0.1:0"); err != nil {
		return nil, err
	}
	return s, nil
}

func startLedger(t testing.TB, ttl time.Duration) *ledgerServer {
	s, err := newLedgerServer(ttl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	return s
}

func (s *ledgerServer) listen(addr string) error {
	var (
		ln  net.Listener
		err error
	)
	for range 50 { // a restart's port may take a moment to free
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.ln, s.addr = ln, ln.Addr().String()
	s.mu.Unlock()
	s.wg.Add(1)
	go s.accept(ln)
	return nil
}

func (s *ledgerServer) accept(ln net.Listener) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *ledgerServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return // a partial request is never processed
		}
		if _, err := fmt.Fprintln(c, s.handle(strings.TrimSpace(line))); err != nil {
			return
		}
	}
}

func (s *ledgerServer) handle(line string) string {
	if line == "PING" {
		return "PONG"
	}
	var hk, hp string
	if _, err := fmt.Sscanf(line, "APPLY %s %s", &hk, &hp); err != nil {
		return "ERR bad request"
	}
	kb, err1 := hex.DecodeString(hk)
	pb, err2 := hex.DecodeString(hp)
	if err1 != nil || err2 != nil {
		return "ERR bad hex"
	}
	key, payload := string(kb), string(pb)
	s.mu.Lock()
	defer s.mu.Unlock()
	var fail *ledgerFailure
	if len(s.fail) > 0 {
		fail = &s.fail[0]
		s.fail = s.fail[1:]
		if !fail.applied {
			return "BUSY " + fail.code
		}
	}
	reply := s.applyLocked(key, payload)
	if fail != nil {
		return "ERR " + fail.code
	}
	return reply
}

// applyLocked applies payload under key, or replays it; s.mu is held.
func (s *ledgerServer) applyLocked(key, payload string) string {
	now := time.Now().Add(s.offset)
	if k, ok := s.keys[key]; ok && (s.ttl == 0 || now.Sub(k.at) < s.ttl) {
		if k.payload != payload {
			return "REUSED"
		}
		return "REPLAYED " + k.ref
	}
	s.entries[key]++
	s.total++
	ref := fmt.Sprintf("entry-%d", s.total)
	s.keys[key] = ledgerKey{payload: payload, ref: ref, at: now}
	return "APPLIED " + ref
}

// Count returns how many entries key wrote; Total all entries.
func (s *ledgerServer) Count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries[key]
}

func (s *ledgerServer) Total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Age moves the server's clock forward by d.
func (s *ledgerServer) Age(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.offset += d
}

// Addr is the server's address; it stays the same across restarts.
func (s *ledgerServer) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Restart drops every connection and listens again on the same address,
// keeping the ledger.
func (s *ledgerServer) Restart() error {
	addr := s.Addr()
	s.stop()
	return s.listen(addr)
}

func (s *ledgerServer) stop() {
	s.mu.Lock()
	ln := s.ln
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	s.wg.Wait()
}
