package email

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/wneessen/go-mail"
	"github.com/wneessen/go-mail/smtp"
)

// Defaults of a Sender's session reuse ([WithIdleSessions]).
const (
	// defaultIdleSessions is how many SMTP sessions a Sender keeps open
	// between messages.
	defaultIdleSessions = 8
	// defaultIdleTimeout is how long a session may wait unused before the
	// Sender closes it instead of sending on it. RFC 5321 (4.5.3.2.7) asks
	// servers to wait at least 5 minutes for the next command; this stays
	// well below.
	defaultIdleTimeout = 30 * time.Second
)

// WithIdleSessions sets how many SMTP sessions the Sender keeps open
// between messages (default 8) and how long one may stay unused (default
// 30 s, well below the 5 minutes RFC 5321 asks servers to wait for the
// next command). A message sent on an open session skips the connect, the greeting, EHLO, STARTTLS and AUTH. max 0
// opens a session per message and closes it after; max must not be
// negative, and timeout must be positive.
//
// A session the server closed while it was idle fails before anything is
// handed over, so the message is sent on a new session at once: reuse
// never turns into an error or a duplicate.
func WithIdleSessions(max int, timeout time.Duration) Option {
	return option(func(c *config) { c.idle, c.idleTimeout = max, timeout })
}

// session is an open SMTP session.
type session struct {
	client *smtp.Client
	conn   net.Conn // the client's connection, closed when a send is abandoned
	idle   time.Time
}

// sessions keeps a Sender's idle sessions, the most recently used last.
type sessions struct {
	max     int
	timeout time.Duration

	mu     sync.Mutex
	idle   []*session
	closed bool
}

// take returns an idle session that has not timed out, or nil. It closes
// the ones that have.
func (p *sessions) take() *session {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.idle) > 0 {
		s := p.idle[len(p.idle)-1]
		p.idle[len(p.idle)-1] = nil
		p.idle = p.idle[:len(p.idle)-1]
		if time.Since(s.idle) < p.timeout {
			return s
		}
		go s.quit()
	}
	return nil
}

// put keeps s for the next message, or closes it when enough are kept.
func (p *sessions) put(s *session) {
	p.mu.Lock()
	if p.closed || len(p.idle) >= p.max {
		p.mu.Unlock()
		s.quit()
		return
	}
	s.idle = time.Now()
	p.idle = append(p.idle, s)
	p.mu.Unlock()
}

// close ends every idle session and keeps no more.
func (p *sessions) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range idle {
		wg.Go(s.quit)
	}
	wg.Wait()
}

// quit says QUIT, briefly, and closes the connection.
func (s *session) quit() {
	_ = s.conn.SetDeadline(time.Now().Add(time.Second))
	_ = s.client.Quit()
	_ = s.conn.Close()
}

// send sends msg on an idle session if there is one that works, else on a
// new one, and keeps the session open for the next message when it ends
// cleanly. It returns go-mail's error as DialAndSendWithContext would
// (a plain error for the connect phase, a *mail.SendError after it).
func (s *Sender) send(ctx context.Context, a *attempt, msg *mail.Msg) error {
	if sess := s.sessions.take(); sess != nil {
		err := s.sendOn(ctx, sess, msg)
		if err == nil || ctx.Err() != nil || !staleSession(msg, err) {
			return err
		}
		// The server closed the session while it was idle (or said 421):
		// nothing was handed over, so send on a new one.
	}
	client, err := s.client.DialToSMTPClientWithContext(context.WithValue(ctx, attemptKey{}, a))
	if err != nil {
		return err
	}
	conn := a.keep()
	if conn == nil { // not dialed through the Sender: nothing to keep open
		defer client.Close()
		return s.client.SendWithSMTPClient(client, msg)
	}
	return s.sendOn(ctx, &session{client: client, conn: conn}, msg)
}

// sendOn sends msg on sess, closing its connection if ctx ends meanwhile,
// and keeps sess if the send ended cleanly.
func (s *Sender) sendOn(ctx context.Context, sess *session, msg *mail.Msg) error {
	stop := context.AfterFunc(ctx, func() { sess.conn.Close() })
	err := s.client.SendWithSMTPClient(sess.client, msg)
	if stop() && err == nil {
		s.sessions.put(sess)
	} else {
		sess.quit()
	}
	return err
}

// staleSession reports whether err, from a session that was idle, says
// only that the session is gone: a connection-level failure or a 421
// before the server accepted anything.
func staleSession(msg *mail.Msg, err error) bool {
	out, e := classify(msg, err)
	return out == notSent && !e.invalid && (e.Code == 0 || e.Code == 421)
}
