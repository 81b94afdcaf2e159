package smtptest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/wneessen/go-mail"
	"go.uber.org/goleak"

	"effectively.dev/effects"
	"effectively.dev/email/smtptest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// send submits one message with messageID through go-mail over plain SMTP.
func send(t *testing.T, s *smtptest.Server, messageID string, opts ...mail.Option) (*mail.Msg, error) {
	t.Helper()
	c, err := mail.NewClient(s.Host(), append([]mail.Option{
		mail.WithPort(s.Port()), mail.WithTLSPolicy(mail.NoTLS), mail.WithTimeout(5 * time.Second),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	m := mail.NewMsg()
	if err := m.From("sender@example.com"); err != nil {
		t.Fatal(err)
	}
	if err := m.To("rcpt@example.net"); err != nil {
		t.Fatal(err)
	}
	m.Subject("hello")
	m.SetBodyString(mail.TypeTextPlain, "body of "+messageID)
	m.SetMessageIDWithValue(messageID)
	return m, c.DialAndSendWithContext(context.Background(), m)
}

func TestAcceptsAndCountsByMessageID(t *testing.T) {
	s := smtptest.Start(t)
	for _, id := range []string{"a@test", "b@test", "a@test"} {
		m, err := send(t, s, id)
		if err != nil {
			t.Fatalf("send %s: %v", id, err)
		}
		if !strings.Contains(m.ServerResponse(), "queued as Q") {
			t.Errorf("server response %q, want a queue id", m.ServerResponse())
		}
	}
	if got := s.Count("a@test"); got != 2 {
		t.Errorf("Count(a@test) = %d, want 2", got)
	}
	if got := s.Count("<b@test>"); got != 1 {
		t.Errorf("Count(<b@test>) = %d, want 1 (brackets are ignored)", got)
	}
	if got := s.Count("c@test"); got != 0 {
		t.Errorf("Count(c@test) = %d, want 0", got)
	}
	if got := s.Total(); got != 3 {
		t.Errorf("Total = %d, want 3", got)
	}
	msgs := s.Messages()
	if len(msgs) != 3 {
		t.Fatalf("Messages: %d, want 3", len(msgs))
	}
	m := msgs[1]
	if m.MessageID != "b@test" || m.From != "sender@example.com" || len(m.To) != 1 || m.To[0] != "rcpt@example.net" {
		t.Errorf("message = %+v", m)
	}
	if m.Header.Get("Subject") != "hello" || !strings.Contains(string(m.Data), "body of b@test") {
		t.Errorf("message header/body not kept: %q", m.Data)
	}
	if msgs[0].QueueID == msgs[1].QueueID {
		t.Errorf("queue ids not distinct: %q", msgs[0].QueueID)
	}
	if s.Sessions() != 3 {
		t.Errorf("Sessions = %d, want 3", s.Sessions())
	}
}

func TestFailNext(t *testing.T) {
	for _, tc := range []struct {
		stage smtptest.Stage
		code  int
		temp  bool
	}{
		{smtptest.Mail, 451, true},
		{smtptest.Rcpt, 550, false},
		{smtptest.Rcpt, 452, true},
		{smtptest.Data, 554, false},
		{smtptest.Data, 451, true},
	} {
		t.Run(fmt.Sprintf("%s %d", tc.stage, tc.code), func(t *testing.T) {
			s := smtptest.Start(t)
			s.FailNext(tc.stage, tc.code, "scheduled failure")
			m, err := send(t, s, "x@test")
			var se *mail.SendError
			if !errors.As(err, &se) {
				t.Fatalf("got %v, want a *mail.SendError", err)
			}
			if se.ErrorCode() != tc.code || se.IsTemp() != tc.temp {
				t.Errorf("code %d temp %v, want %d %v (%v)", se.ErrorCode(), se.IsTemp(), tc.code, tc.temp, err)
			}
			if m.IsDelivered() || s.Total() != 0 {
				t.Errorf("delivered %v, total %d: a failed transaction must keep nothing", m.IsDelivered(), s.Total())
			}
			if _, err := send(t, s, "x@test"); err != nil {
				t.Fatalf("the failure must be one-shot: %v", err)
			}
			if s.Count("x@test") != 1 {
				t.Errorf("Count = %d, want 1", s.Count("x@test"))
			}
		})
	}
}

func TestDropNextDataReply(t *testing.T) {
	s := smtptest.Start(t)
	s.DropNextDataReply()
	m, err := send(t, s, "cut@test")
	if err == nil {
		t.Fatal("send succeeded, want an error: the 250 was never sent")
	}
	if m.IsDelivered() {
		t.Error("go-mail reports delivered without a 250")
	}
	if s.Count("cut@test") != 1 {
		t.Errorf("Count = %d, want 1: the server accepted the message", s.Count("cut@test"))
	}
}

func TestDataDelayBeyondClientTimeout(t *testing.T) {
	s := smtptest.Start(t)
	s.SetDataDelay(time.Second)
	_, err := send(t, s, "slow@test", mail.WithTimeout(200*time.Millisecond))
	if err == nil {
		t.Fatal("send succeeded, want a timeout")
	}
	if s.Count("slow@test") != 1 {
		t.Errorf("Count = %d, want 1", s.Count("slow@test"))
	}
	s.SetDataDelay(0)
	if _, err := send(t, s, "fast@test"); err != nil {
		t.Fatal(err)
	}
}

// A transfer cut before the final "." is not a message.
func TestCutMidDataKeepsNothing(t *testing.T) {
	s := smtptest.Start(t)
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	expect := func(prefix string) {
		t.Helper()
		line, err := r.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, prefix) {
			t.Fatalf("read %q, %v; want %s", line, err, prefix)
		}
	}
	expect("220")
	for _, cmd := range []string{"HELO client", "MAIL FROM:<a@test>", "RCPT TO:<b@test>"} {
		fmt.Fprintf(c, "%s\r\n", cmd)
		expect("250")
	}
	fmt.Fprintf(c, "DATA\r\n")
	expect("354")
	fmt.Fprintf(c, "Message-ID: <half@test>\r\nSubject: half\r\n\r\nhalf a bo")
	c.Close()
	deadline := time.Now().Add(2 * time.Second)
	for s.Sessions() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if s.Total() != 0 {
		t.Errorf("Total = %d, want 0", s.Total())
	}
}

func TestAuth(t *testing.T) {
	s := smtptest.Start(t, smtptest.WithAuth("user", "secret"))
	if _, err := send(t, s, "noauth@test"); err == nil {
		t.Error("send without AUTH succeeded")
	}
	if _, err := send(t, s, "bad@test", mail.WithSMTPAuth(mail.SMTPAuthPlainNoEnc),
		mail.WithUsername("user"), mail.WithPassword("wrong")); err == nil {
		t.Error("send with a wrong password succeeded")
	}
	if _, err := send(t, s, "auth@test", mail.WithSMTPAuth(mail.SMTPAuthPlainNoEnc),
		mail.WithUsername("user"), mail.WithPassword("secret")); err != nil {
		t.Fatalf("send with AUTH PLAIN: %v", err)
	}
	if s.Total() != 1 || s.Count("auth@test") != 1 {
		t.Errorf("Total %d, Count %d; want 1, 1", s.Total(), s.Count("auth@test"))
	}
}

func TestRestartKeepsMessagesAndAddress(t *testing.T) {
	s := smtptest.Start(t)
	if _, err := send(t, s, "before@test"); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	// An idle client connection is dropped by the restart.
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr {
		t.Errorf("address changed: %s, was %s", s.Addr(), addr)
	}
	if _, err := send(t, s, "after@test"); err != nil {
		t.Fatal(err)
	}
	if s.Count("before@test") != 1 || s.Count("after@test") != 1 || s.Total() != 2 {
		t.Errorf("counts before %d after %d total %d", s.Count("before@test"), s.Count("after@test"), s.Total())
	}
}

// Close ends every connection and goroutine, even a delayed reply and an
// idle client; goleak in TestMain checks the goroutines.
func TestCloseWhileBusy(t *testing.T) {
	s, err := smtptest.New()
	if err != nil {
		t.Fatal(err)
	}
	s.SetDataDelay(time.Hour)
	idle, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	sent := make(chan error, 1)
	go func() {
		_, err := send(t, s, "stuck@test", mail.WithTimeout(time.Minute))
		sent <- err
	}()
	for s.Total() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v", d)
	}
	if err := <-sent; err == nil {
		t.Error("send succeeded across Close")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if s.Count("stuck@test") != 1 {
		t.Error("messages must stay readable after Close")
	}
	if _, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		t.Error("server still accepts connections after Close")
	}
}

// With WithSTARTTLS, go-mail's default policy (STARTTLS required) works
// for a client that trusts the server's certificate, and the handshake
// fails for one that does not.
func TestSTARTTLS(t *testing.T) {
	s := smtptest.Start(t, smtptest.WithSTARTTLS())
	if _, err := send(t, s, "tls@test", mail.WithTLSPolicy(mail.TLSMandatory), mail.WithTLSConfig(s.TLSConfig())); err != nil {
		t.Fatalf("send with STARTTLS: %v", err)
	}
	if msgs := s.Messages(); len(msgs) != 1 || !msgs[0].TLS {
		t.Fatalf("messages %+v, want one sent over TLS", msgs)
	}
	if _, err := send(t, s, "untrusted@test", mail.WithTLSPolicy(mail.TLSMandatory)); err == nil {
		t.Error("a client that does not trust the certificate completed STARTTLS")
	}
	if _, err := send(t, s, "plain@test"); err != nil {
		t.Fatalf("plain-text send to a server offering STARTTLS: %v", err)
	}
	if msgs := s.Messages(); len(msgs) != 2 || msgs[1].TLS {
		t.Errorf("the plain-text message is marked TLS")
	}
	if smtptest.Start(t).TLSConfig() != nil {
		t.Error("TLSConfig without STARTTLS is not nil")
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	for name, opt := range map[string]smtptest.Option{
		"WithAuth":        smtptest.WithAuth("", "x"),
		"WithReadTimeout": smtptest.WithReadTimeout(0),
	} {
		s, err := smtptest.New(opt)
		var ce *effects.ConfigError
		if !errors.As(err, &ce) || ce.Option != name || s != nil {
			t.Errorf("%s: %v, want a *ConfigError naming it", name, err)
		}
	}
	s, err := smtptest.New(nil, smtptest.WithReadTimeout(time.Second), nil)
	if err != nil {
		t.Fatalf("nil options: %v, want them ignored", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// A stalled server takes the message and answers nothing until Release: a
// client waits, the message is already counted, and Release sends the 250.
// A client that gives up during a stall leaves its message on the server;
// after Release, messages are answered at once again.
func TestStall(t *testing.T) {
	s := smtptest.Start(t)
	s.Stall()
	s.Stall() // idempotent
	sent := make(chan error, 1)
	go func() {
		_, err := send(t, s, "held@test", mail.WithTimeout(time.Minute))
		sent <- err
	}()
	waitFor(t, "the first message to be held", func() bool { return s.Stalled() == 1 })
	if s.Count("held@test") != 1 {
		t.Errorf("Count(held@test) = %d while held, want 1: the server took the data", s.Count("held@test"))
	}
	select {
	case err := <-sent:
		t.Fatalf("send returned during the stall (%v), want it held", err)
	default:
	}

	// A client that gives up: its message stays, counted once more.
	_, err := send(t, s, "abandoned@test", mail.WithTimeout(300*time.Millisecond))
	if err == nil {
		t.Fatal("send with a short timeout succeeded during a stall")
	}
	if s.Stalled() != 2 || s.Count("abandoned@test") != 1 {
		t.Errorf("Stalled %d, Count(abandoned@test) %d; want 2, 1", s.Stalled(), s.Count("abandoned@test"))
	}

	s.Release()
	if err := <-sent; err != nil {
		t.Fatalf("held send after Release: %v", err)
	}
	s.Release() // idempotent
	if _, err := send(t, s, "after@test"); err != nil {
		t.Fatalf("send after Release: %v", err)
	}
	if s.Stalled() != 2 || s.Total() != 3 {
		t.Errorf("Stalled %d, Total %d after Release; want 2, 3", s.Stalled(), s.Total())
	}
}

// Close ends a held session without a reply, and returns.
func TestCloseWhileStalled(t *testing.T) {
	s, err := smtptest.New()
	if err != nil {
		t.Fatal(err)
	}
	s.Stall()
	sent := make(chan error, 1)
	go func() {
		_, err := send(t, s, "stuck@test", mail.WithTimeout(time.Minute))
		sent <- err
	}()
	waitFor(t, "the message to be held", func() bool { return s.Stalled() == 1 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err == nil {
		t.Error("send succeeded across Close")
	}
	if s.Count("stuck@test") != 1 {
		t.Errorf("Count(stuck@test) = %d, want 1", s.Count("stuck@test"))
	}
}

// waitFor polls cond for up to ten seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
