// Package smtptest runs a real SMTP server in process, on a loopback port,
// for tests that must talk to a mail server over real sockets.
//
// The server is built on github.com/emersion/go-smtp. It speaks plain SMTP
// unless [WithSTARTTLS] is given (without it, go-mail clients need
// mail.WithTLSPolicy(mail.NoTLS): go-mail requires STARTTLS by default),
// accepts every sender and recipient, and keeps every message it accepted,
// indexed by Message-ID, so a test can ask how many copies of one message
// arrived ([Server.Count]). Accepting a message means what it means for a
// real server: the whole message up to the final "." was read and the
// server is about to answer 250, with a queue id ("250 2.0.0 OK: queued as
// Q00000001").
//
// Faults that real mail servers produce can be scheduled for the next
// transaction ([Server.FailNext], [Server.DropNextDataReply],
// [Server.SetDataDelay]), so tests can reach the paths a client must get
// right: a rejection before the data was accepted, and an accepted message
// whose 250 never reaches the client. A server can also hang until the
// test lets it go ([Server.Stall], [Server.Release]): a client's lease or
// timeout runs out while the server holds a message it has taken.
//
// Optionally ([WithAuth]) the server requires AUTH PLAIN, which it allows
// without TLS because it only listens on 127.0.0.1.
//
// Unlike postgres/pgtest, s3/s3test and kafka/kafkatest, this kit has no
// environment variable that points it at an existing server: what a
// conformance harness needs from a mail server is to count the copies of
// one Message-ID it accepted, and SMTP offers no way to ask a relay that.
// The server here is the real protocol peer, over a real socket; to test
// against your own relay too, send through it to this server.
//
// Not for production use: it keeps every message in memory and delivers
// nothing.
package smtptest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/mail"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"effectively.dev/effects"
)

// Message is one message the server accepted.
type Message struct {
	// From is the envelope sender (MAIL FROM).
	From string
	// To are the envelope recipients (RCPT TO).
	To []string
	// MessageID is the Message-ID header without its angle brackets; empty
	// if the message had none.
	MessageID string
	// QueueID is the id the server gave the message in its 250 reply.
	QueueID string
	// Header is the parsed header of the message.
	Header mail.Header
	// Data is the message as received, header and body.
	Data []byte
	// Received is when the server accepted the message.
	Received time.Time
	// TLS reports whether the session had switched to TLS (STARTTLS)
	// before the message was sent.
	TLS bool
}

// Stage is an SMTP command that a scheduled failure answers.
type Stage int

const (
	// Mail is the MAIL FROM command.
	Mail Stage = iota + 1
	// Rcpt is the RCPT TO command.
	Rcpt
	// Data is the end of the DATA transfer: the server reads the whole
	// message, then answers with the failure instead of 250 and keeps
	// nothing.
	Data
)

// String names the stage.
func (s Stage) String() string {
	switch s {
	case Mail:
		return "MAIL"
	case Rcpt:
		return "RCPT"
	case Data:
		return "DATA"
	}
	return fmt.Sprintf("Stage(%d)", int(s))
}

// defaultReadTimeout is how long the server waits for a client's next
// command unless [WithReadTimeout] says otherwise.
const defaultReadTimeout = 30 * time.Second

// Option configures a [Server]; see [New]. A nil Option is ignored.
type Option func(*config)

type config struct {
	username, password string
	authSet            bool
	readTimeout        time.Duration
	startTLS           bool
}

// WithAuth makes the server require AUTH PLAIN with these credentials
// before MAIL FROM. PLAIN is allowed without TLS (the server listens on
// loopback only); go-mail clients need mail.SMTPAuthPlainNoEnc (or
// mail.SMTPAuthPlain with [WithSTARTTLS]). username must not be empty.
func WithAuth(username, password string) Option {
	return func(c *config) { c.username, c.password, c.authSet = username, password, true }
}

// WithReadTimeout sets how long the server waits for a client's next
// command before it drops the connection (default 30s).
// d must be positive.
func WithReadTimeout(d time.Duration) Option {
	return func(c *config) { c.readTimeout = d }
}

// WithSTARTTLS makes the server offer STARTTLS with a certificate for
// 127.0.0.1 and localhost that it signs itself at start-up, so clients
// can keep go-mail's default TLS policy (mail.TLSMandatory). Clients must
// trust it: pass [Server.TLSConfig] to mail.WithTLSConfig. A client that
// does not trust it fails the handshake, as against a server with a
// certificate from an unknown CA.
func WithSTARTTLS() Option {
	return func(c *config) { c.startTLS = true }
}

// Server is an in-process SMTP server on 127.0.0.1. It is safe for
// concurrent use. Close it when done ([Start] does it with t.Cleanup).
type Server struct {
	username, password string
	readTimeout        time.Duration
	tls                *tls.Config // the server's, nil without STARTTLS
	roots              *x509.CertPool

	addr string // fixed at the first listen, reused by Restart

	mu       sync.Mutex
	srv      *smtp.Server
	ln       *trackingListener
	served   chan struct{} // closed when the current Serve returns
	gen      chan struct{} // closed when the current listener stops: interrupts delays
	closed   bool
	messages []Message
	byID     map[string]int
	queued   int
	fails    map[Stage][]*smtp.SMTPError
	drops    int
	delay    time.Duration
	sessions int
	stall    chan struct{} // non-nil while stalled; closed by Release
	stalled  int
}

// New starts a server on a free port of 127.0.0.1. It returns a
// *[effects.ConfigError] for an option with an invalid value, before
// listening.
func New(opts ...Option) (*Server, error) {
	cfg := config{readTimeout: defaultReadTimeout}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	switch {
	case cfg.authSet && cfg.username == "":
		return nil, &effects.ConfigError{Op: "smtptest.New", Option: "WithAuth", Reason: "empty username"}
	case cfg.readTimeout <= 0:
		return nil, &effects.ConfigError{Op: "smtptest.New", Option: "WithReadTimeout",
			Reason: fmt.Sprintf("timeout %v is not positive", cfg.readTimeout)}
	}
	s := &Server{
		username:    cfg.username,
		password:    cfg.password,
		readTimeout: cfg.readTimeout,
		byID:        map[string]int{},
		fails:       map[Stage][]*smtp.SMTPError{},
	}
	if cfg.startTLS {
		var err error
		if s.tls, s.roots, err = selfSigned(); err != nil {
			return nil, fmt.Errorf("smtptest: certificate: %w", err)
		}
	}
	if err := s.listen("127.0.0.1:0"); err != nil {
		return nil, err
	}
	return s, nil
}

// TLSConfig returns a client TLS configuration that trusts the server's
// certificate (for mail.WithTLSConfig), or nil without [WithSTARTTLS].
func (s *Server) TLSConfig() *tls.Config {
	if s.roots == nil {
		return nil
	}
	return &tls.Config{RootCAs: s.roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// selfSigned makes a certificate for 127.0.0.1 and localhost, valid for a
// day, and a pool that trusts it.
func selfSigned() (*tls.Config, *x509.CertPool, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: "smtptest"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}},
		MinVersion:   tls.VersionTLS12,
	}, roots, nil
}

// Start is [New] for tests: it fails tb if the server cannot start
// and closes the server with tb.Cleanup.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s, err := New(opts...)
	if err != nil {
		tb.Fatalf("smtptest: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("smtptest: close: %v", err)
		}
	})
	return s
}

func (s *Server) listen(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("smtptest: listen on %s: %w", addr, err)
	}
	gen := make(chan struct{})
	srv := smtp.NewServer(&backend{s: s, gen: gen})
	srv.Domain = "localhost"
	srv.ReadTimeout = s.readTimeout
	srv.WriteTimeout = 10 * time.Second
	srv.MaxMessageBytes = 32 << 20
	srv.MaxRecipients = 100
	srv.AllowInsecureAuth = true
	srv.TLSConfig = s.tls // nil: no STARTTLS
	srv.ErrorLog = discardLogger{}
	tl := &trackingListener{Listener: l, conns: map[net.Conn]struct{}{}}
	served := make(chan struct{})
	s.mu.Lock()
	s.addr = l.Addr().String()
	s.srv, s.ln, s.served, s.gen = srv, tl, served, gen
	s.mu.Unlock()
	go func() {
		defer close(served)
		_ = srv.Serve(tl)
	}()
	return nil
}

// stop closes the listener and every connection and waits until every
// goroutine of the current go-smtp server has returned.
func (s *Server) stop() error {
	s.mu.Lock()
	srv, tl, served, gen := s.srv, s.ln, s.served, s.gen
	s.srv, s.ln, s.served, s.gen = nil, nil, nil, nil
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	// Close the listener and the connections ourselves and wait for Serve
	// to return, then let Shutdown wait for the connection goroutines
	// (go-smtp's Close does not wait, and its Shutdown does not close
	// connections).
	tl.closeAll()
	close(gen)
	<-served
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(ctx)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("smtptest: shutdown: %w", err)
	}
	return nil
}

// Close stops the server: it closes the listener and every connection and
// returns once all of the server's goroutines have exited. Messages stay
// readable. Close is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	return s.stop()
}

// Restart stops the server (dropping every connection) and starts it again
// on the same address, keeping the messages it accepted: a mail server
// restart as a client sees it.
func (s *Server) Restart() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("smtptest: restart of a closed server")
	}
	addr := s.addr
	s.mu.Unlock()
	if err := s.stop(); err != nil {
		return err
	}
	var err error
	for range 50 { // the port can take a moment to be free again
		if err = s.listen(addr); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// Addr returns the server's address, "127.0.0.1:port".
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Host returns "127.0.0.1".
func (s *Server) Host() string {
	h, _, _ := net.SplitHostPort(s.Addr())
	return h
}

// Port returns the TCP port the server listens on.
func (s *Server) Port() int {
	_, p, _ := net.SplitHostPort(s.Addr())
	var n int
	fmt.Sscan(p, &n)
	return n
}

// Count returns how many accepted messages carry messageID, given with or
// without its angle brackets.
func (s *Server) Count(messageID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[normalizeID(messageID)]
}

// Total returns how many messages the server accepted.
func (s *Server) Total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.messages)
}

// Messages returns a copy of the accepted messages, oldest first.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.messages...)
}

// Sessions returns how many SMTP sessions (EHLO or HELO) the server has
// seen; a client that never reached the server leaves it unchanged.
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions
}

// FailNext makes the next command at stage fail with the SMTP reply code
// (4xx: temporary, 5xx: permanent) and text, once. Failures queue up:
// calling it twice fails the next two. A failure at [Data] is answered
// after the whole message was read, and the message is not kept.
func (s *Server) FailNext(stage Stage, code int, text string) {
	if code < 400 || code > 599 {
		panic(fmt.Sprintf("smtptest: FailNext with code %d, want 4xx or 5xx", code))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fails[stage] = append(s.fails[stage], &smtp.SMTPError{
		Code:         code,
		EnhancedCode: smtp.EnhancedCode{code / 100, 0, 0},
		Message:      text,
	})
}

// DropNextDataReply makes the server accept the next message (it is kept
// and counted) and then close the connection instead of sending its 250:
// the client sees an error for a message the server has. This is the
// "cut after DATA" trap every sender must treat as an unknown outcome.
func (s *Server) DropNextDataReply() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drops++
}

// SetDataDelay makes the server wait d after accepting each message and
// before answering 250 (0 turns it off). A client whose timeout is shorter
// than d sees an error for a message the server has. Close interrupts the
// wait.
func (s *Server) SetDataDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// Stall makes the server hang after taking each message's data: from now
// until [Server.Release], a message read to its final "." is accepted
// (kept and counted, as for [Server.Count]) and its session then sends
// nothing, neither the 250 nor anything else, and reads nothing. This is
// a mail server that hangs past a client's lease or timeout, as one whose
// queue disk stalls: the client cannot tell whether the message was
// taken, and a client that gives up leaves a message the server has. The
// server does not notice that a client gave up. Each message held counts
// once in [Server.Stalled]. Close and Restart end held sessions by
// dropping their connections, without a reply. Stall while stalled does
// nothing.
func (s *Server) Stall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stall == nil {
		s.stall = make(chan struct{})
	}
}

// Release ends a stall ([Server.Stall]): every held session sends its 250
// now (a client that gave up and closed its connection does not get it;
// its message stays accepted), and later messages are answered at once.
// Release without a stall does nothing.
func (s *Server) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stall != nil {
		close(s.stall)
		s.stall = nil
	}
}

// Stalled returns how many messages a stall ([Server.Stall]) has held
// since the server started: those held now and those released. A test
// waits for it to grow to know that a client is stuck in the middle of a
// send, and reads it at the end to prove that the hang happened.
func (s *Server) Stalled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stalled
}

// hold returns the channel a session that just took a message waits on
// while the server is stalled, or nil.
func (s *Server) hold() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stall == nil {
		return nil
	}
	s.stalled++
	return s.stall
}

func (s *Server) nextFail(stage Stage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.fails[stage]
	if len(q) == 0 {
		return nil
	}
	s.fails[stage] = q[1:]
	return q[0]
}

// accept stores m and returns the queue id, whether to drop the reply,
// and the delay before answering.
func (s *Server) accept(m Message) (string, bool, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queued++
	m.QueueID = fmt.Sprintf("Q%08d", s.queued)
	s.messages = append(s.messages, m)
	if m.MessageID != "" {
		s.byID[m.MessageID]++
	}
	drop := s.drops > 0
	if drop {
		s.drops--
	}
	return m.QueueID, drop, s.delay
}

func normalizeID(id string) string {
	id = strings.TrimSpace(id)
	id = strings.TrimPrefix(id, "<")
	id = strings.TrimSuffix(id, ">")
	return id
}

// backend serves one listen of the server; gen is closed when it stops.
type backend struct {
	s   *Server
	gen chan struct{}
}

func (b *backend) NewSession(c *smtp.Conn) (smtp.Session, error) {
	b.s.mu.Lock()
	b.s.sessions++
	b.s.mu.Unlock()
	return &session{s: b.s, gen: b.gen, conn: c, authed: b.s.username == ""}, nil
}

// session is one SMTP connection's state.
type session struct {
	s      *Server
	gen    chan struct{}
	conn   *smtp.Conn
	authed bool
	from   string
	to     []string
}

var _ smtp.AuthSession = (*session)(nil)

func (ss *session) AuthMechanisms() []string {
	if ss.s.username == "" {
		return nil
	}
	return []string{sasl.Plain}
}

func (ss *session) Auth(mech string) (sasl.Server, error) {
	if mech != sasl.Plain || ss.s.username == "" {
		return nil, smtp.ErrAuthUnknownMechanism
	}
	return sasl.NewPlainServer(func(identity, username, password string) error {
		if username != ss.s.username || password != ss.s.password {
			return smtp.ErrAuthFailed
		}
		ss.authed = true
		return nil
	}), nil
}

func (ss *session) Mail(from string, _ *smtp.MailOptions) error {
	if !ss.authed {
		return smtp.ErrAuthRequired
	}
	if err := ss.s.nextFail(Mail); err != nil {
		return err
	}
	ss.from = from
	return nil
}

func (ss *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	if err := ss.s.nextFail(Rcpt); err != nil {
		return err
	}
	ss.to = append(ss.to, to)
	return nil
}

func (ss *session) Data(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		// The transfer broke before the final "."; nothing was accepted.
		return err
	}
	if err := ss.s.nextFail(Data); err != nil {
		return err
	}
	_, tlsOn := ss.conn.TLSConnectionState()
	m := Message{
		From:     ss.from,
		To:       append([]string(nil), ss.to...),
		Data:     data,
		Received: time.Now(),
		TLS:      tlsOn,
	}
	if parsed, err := mail.ReadMessage(bytes.NewReader(data)); err == nil {
		m.Header = parsed.Header
		m.MessageID = normalizeID(parsed.Header.Get("Message-Id"))
	}
	qid, drop, delay := ss.s.accept(m)
	if release := ss.s.hold(); release != nil {
		select {
		case <-release:
		case <-ss.gen:
			// The server stopped: the held client never hears the 250.
			_ = ss.conn.Conn().Close()
			return nil
		}
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ss.gen:
			t.Stop()
			drop = true // the server stopped: the client never hears the 250
		}
	}
	if drop {
		// Accepted and kept, but the client never hears the 250.
		_ = ss.conn.Conn().Close()
		return nil
	}
	// go-smtp answers a nil error with a fixed "250 2.0.0 OK: queued";
	// a 250 SMTPError carries the queue id, as real servers do.
	return &smtp.SMTPError{Code: 250, EnhancedCode: smtp.EnhancedCode{2, 0, 0}, Message: "OK: queued as " + qid}
}

func (ss *session) Reset() { ss.from, ss.to = "", nil }

func (ss *session) Logout() error { return nil }

// trackingListener remembers the connections it accepted, so the server
// can close them all when it stops.
type trackingListener struct {
	net.Listener
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, l: l}
	l.conns[tc] = struct{}{}
	return tc, nil
}

func (l *trackingListener) closeAll() {
	l.mu.Lock()
	l.closed = true
	conns := make([]net.Conn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	l.Listener.Close()
	for _, c := range conns {
		c.Close()
	}
}

type trackedConn struct {
	net.Conn
	l    *trackingListener
	once sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return err
}

type discardLogger struct{}

func (discardLogger) Printf(string, ...any) {}
func (discardLogger) Println(...any)        {}
