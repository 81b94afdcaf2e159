package email_test

import (
	"fmt"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/email"
	"effectively.dev/email/smtptest"
)

// sendEach sends one message per key in order and fails t on any error.
func sendEach(t *testing.T, s *email.Sender, keys ...effects.Key) {
	t.Helper()
	for _, k := range keys {
		if res, err := s.Apply(testCtx(t), k, receipt("for "+string(k))); err != nil || res.Status != effects.Applied {
			t.Fatalf("Apply %s = %+v, %v", k, res, err)
		}
	}
}

func sessionKeys(n int) []effects.Key {
	keys := make([]effects.Key, n)
	for i := range keys {
		keys[i] = effects.MustKey("shop", fmt.Sprintf("order-%d", i), "receipt")
	}
	return keys
}

// checkOnce fails t unless the server holds exactly one copy of each key's
// message.
func (e *env) checkOnce(t *testing.T, keys ...effects.Key) {
	t.Helper()
	for _, k := range keys {
		if n := e.count(k); n != 1 {
			t.Errorf("%s: %d copies, want 1", k, n)
		}
	}
}

func TestSessionIsReused(t *testing.T) {
	e := newEnv(t)
	s := e.sender(t)
	keys := sessionKeys(3)
	sendEach(t, s, keys...)
	e.checkOnce(t, keys...)
	if n := e.srv.Sessions(); n != 1 {
		t.Fatalf("%d SMTP sessions for 3 messages sent one after another, want 1", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	sendEach(t, s, effects.MustKey("shop", "after-close", "receipt"))
	if n := e.srv.Sessions(); n != 2 {
		t.Fatalf("%d SMTP sessions after Close and one more message, want 2", n)
	}
}

func TestWithoutIdleSessionsEveryMessageConnects(t *testing.T) {
	e := newEnv(t)
	s := e.sender(t, email.WithIdleSessions(0, time.Minute))
	keys := sessionKeys(3)
	sendEach(t, s, keys...)
	e.checkOnce(t, keys...)
	if n := e.srv.Sessions(); n != 3 {
		t.Fatalf("%d SMTP sessions for 3 messages, want 3", n)
	}
}

// A session idle past the timeout is not used again.
func TestIdleTimeoutEndsTheSession(t *testing.T) {
	e := newEnv(t)
	s := e.sender(t, email.WithIdleSessions(4, 50*time.Millisecond))
	keys := sessionKeys(2)
	sendEach(t, s, keys[0])
	time.Sleep(150 * time.Millisecond)
	sendEach(t, s, keys[1])
	e.checkOnce(t, keys...)
	if n := e.srv.Sessions(); n != 2 {
		t.Fatalf("%d SMTP sessions, want 2 (the idle one timed out)", n)
	}
}

// A session the server closed while it was idle costs nothing but a new
// session: no error, no duplicate.
func TestSessionClosedByTheServerIsReplaced(t *testing.T) {
	for name, drop := range map[string]func(e *env) error{
		"read timeout": func(*env) error { time.Sleep(300 * time.Millisecond); return nil },
		"restart":      func(e *env) error { return e.srv.Restart() },
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.srv = smtptest.Start(t, smtptest.WithReadTimeout(100*time.Millisecond))
			s := e.sender(t)
			keys := sessionKeys(2)
			sendEach(t, s, keys[0])
			if err := drop(e); err != nil {
				t.Fatal(err)
			}
			sendEach(t, s, keys[1])
			e.checkOnce(t, keys...)
			if n := e.srv.Sessions(); n != 2 {
				t.Fatalf("%d SMTP sessions, want 2", n)
			}
			if b, c, r := e.journal.begins.Load(), e.journal.completes.Load(), e.journal.releases.Load(); b != 2 || c != 2 || r != 0 {
				t.Fatalf("journal: %d begins, %d completes, %d releases; want 2, 2, 0 (no failed attempt)", b, c, r)
			}
		})
	}
}
