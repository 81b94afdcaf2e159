package email_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"slices"
	"strings"
	"testing"
	"time"

	gomail "github.com/wneessen/go-mail"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/email"
	"effectively.dev/email/smtptest"
)

// rich is a message that uses every field.
func rich() email.Message {
	return email.Message{
		From:    "Shop <orders@" + domain + ">",
		To:      []string{"alice@example.net"},
		Cc:      []string{"accounts@example.net"},
		Bcc:     []string{"archive@" + domain},
		ReplyTo: "support@" + domain,
		Subject: "Your receipt",
		Text:    "Thanks for order 11.",
		HTML:    `<p>Thanks for order 11.</p><img src="cid:logo.png">`,
		Headers: []email.Header{
			{Name: "List-Unsubscribe", Value: "<mailto:unsubscribe@" + domain + ">"},
			{Name: "X-Campaign", Value: "receipts-2025"},
		},
		Attachments: []email.Attachment{
			{Filename: "receipt.pdf", ContentType: "application/pdf", Data: []byte("%PDF-1.7 receipt 11")},
			{Filename: "logo.png", ContentType: "image/png", Data: []byte("\x89PNG logo"), Inline: true},
		},
	}
}

// part is one leaf of a MIME message.
type part struct {
	header mail.Header
	body   []byte
}

// leaves walks a MIME entity and returns its non-multipart parts, bodies
// decoded.
func leaves(t *testing.T, header mail.Header, body io.Reader) []part {
	t.Helper()
	mt, params, err := mime.ParseMediaType(header.Get("Content-Type"))
	if err != nil {
		t.Fatalf("Content-Type %q: %v", header.Get("Content-Type"), err)
	}
	if !strings.HasPrefix(mt, "multipart/") {
		b, err := io.ReadAll(body)
		if err != nil {
			t.Fatal(err)
		}
		switch strings.ToLower(header.Get("Content-Transfer-Encoding")) {
		case "base64":
			if b, err = io.ReadAll(base64.NewDecoder(base64.StdEncoding, bytes.NewReader(b))); err != nil {
				t.Fatal(err)
			}
		case "quoted-printable":
			// multipart.Reader already decoded it.
		}
		return []part{{header, b}}
	}
	r := multipart.NewReader(body, params["boundary"])
	var out []part
	for {
		p, err := r.NextRawPart()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, leaves(t, mail.Header(p.Header), p)...)
	}
}

// Every field of a Message reaches the server as the recipient will see
// it: the extra headers, Reply-To and Cc in the header, Bcc only in the
// envelope, the HTML as an alternative to the text, the attachment and
// the inline image.
func TestRichMessageArrivesComplete(t *testing.T) {
	e := newEnv(t)
	key := effects.MustKey("shop", "order-11", "receipt")
	if _, err := e.sender(t).Apply(testCtx(t), key, rich()); err != nil {
		t.Fatal(err)
	}
	msgs := e.srv.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages, want 1", len(msgs))
	}
	m := msgs[0]
	h := m.Header
	for name, want := range map[string]string{
		"List-Unsubscribe": "<mailto:unsubscribe@" + domain + ">",
		"X-Campaign":       "receipts-2025",
		"Reply-To":         "<support@" + domain + ">",
		"Cc":               "<accounts@example.net>",
	} {
		if got := h.Get(name); got != want {
			t.Errorf("header %s = %q, want %q", name, got, want)
		}
	}
	if h.Get("Bcc") != "" || bytes.Contains(m.Data, []byte("archive@")) {
		t.Errorf("the Bcc recipient shows in the message:\n%s", m.Data)
	}
	wantRcpts := []string{"alice@example.net", "accounts@example.net", "archive@" + domain}
	if got := slices.Sorted(slices.Values(m.To)); !slices.Equal(got, slices.Sorted(slices.Values(wantRcpts))) {
		t.Errorf("envelope recipients %v, want %v", m.To, wantRcpts)
	}
	parsed, err := mail.ReadMessage(bytes.NewReader(m.Data))
	if err != nil {
		t.Fatal(err)
	}
	byType := map[string]part{}
	for _, p := range leaves(t, parsed.Header, parsed.Body) {
		mt, _, _ := mime.ParseMediaType(p.header.Get("Content-Type"))
		byType[mt] = p
	}
	if p := byType["text/plain"]; !bytes.Contains(p.body, []byte("Thanks for order 11.")) {
		t.Errorf("text part %q", p.body)
	}
	if p := byType["text/html"]; !bytes.Contains(p.body, []byte("<p>Thanks for order 11.</p>")) {
		t.Errorf("html part %q", p.body)
	}
	if p := byType["application/pdf"]; string(p.body) != "%PDF-1.7 receipt 11" ||
		!strings.HasPrefix(p.header.Get("Content-Disposition"), "attachment") || !strings.Contains(p.header.Get("Content-Disposition"), "receipt.pdf") {
		t.Errorf("attachment %q, disposition %q", p.body, p.header.Get("Content-Disposition"))
	}
	if p := byType["image/png"]; string(p.body) != "\x89PNG logo" ||
		!strings.HasPrefix(p.header.Get("Content-Disposition"), "inline") || !strings.Contains(p.header.Get("Content-Id"), "logo.png") {
		t.Errorf("inline image %q, disposition %q, id %q", p.body, p.header.Get("Content-Disposition"), p.header.Get("Content-Id"))
	}
	if !strings.Contains(parsed.Header.Get("Content-Type"), "multipart/") {
		t.Errorf("Content-Type %q, want multipart", parsed.Header.Get("Content-Type"))
	}
}

// Changing any field of a rich message under the same key is key reuse.
func TestRichMessageFieldsAreFingerprinted(t *testing.T) {
	parent := newEnv(t)
	for _, tc := range []struct {
		name   string
		change func(*email.Message)
	}{
		{"cc", func(m *email.Message) { m.Cc = []string{"other@example.net"} }},
		{"bcc", func(m *email.Message) { m.Bcc = nil }},
		{"reply-to", func(m *email.Message) { m.ReplyTo = "help@" + domain }},
		{"html", func(m *email.Message) { m.HTML += " " }},
		{"header value", func(m *email.Message) { m.Headers[1].Value = "receipts-2026" }},
		{"header name", func(m *email.Message) { m.Headers[1].Name = "X-Campaign-Id" }},
		{"header order", func(m *email.Message) { m.Headers[0], m.Headers[1] = m.Headers[1], m.Headers[0] }},
		{"header added", func(m *email.Message) { m.Headers = append(m.Headers, email.Header{Name: "X-More", Value: "1"}) }},
		{"headers dropped", func(m *email.Message) { m.Headers = nil }},
		{"attachment data", func(m *email.Message) { m.Attachments[0].Data = []byte("%PDF-1.7 receipt 12") }},
		{"attachment name", func(m *email.Message) { m.Attachments[0].Filename = "receipt-11.pdf" }},
		{"attachment type", func(m *email.Message) { m.Attachments[0].ContentType = "application/octet-stream" }},
		{"attachment inline", func(m *email.Message) { m.Attachments[1].Inline = false }},
		{"attachment dropped", func(m *email.Message) { m.Attachments = m.Attachments[:1] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := parent.sub(t)
			s := e.sender(t)
			key := effects.MustKey("shop", "order-12", "receipt")
			if _, err := s.Apply(testCtx(t), key, rich()); err != nil {
				t.Fatal(err)
			}
			other := rich()
			tc.change(&other)
			if _, err := s.Apply(testCtx(t), key, other); !errors.Is(err, effects.ErrKeyReused) {
				t.Fatalf("got %v, want ErrKeyReused", err)
			}
			if again, err := s.Apply(testCtx(t), key, rich()); err != nil || again.Status != effects.Replayed {
				t.Errorf("the same rich message again: %+v, %v; want replayed", again, err)
			}
			if e.srv.Total() != 1 {
				t.Errorf("server has %d messages, want 1", e.srv.Total())
			}
		})
	}
}

func TestInvalidHeadersAndAttachmentsDoNothing(t *testing.T) {
	e := newEnv(t)
	s := e.sender(t)
	base := receipt("x")
	for name, change := range map[string]func(*email.Message){
		"reserved Message-ID":     func(m *email.Message) { m.Headers = []email.Header{{Name: "Message-ID", Value: "<x@evil.test>"}} },
		"reserved subject":        func(m *email.Message) { m.Headers = []email.Header{{Name: "subject", Value: "other"}} },
		"reserved bcc":            func(m *email.Message) { m.Headers = []email.Header{{Name: "BCC", Value: "eve@evil.test"}} },
		"name with a colon":       func(m *email.Message) { m.Headers = []email.Header{{Name: "X-A:B", Value: "v"}} },
		"name with a space":       func(m *email.Message) { m.Headers = []email.Header{{Name: "X A", Value: "v"}} },
		"empty name":              func(m *email.Message) { m.Headers = []email.Header{{Name: "", Value: "v"}} },
		"value with a line break": func(m *email.Message) { m.Headers = []email.Header{{Name: "X-A", Value: "v\r\nBcc: eve@evil.test"}} },
		"attachment without name": func(m *email.Message) { m.Attachments = []email.Attachment{{Data: []byte("x")}} },
		"attachment path": func(m *email.Message) {
			m.Attachments = []email.Attachment{{Filename: "../etc/passwd", Data: []byte("x")}}
		},
		"attachment quote": func(m *email.Message) { m.Attachments = []email.Attachment{{Filename: `a".pdf`, Data: []byte("x")}} },
		"bad content type": func(m *email.Message) {
			m.Attachments = []email.Attachment{{Filename: "a.pdf", ContentType: "pdf please", Data: []byte("x")}}
		},
	} {
		m := base
		change(&m)
		_, err := s.Apply(testCtx(t), effects.MustKey("shop", name), m)
		if !errors.Is(err, email.ErrInvalidMessage) || effects.ClassOf(err) == effects.Retryable {
			t.Errorf("%s: got %v, want ErrInvalidMessage", name, err)
		}
	}
	if e.srv.Sessions() != 0 || e.journalRows(t) != 0 {
		t.Errorf("%d sessions, %d journal rows; want none", e.srv.Sessions(), e.journalRows(t))
	}
}

// STARTTLS is go-mail's default: a server that offers it and is trusted
// works; a certificate the client does not trust, or a server without
// STARTTLS, is a configuration error that no retry fixes, and nothing is
// sent.
func TestTLSRefusalsAreConfigurationErrors(t *testing.T) {
	tlsSrv := smtptest.Start(t, smtptest.WithSTARTTLS())
	plainSrv := smtptest.Start(t)
	for _, tc := range []struct {
		name   string
		srv    *smtptest.Server
		opts   []gomail.Option
		reason string // "" means it must succeed
	}{
		{"trusted certificate", tlsSrv, []gomail.Option{gomail.WithTLSConfig(tlsSrv.TLSConfig())}, ""},
		{"certificate not trusted", tlsSrv, nil, "certificate"},
		{"server without STARTTLS", plainSrv, nil, "STARTTLS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := memjournal.New(nil)
			s, err := email.New(tc.srv.Addr(), email.WithJournal(j), email.WithMailOptions(append([]gomail.Option{gomail.WithTimeout(5 * time.Second)}, tc.opts...)...))
			if err != nil {
				t.Fatal(err)
			}
			key := effects.MustKey("shop", "tls", tc.name)
			before := tc.srv.Total()
			res, err := s.Apply(testCtx(t), key, receipt("over TLS"))
			if tc.reason == "" {
				msgs := tc.srv.Messages()
				if err != nil || res.Status != effects.Applied || !msgs[len(msgs)-1].TLS {
					t.Fatalf("Apply = %+v, %v; want applied over TLS", res, err)
				}
				return
			}
			var ce *effects.ConfigError
			if !errors.Is(err, effects.ErrInvalidConfig) || !errors.As(err, &ce) || effects.ClassOf(err) == effects.Retryable || errors.Is(err, effects.ErrTransient) {
				t.Fatalf("got %v, want a configuration error, not retryable", err)
			}
			if ce.Option != tc.srv.Addr() || !strings.Contains(ce.Reason, tc.reason) || !strings.Contains(err.Error(), "no retry fixes this") {
				t.Errorf("config error %+v does not name the server and the %s", ce, tc.reason)
			}
			var se *email.SMTPError
			if !errors.As(err, &se) || se.Stage != "connect" {
				t.Errorf("%v: the SMTPError underneath is not reachable", err)
			}
			if tc.srv.Total() != before {
				t.Errorf("the server got a message")
			}
			if j.Releases() != 1 {
				t.Errorf("%d releases, want 1: nothing was sent", j.Releases())
			}
		})
	}
}

// A journal failure before the send is ErrTransient, whatever the
// journal's error: nothing was sent, the same key may be retried.
func TestJournalFailureBeforeTheSendIsTransient(t *testing.T) {
	e := newEnv(t)
	j := &failingBegin{Journal: e.journal, err: errors.New("journal: connection reset")}
	s, err := email.New(e.srv.Addr(), email.WithJournal(j), email.WithMailOptions(gomail.WithTLSPolicy(gomail.NoTLS)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Apply(testCtx(t), effects.MustKey("shop", "journal-down"), receipt("x"))
	if !errors.Is(err, effects.ErrTransient) || effects.ClassOf(err) != effects.Retryable || !errors.Is(err, j.err) {
		t.Fatalf("got %v, want a retryable ErrTransient wrapping the journal's error", err)
	}
	if e.srv.Sessions() != 0 {
		t.Errorf("%d SMTP sessions, want none", e.srv.Sessions())
	}
}

type failingBegin struct {
	journal.Journal
	err error
}

func (j *failingBegin) Begin(context.Context, effects.Key, []byte, time.Duration) (journal.Record, error) {
	return journal.Record{}, j.err
}
