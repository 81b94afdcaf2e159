package email_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wneessen/go-mail"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/email"
	"effectively.dev/email/smtptest"
)

func TestSendOnce(t *testing.T) {
	e := newEnv(t)
	s := e.sender(t)
	key := effects.MustKey("shop", "order-1", "receipt")
	res, err := s.Apply(testCtx(t), key, receipt("Thanks for order 1."))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != effects.Applied {
		t.Errorf("status %s, want applied", res.Status)
	}
	if !strings.Contains(res.Ref, "queued as Q") {
		t.Errorf("ref %q, want the server's reply with its queue id", res.Ref)
	}
	if n := e.count(key); n != 1 {
		t.Fatalf("server has %d copies, want 1", n)
	}
	m := e.srv.Messages()[0]
	if want := "<" + email.MessageID(key, domain) + ">"; m.Header.Get("Message-Id") != want {
		t.Errorf("Message-ID %q, want %q", m.Header.Get("Message-Id"), want)
	}
	if m.From != "orders@"+domain || len(m.To) != 1 || m.To[0] != "alice@example.net" {
		t.Errorf("envelope from %q to %v", m.From, m.To)
	}
	if m.Header.Get("Subject") != "Your receipt" || !bytes.Contains(m.Data, []byte("Thanks for order 1.")) {
		t.Errorf("message not as sent:\n%s", m.Data)
	}
	if m.QueueID == "" || !strings.Contains(res.Ref, m.QueueID) {
		t.Errorf("ref %q does not name the queue id %q", res.Ref, m.QueueID)
	}
}

func TestRedeliveryReplaysWithoutSending(t *testing.T) {
	e := newEnv(t)
	s := e.sender(t)
	key := effects.MustKey("shop", "order-2", "receipt")
	first, err := s.Apply(testCtx(t), key, receipt("order 2"))
	if err != nil {
		t.Fatal(err)
	}
	sessions := e.srv.Sessions()
	// Three redeliveries to the same sender and one to a new process.
	for i, sender := range []*email.Sender{s, s, s, e.sender(t)} {
		res, err := sender.Apply(testCtx(t), key, receipt("order 2"))
		if err != nil {
			t.Fatalf("redelivery %d: %v", i+1, err)
		}
		if res.Status != effects.Replayed || res.Ref != first.Ref {
			t.Errorf("redelivery %d: %+v, want replayed with ref %q", i+1, res, first.Ref)
		}
	}
	if n := e.count(key); n != 1 {
		t.Errorf("server has %d copies, want 1", n)
	}
	if e.srv.Sessions() != sessions {
		t.Errorf("replays opened %d SMTP sessions, want none", e.srv.Sessions()-sessions)
	}
}

func TestConcurrentDuplicatesSendOnce(t *testing.T) {
	e := newEnv(t)
	s := e.sender(t, email.WithJournal(e.journal, journal.WithLease(10*time.Second)))
	// Hold the winner at the end of DATA so that the other attempts find
	// the key in flight.
	e.srv.SetDataDelay(300 * time.Millisecond)
	key := effects.MustKey("shop", "order-3", "receipt")
	const n = 16
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		applied  int
		replayed int
		waited   int // attempts that got ErrInFlight before their result
		refs     = map[string]int{}
		start    = make(chan struct{})
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			sawInFlight := false
			for {
				res, err := s.Apply(testCtx(t), key, receipt("order 3"))
				if errors.Is(err, effects.ErrInFlight) {
					sawInFlight = true
					time.Sleep(20 * time.Millisecond)
					continue
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("Apply: %v", err)
					return
				}
				switch res.Status {
				case effects.Applied:
					applied++
				case effects.Replayed:
					replayed++
				}
				if sawInFlight {
					waited++
				}
				refs[res.Ref]++
				return
			}
		}()
	}
	close(start)
	wg.Wait()
	if applied != 1 || replayed != n-1 {
		t.Errorf("%d applied, %d replayed; want 1 and %d", applied, replayed, n-1)
	}
	if waited < n/2 {
		t.Errorf("only %d attempts got ErrInFlight first; the race window was not exercised", waited)
	}
	if len(refs) != 1 {
		t.Errorf("refs %v, want one ref for all", refs)
	}
	if c := e.count(key); c != 1 {
		t.Errorf("server has %d copies, want 1", c)
	}
}

// The trap: the server accepted the message but the client never read the
// 250. The outcome is unknown, the record stays pending, and the lease
// decides: ErrInFlight within it, a resend (the declared duplicate) after
// it.
func TestCutAfterDataIsAmbiguous(t *testing.T) {
	parent := newEnv(t)
	for _, tc := range []struct {
		name  string
		lease time.Duration
		cut   func(*smtptest.Server)
	}{
		{"connection closed before the 250", testLease, (*smtptest.Server).DropNextDataReply},
		// Apply gives up the session at 90% of the lease, so the retry
		// within the lease must come in the last 10%: a longer lease
		// keeps that margin wide enough for a loaded machine.
		{"250 later than the lease", 2 * time.Second, func(s *smtptest.Server) { s.SetDataDelay(5 * time.Second) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := parent.sub(t)
			s := e.sender(t, email.WithJournal(e.journal, journal.WithLease(tc.lease)))
			key := effects.MustKey("shop", "order-4", "receipt")
			in := receipt("order 4")
			tc.cut(e.srv)

			_, err := s.Apply(testCtx(t), key, in)
			if !errors.Is(err, effects.ErrAmbiguous) || effects.ClassOf(err) != effects.Retryable {
				t.Fatalf("got %v, want a retryable ErrAmbiguous", err)
			}
			if e.count(key) != 1 {
				t.Fatalf("server has %d copies, want 1: it accepted the message", e.count(key))
			}
			if e.journal.releases.Load() != 0 || e.journal.completes.Load() != 0 {
				t.Errorf("the record must stay pending: %d releases, %d completes", e.journal.releases.Load(), e.journal.completes.Load())
			}
			e.srv.SetDataDelay(0)

			// Within the lease: the key is in flight, nothing is sent.
			if _, err := s.Apply(testCtx(t), key, in); !errors.Is(err, effects.ErrInFlight) {
				t.Fatalf("retry within the lease: %v, want ErrInFlight", err)
			}
			if e.count(key) != 1 {
				t.Fatalf("retry within the lease sent: %d copies", e.count(key))
			}

			// After the lease: the resend is the declared duplicate window.
			time.Sleep(tc.lease)
			res, err := s.Apply(testCtx(t), key, in)
			if err != nil || res.Status != effects.Applied {
				t.Fatalf("retry after the lease: %+v, %v; want applied", res, err)
			}
			if e.count(key) != 2 {
				t.Fatalf("server has %d copies, want 2 (the declared duplicate)", e.count(key))
			}
			msgs := e.srv.Messages()
			if msgs[0].MessageID != msgs[1].MessageID || msgs[0].MessageID != email.MessageID(key, domain) {
				t.Errorf("duplicate Message-IDs %q and %q, want both %q", msgs[0].MessageID, msgs[1].MessageID, email.MessageID(key, domain))
			}
			w := s.Contract().DuplicateWindow
			if s.Contract().Guarantee != effects.AtLeastOnce || w.Trigger != effects.AfterUnknownOutcome {
				t.Errorf("contract %s does not declare this duplicate", s.Contract())
			}

			// Now recorded: further redeliveries replay.
			again, err := s.Apply(testCtx(t), key, in)
			if err != nil || again.Status != effects.Replayed || again.Ref != res.Ref {
				t.Errorf("after the resend: %+v, %v; want replayed %q", again, err, res.Ref)
			}
			if e.count(key) != 2 {
				t.Errorf("server has %d copies, want 2", e.count(key))
			}
		})
	}
}

// An error after the server's 250 (here: the connection dies at RSET) is a
// delivery: go-mail's IsDelivered is true and the record is completed.
func TestErrorAfterDeliveryIsSuccess(t *testing.T) {
	e := newEnv(t)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &cutOnWrite{Conn: c, prefix: "RSET"}, nil
	}
	s := e.sender(t, email.WithDialContext(dial))
	key := effects.MustKey("shop", "order-5", "receipt")
	res, err := s.Apply(testCtx(t), key, receipt("order 5"))
	if err != nil || res.Status != effects.Applied {
		t.Fatalf("got %+v, %v; want applied", res, err)
	}
	if e.journal.completes.Load() != 1 {
		t.Errorf("%d completes, want 1", e.journal.completes.Load())
	}
	again, err := e.sender(t).Apply(testCtx(t), key, receipt("order 5"))
	if err != nil || again.Status != effects.Replayed || again.Ref != res.Ref {
		t.Errorf("redelivery: %+v, %v; want replayed %q", again, err, res.Ref)
	}
	if e.count(key) != 1 {
		t.Errorf("server has %d copies, want 1", e.count(key))
	}
}

// cutOnWrite closes the connection when the client writes a command that
// starts with prefix.
type cutOnWrite struct {
	net.Conn
	prefix string
}

func (c *cutOnWrite) Write(p []byte) (int, error) {
	if bytes.HasPrefix(p, []byte(c.prefix)) {
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}

// A definite failure before the server accepted the data releases the
// lease, so the retry sends at once instead of waiting for the lease.
func TestRejectionBeforeDataReleasesTheLease(t *testing.T) {
	parent := newEnv(t)
	for _, tc := range []struct {
		name      string
		stage     smtptest.Stage
		code      int
		permanent bool
	}{
		{"MAIL 451", smtptest.Mail, 451, false},
		{"RCPT 550", smtptest.Rcpt, 550, true},
		{"RCPT 452", smtptest.Rcpt, 452, false},
		{"end of DATA 554", smtptest.Data, 554, true},
		{"end of DATA 451", smtptest.Data, 451, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := parent.sub(t)
			s := e.sender(t)
			key := effects.MustKey("shop", "order-6", "receipt")
			e.srv.FailNext(tc.stage, tc.code, "scheduled failure")
			_, err := s.Apply(testCtx(t), key, receipt("order 6"))
			var se *email.SMTPError
			if !errors.As(err, &se) || se.Code != tc.code {
				t.Fatalf("got %v, want an *email.SMTPError with code %d", err, tc.code)
			}
			if tc.permanent {
				if !errors.Is(err, email.ErrRejected) || !errors.Is(err, effects.ErrRefused) || effects.ClassOf(err) != effects.Permanent {
					t.Errorf("%v: want ErrRejected and ErrRefused, permanent", err)
				}
			} else if !errors.Is(err, effects.ErrTransient) || effects.ClassOf(err) != effects.Retryable {
				t.Errorf("%v: want ErrTransient, retryable", err)
			}
			if e.journal.releases.Load() != 1 {
				t.Errorf("%d releases, want 1", e.journal.releases.Load())
			}
			if e.srv.Total() != 0 {
				t.Fatalf("server kept %d messages, want 0", e.srv.Total())
			}
			// Well within the lease: not ErrInFlight, because it was released.
			res, err := s.Apply(testCtx(t), key, receipt("order 6"))
			if err != nil || res.Status != effects.Applied {
				t.Fatalf("retry: %+v, %v; want applied at once", res, err)
			}
			if e.count(key) != 1 {
				t.Errorf("server has %d copies, want 1", e.count(key))
			}
		})
	}
}

func TestConnectionRefusedIsTransient(t *testing.T) {
	e := newEnv(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	key := effects.MustKey("shop", "order-7", "receipt")
	_, err = e.senderAt(t, dead).Apply(testCtx(t), key, receipt("order 7"))
	var se *email.SMTPError
	if !errors.Is(err, effects.ErrTransient) || !errors.As(err, &se) || se.Stage != "connect" {
		t.Fatalf("got %v, want ErrTransient with an SMTPError at connect", err)
	}
	if e.journal.releases.Load() != 1 {
		t.Errorf("%d releases, want 1", e.journal.releases.Load())
	}
	res, err := e.sender(t).Apply(testCtx(t), key, receipt("order 7"))
	if err != nil || res.Status != effects.Applied || e.count(key) != 1 {
		t.Fatalf("retry against a live server: %+v, %v, %d copies", res, err, e.count(key))
	}
}

// Cancelling the caller's context interrupts the SMTP session (go-mail
// itself only watches it while dialing). Cancelled after the data was
// handed over, the outcome is unknown.
func TestCancelDuringDataIsAmbiguous(t *testing.T) {
	e := newEnv(t)
	s := e.sender(t, email.WithJournal(e.journal, journal.WithLease(time.Minute)))
	e.srv.SetDataDelay(10 * time.Second)
	key := effects.MustKey("shop", "order-8", "receipt")
	ctx, cancel := context.WithCancel(testCtx(t))
	go func() {
		for e.srv.Total() == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	start := time.Now()
	_, err := s.Apply(ctx, key, receipt("order 8"))
	if !errors.Is(err, effects.ErrAmbiguous) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want ErrAmbiguous and context.Canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Apply took %v after the cancel", d)
	}
	if _, err := s.Apply(testCtx(t), key, receipt("order 8")); !errors.Is(err, effects.ErrInFlight) {
		t.Errorf("retry: %v, want ErrInFlight (the lease is held)", err)
	}
}

func TestKeyReuseWithAnotherMessage(t *testing.T) {
	base := receipt("order 9")
	parent := newEnv(t)
	for _, tc := range []struct {
		name   string
		change func(*email.Message)
	}{
		{"body", func(m *email.Message) { m.Text = "order 9, amended" }},
		{"subject", func(m *email.Message) { m.Subject = "Your refund" }},
		{"recipient", func(m *email.Message) { m.To = []string{"bob@example.net"} }},
		{"sender", func(m *email.Message) { m.From = "billing@" + domain }},
		{"html", func(m *email.Message) { m.HTML = "<p>order 9</p>" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := parent.sub(t)
			s := e.sender(t)
			key := effects.MustKey("shop", "order-9", "receipt")
			if _, err := s.Apply(testCtx(t), key, base); err != nil {
				t.Fatal(err)
			}
			other := base
			other.To = append([]string(nil), base.To...)
			tc.change(&other)
			_, err := s.Apply(testCtx(t), key, other)
			if !errors.Is(err, effects.ErrKeyReused) || effects.ClassOf(err) == effects.Retryable {
				t.Fatalf("got %v, want ErrKeyReused, not retryable", err)
			}
			if e.srv.Total() != 1 {
				t.Errorf("server has %d messages, want 1", e.srv.Total())
			}
		})
	}
}

func TestInvalidKeysDoNothing(t *testing.T) {
	e := newEnv(t)
	s := e.sender(t)
	for name, key := range map[string]effects.Key{
		"empty":         "",
		"too long":      effects.Key(strings.Repeat("k", effects.MaxKeyLen+1)),
		"NUL byte":      "abc\x00def",
		"invalid UTF-8": "abc\xff\xfedef",
		"newline":       "abc\ndef",
	} {
		_, err := s.Apply(testCtx(t), key, receipt("x"))
		if !errors.Is(err, effects.ErrInvalidKey) || effects.ClassOf(err) == effects.Retryable {
			t.Errorf("%s: got %v, want ErrInvalidKey, not retryable", name, err)
		}
	}
	if e.srv.Sessions() != 0 || e.srv.Total() != 0 {
		t.Errorf("server saw %d sessions, %d messages; want none", e.srv.Sessions(), e.srv.Total())
	}
	if e.journal.begins.Load() != 0 || e.journalRows(t) != 0 {
		t.Errorf("journal: %d begins, %d rows; want none", e.journal.begins.Load(), e.journalRows(t))
	}
}

func TestInvalidMessagesDoNothing(t *testing.T) {
	e := newEnv(t)
	s := e.sender(t)
	for name, m := range map[string]email.Message{
		"no sender":        {To: []string{"a@example.net"}, Text: "x"},
		"no recipient":     {From: "a@" + domain, Text: "x"},
		"bad sender":       {From: "not an address", To: []string{"a@example.net"}},
		"bad recipient":    {From: "a@" + domain, To: []string{"a@example.net", "@@"}},
		"bad cc":           {From: "a@" + domain, Cc: []string{"nope"}},
		"header injection": {From: "a@" + domain, To: []string{"a@example.net\r\nBcc: x@evil.test"}},
	} {
		_, err := s.Apply(testCtx(t), effects.MustKey("shop", name), m)
		if !errors.Is(err, email.ErrInvalidMessage) || effects.ClassOf(err) == effects.Retryable {
			t.Errorf("%s: got %v, want ErrInvalidMessage, not retryable", name, err)
		}
	}
	if e.srv.Sessions() != 0 || e.journalRows(t) != 0 {
		t.Errorf("%d sessions, %d journal rows; want none", e.srv.Sessions(), e.journalRows(t))
	}
}

func TestMessageID(t *testing.T) {
	key := effects.MustKey("shop", "order-1", "receipt")
	id := email.MessageID(key, "shop.test")
	if id != email.MessageID(key, "shop.test") {
		t.Error("MessageID is not deterministic")
	}
	left, right, ok := strings.Cut(id, "@")
	if !ok || len(left) != 64 || strings.Trim(left, "0123456789abcdef") != "" || right != "shop.test" {
		t.Errorf("MessageID %q, want 64 hex digits @shop.test", id)
	}
	if email.MessageID(effects.MustKey("shop", "order-2", "receipt"), "shop.test") == id {
		t.Error("two keys share a Message-ID")
	}

	// The domain comes from From unless fixed.
	e := newEnv(t)
	k := effects.MustKey("shop", "from-domain")
	if _, err := e.sender(t).Apply(testCtx(t), k, email.Message{From: "x@mail.example.org", To: []string{"a@example.net"}}); err != nil {
		t.Fatal(err)
	}
	if e.srv.Count(email.MessageID(k, "mail.example.org")) != 1 {
		t.Errorf("Message-ID not on From's domain: %+v", e.srv.Messages())
	}
	k2 := effects.MustKey("shop", "fixed-domain")
	s := e.sender(t, email.WithMessageIDDomain("ids.example.com"))
	if _, err := s.Apply(testCtx(t), k2, email.Message{From: "x@mail.example.org", To: []string{"a@example.net"}}); err != nil {
		t.Fatal(err)
	}
	if e.srv.Count(email.MessageID(k2, "ids.example.com")) != 1 {
		t.Errorf("Message-ID not on the fixed domain: %+v", e.srv.Messages())
	}
}

func TestContract(t *testing.T) {
	e := newEnv(t)
	c := e.sender(t).Contract()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Guarantee != effects.AtLeastOnce || c.DuplicateWindow.Trigger != effects.AfterUnknownOutcome || !c.DetectsKeyReuse {
		t.Errorf("contract %s", c)
	}
	if !strings.Contains(c.DuplicateWindow.Between, "250") || !strings.Contains(c.DuplicateWindow.Between, "sent-record") {
		t.Errorf("window %q does not name the 250 and the sent-record", c.DuplicateWindow.Between)
	}
	for _, want := range []string{"journal", "Message-ID", "lease"} {
		if !strings.Contains(c.Enforcer, want) {
			t.Errorf("enforcer %q does not mention %s", c.Enforcer, want)
		}
	}
}

func TestNewRefuses(t *testing.T) {
	e := newEnv(t)
	for name, tc := range map[string]struct {
		addr   string
		opts   []email.Option
		option string
	}{
		"no journal":     {"127.0.0.1:25", nil, "WithJournal"},
		"no port":        {"127.0.0.1", []email.Option{email.WithJournal(e.journal)}, "addr"},
		"bad port":       {"127.0.0.1:http", []email.Option{email.WithJournal(e.journal)}, "addr"},
		"no host":        {":25", []email.Option{email.WithJournal(e.journal)}, "addr"},
		"zero lease":     {"127.0.0.1:25", []email.Option{email.WithJournal(e.journal, journal.WithLease(0))}, "WithLease"},
		"bad id domain":  {"127.0.0.1:25", []email.Option{email.WithJournal(e.journal), email.WithMessageIDDomain("a b")}, "WithMessageIDDomain"},
		"dotted domain":  {"127.0.0.1:25", []email.Option{email.WithJournal(e.journal), email.WithMessageIDDomain("a..b")}, "WithMessageIDDomain"},
		"bracket domain": {"127.0.0.1:25", []email.Option{email.WithJournal(e.journal), email.WithMessageIDDomain("a>b")}, "WithMessageIDDomain"},
		"nil dialer":     {"127.0.0.1:25", []email.Option{email.WithJournal(e.journal), email.WithDialContext(nil)}, "WithDialContext"},
		"nil logger":     {"127.0.0.1:25", []email.Option{email.WithJournal(e.journal, journal.WithLogger(nil))}, "WithLogger"},
		"bad go-mail":    {"127.0.0.1:25", []email.Option{email.WithJournal(e.journal), email.WithMailOptions(mail.WithTimeout(-1))}, "WithMailOptions"},
		"negative idle":  {"127.0.0.1:25", []email.Option{email.WithJournal(e.journal), email.WithIdleSessions(-1, time.Minute)}, "WithIdleSessions"},
		"zero idle time": {"127.0.0.1:25", []email.Option{email.WithJournal(e.journal), email.WithIdleSessions(4, 0)}, "WithIdleSessions"},
	} {
		_, err := email.New(tc.addr, tc.opts...)
		var ce *effects.ConfigError
		if !errors.As(err, &ce) || ce.Option != tc.option {
			t.Errorf("%s: %v, want a *ConfigError naming %s", name, err, tc.option)
		}
	}
	if _, err := email.New("127.0.0.1:25", nil, email.WithJournal(e.journal, journal.WithLease(time.Second)), nil); err != nil {
		t.Errorf("nil options: %v, want them ignored", err)
	}
}

// A send the journal cannot record is still a send: Apply reports it
// applied (an error would only lead the caller into the duplicate window)
// and logs the failure.
func TestUnrecordedSendIsAppliedAndLogged(t *testing.T) {
	e := newEnv(t)
	var logs bytes.Buffer
	j := &failingComplete{Journal: e.journal}
	s, err := email.New(e.srv.Addr(),
		email.WithMailOptions(mail.WithTLSPolicy(mail.NoTLS)),
		email.WithJournal(j, journal.WithLease(testLease), journal.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))),
	)
	if err != nil {
		t.Fatal(err)
	}
	key := effects.MustKey("shop", "order-10", "receipt")
	res, err := s.Apply(testCtx(t), key, receipt("order 10"))
	if err != nil || res.Status != effects.Applied {
		t.Fatalf("got %+v, %v; want applied", res, err)
	}
	if j.calls.Load() != 4 || !strings.Contains(logs.String(), "did not commit") || !strings.Contains(logs.String(), res.Ref) {
		t.Errorf("%d Complete calls, log %q", j.calls.Load(), logs.String())
	}
	if e.count(key) != 1 {
		t.Errorf("server has %d copies, want 1", e.count(key))
	}
}

type failingComplete struct {
	journal.Journal
	calls atomic.Int64
}

// Complete fails three times with a retryable error, which the Sender
// retries, then with one that is not.
func (j *failingComplete) Complete(context.Context, effects.Key, string) error {
	if j.calls.Add(1) <= 3 {
		return effects.Transient("test.Complete", "", errors.New("journal unavailable"))
	}
	return errors.New("journal refuses the record")
}

// Authentication is part of the configuration: a refused login (535), and
// a server that demands a login nobody gave (5.7.0 to MAIL; go-smtp
// answers 502, most servers 530), are
// configuration errors naming the SMTP AUTH options, from Apply and from
// Check, never dead-lettered as a refusal of the message.
func TestAuthFailuresAreConfiguration(t *testing.T) {
	e := newEnv(t)
	srv := smtptest.Start(t, smtptest.WithAuth("shop", "secret"))
	for name, tc := range map[string]struct {
		opts      []mail.Option
		code      int
		checkFail bool // Check sees it: the login is part of the session
	}{
		"wrong password": {[]mail.Option{mail.WithSMTPAuth(mail.SMTPAuthPlainNoEnc), mail.WithUsername("shop"), mail.WithPassword("wrong")}, 535, true},
		"no login":       {nil, 502, false},
	} {
		s := e.senderAt(t, srv.Addr(), email.WithMailOptions(tc.opts...))
		_, err := s.Apply(testCtx(t), effects.MustKey("shop", "auth", name), receipt("x"))
		var ce *effects.ConfigError
		var se *email.SMTPError
		if effects.ClassOf(err) != effects.InvalidConfig || !errors.As(err, &ce) || !strings.Contains(ce.Option, "SMTP AUTH") ||
			!errors.As(err, &se) || se.Code != tc.code {
			t.Errorf("%s: got %v, want a configuration error naming the SMTP AUTH options, with the %d", name, err, tc.code)
		}
		if err := s.Check(testCtx(t)); tc.checkFail != (err != nil) || (err != nil && effects.ClassOf(err) != effects.InvalidConfig) {
			t.Errorf("%s: Check = %v, want a configuration error: %v", name, err, tc.checkFail)
		}
	}
	ok := e.senderAt(t, srv.Addr(), email.WithMailOptions(mail.WithSMTPAuth(mail.SMTPAuthPlainNoEnc),
		mail.WithUsername("shop"), mail.WithPassword("secret")))
	if _, err := ok.Apply(testCtx(t), effects.MustKey("shop", "auth", "ok"), receipt("x")); err != nil {
		t.Fatal(err)
	}
	if srv.Total() != 1 {
		t.Errorf("server has %d messages, want 1", srv.Total())
	}
}

// Check opens a session and sends nothing; a server that is not there is
// retryable, not a configuration error.
func TestCheck(t *testing.T) {
	e := newEnv(t)
	srv := smtptest.Start(t, smtptest.WithAuth("shop", "secret"))
	ok := e.senderAt(t, srv.Addr(), email.WithMailOptions(mail.WithSMTPAuth(mail.SMTPAuthPlainNoEnc),
		mail.WithUsername("shop"), mail.WithPassword("secret")))
	if err := ok.Check(testCtx(t)); err != nil {
		t.Fatalf("Check = %v, want nil", err)
	}
	if srv.Total() != 0 || srv.Sessions() != 1 {
		t.Errorf("Check left %d messages and %d sessions, want 0 and 1", srv.Total(), srv.Sessions())
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	if err := e.senderAt(t, addr).Check(testCtx(t)); effects.ClassOf(err) != effects.Retryable {
		t.Errorf("Check of a refused connection = %v, want retryable", err)
	}
}

// The errors Apply returns, which a consumer logs by default, carry no
// recipient address: go-mail and the server quote them.
func TestErrorsRedactAddresses(t *testing.T) {
	e := newEnv(t)
	s := e.sender(t)
	e.srv.FailNext(smtptest.Rcpt, 550, "5.1.1 <alice@example.net>: Recipient address rejected")
	_, err := s.Apply(testCtx(t), effects.MustKey("shop", "redact"), receipt("x"))
	if effects.ClassOf(err) != effects.Permanent {
		t.Fatalf("got %v, want a permanent error", err)
	}
	if strings.Contains(err.Error(), "alice@") || !strings.Contains(err.Error(), "<address>") {
		t.Errorf("error text %q carries the recipient", err)
	}
	var se *mail.SendError
	if !errors.As(err, &se) || !strings.Contains(se.Error(), "alice@example.net") {
		t.Errorf("go-mail's error underneath lost the address: %v", se)
	}
	bad := receipt("x")
	bad.To = []string{"bob@@example.net"}
	_, err = s.Apply(testCtx(t), effects.MustKey("shop", "redact", "invalid"), bad)
	if !errors.Is(err, email.ErrInvalidMessage) || effects.ClassOf(err) != effects.Permanent || strings.Contains(err.Error(), "example.net") {
		t.Errorf("invalid recipient: %v; want ErrInvalidMessage, permanent, without the address", err)
	}
}
