package email

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"mime"
	"net"
	netmail "net/mail"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/wneessen/go-mail"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
)

// op names the operation in the errors Apply returns.
const op = "email.Send"

// Message is one email. Every field is part of the message's fingerprint:
// applying a key again with any field changed is [effects.ErrKeyReused].
type Message struct {
	// From is the sender, "addr@example.com" or "Name <addr@example.com>".
	// Required. Unless [WithMessageIDDomain] is given, its domain is the
	// Message-ID's domain.
	From string
	// To, Cc and Bcc are the recipients; at least one is required in all.
	// Bcc recipients get the message but are not in its header.
	To, Cc, Bcc []string
	// ReplyTo is an optional Reply-To address.
	ReplyTo string
	// Subject is the subject line.
	Subject string
	// Text is the plain-text body.
	Text string
	// HTML is an optional HTML body; with Text it is sent as an
	// alternative (multipart/alternative), alone it is the body.
	HTML string
	// Headers are extra header fields, written in this order
	// (List-Unsubscribe, X-Campaign, ...). The Sender owns Message-ID,
	// Date, the address fields, Subject and the MIME fields; naming one of
	// them, a name that is not a header name, or a value with a line
	// break is [ErrInvalidMessage].
	Headers []Header
	// Attachments are files sent with the message, in this order.
	Attachments []Attachment
}

// Header is one header field of a [Message].
type Header struct {
	// Name is the field name, e.g. "List-Unsubscribe".
	Name string
	// Value is the field's value; non-ASCII text is encoded (RFC 2047).
	Value string
}

// Attachment is a file sent with a [Message].
type Attachment struct {
	// Filename is the name the recipient sees, e.g. "receipt.pdf".
	// Required; a base name without quotes, slashes or line breaks.
	Filename string
	// ContentType is the file's media type, e.g. "application/pdf"; empty
	// means the type go-mail derives from Filename's extension.
	ContentType string
	// Data is the file's content.
	Data []byte
	// Inline embeds the file for the HTML body to show (referenced as
	// "cid:" + Filename) instead of attaching it.
	Inline bool
}

// reservedHeaders are the fields the Sender writes itself, in canonical
// form.
var reservedHeaders = map[string]bool{
	"Message-Id": true, "Date": true, "From": true, "Sender": true, "To": true, "Cc": true, "Bcc": true,
	"Reply-To": true, "Subject": true, "Mime-Version": true, "Content-Type": true,
	"Content-Transfer-Encoding": true, "Content-Disposition": true, "Content-Id": true,
}

// Fingerprint identifies the message's payload for key-reuse detection:
// it is what [Sender.Apply] gives its journal's Begin. Headers and
// attachments follow the other fields with their counts, so no two
// messages share an encoding.
func (m Message) Fingerprint() []byte {
	fields := [][]byte{
		[]byte("email/v1"),
		[]byte(m.From),
		[]byte(strings.Join(m.To, "\n")),
		[]byte(strings.Join(m.Cc, "\n")),
		[]byte(strings.Join(m.Bcc, "\n")),
		[]byte(m.ReplyTo),
		[]byte(m.Subject),
		[]byte(m.Text),
		[]byte(m.HTML),
		[]byte(strconv.Itoa(len(m.Headers))),
	}
	for _, h := range m.Headers {
		fields = append(fields, []byte(h.Name), []byte(h.Value))
	}
	fields = append(fields, []byte(strconv.Itoa(len(m.Attachments))))
	for _, a := range m.Attachments {
		fields = append(fields, []byte(a.Filename), []byte(a.ContentType), []byte(strconv.FormatBool(a.Inline)), a.Data)
	}
	return effects.Fingerprint(fields...)
}

// MessageID returns the Message-ID a [Sender] gives the message sent under
// key, without angle brackets: the hex SHA-256 of the key, "@", domain. It
// is the same on every attempt, so a duplicate (see the package doc) can be
// recognised by receivers and counted by tests.
func MessageID(key effects.Key, domain string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:]) + "@" + domain
}

// Option configures [New]. A nil Option is ignored.
type Option interface{ apply(*config) }

type option func(*config)

func (f option) apply(c *config) { f(c) }

type config struct {
	mailOpts []mail.Option
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	dialSet  bool
	journal  journal.Journal
	jopts    []journal.Option
	domain   string

	idle        int
	idleTimeout time.Duration
}

// WithMailOptions passes options to go-mail's client: TLS policy
// (mail.WithTLSPolicy: go-mail's default, mail.TLSMandatory, requires
// STARTTLS and refuses a server that does not offer it; a plain-text test
// server needs mail.NoTLS), TLS settings (mail.WithTLSConfig),
// authentication (mail.WithSMTPAuth, mail.WithUsername, mail.WithPassword),
// mail.WithTimeout, mail.WithHELO. Do not pass mail.WithDialContextFunc
// (use [WithDialContext]) or mail.WithSSL (implicit TLS is not supported,
// see the package doc). An option go-mail refuses makes New fail.
func WithMailOptions(opts ...mail.Option) Option {
	return option(func(c *config) { c.mailOpts = append(c.mailOpts, opts...) })
}

// WithDialContext makes the Sender open its connections with dial instead
// of a net.Dialer, e.g. through conformance.Faults in tests; net.Dialer's
// DialContext and conformance.Faults' DialContext fit. dial must not be
// nil.
func WithDialContext(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return option(func(c *config) { c.dial, c.dialSet = dial, true })
}

// WithJournal keeps the Sender's sent-records in j (for example
// postgres.NewJournal); [New] requires it. opts set the journal's lease,
// record timeout, observer and logger ([journal.WithLease],
// [journal.WithRecordTimeout], ...). The lease also bounds the attempt's
// SMTP session, which ends at nine tenths of it, and decides what happens
// after an unknown outcome: a retry within the lease gets
// [effects.ErrInFlight], a retry after it sends again. Keep it well above
// the time a send takes.
func WithJournal(j journal.Journal, opts ...journal.Option) Option {
	return option(func(c *config) { c.journal, c.jopts = j, opts })
}

// WithMessageIDDomain sets the domain of every Message-ID (see
// [MessageID]); by default it is the domain of the message's From address.
// Fix it when From varies but the Message-ID must be predictable.
func WithMessageIDDomain(domain string) Option {
	return option(func(c *config) { c.domain = domain })
}

// Sender is an [effects.Effect] that sends a [Message] under a key, keeping
// a sent-record in an [journal.Journal]. Its contract is
// [effects.AtLeastOnce]: see the package doc for the duplicate window and
// the lease. It is safe for concurrent use; create one per SMTP server and
// share it.
type Sender struct {
	j        *journal.Journaled
	client   *mail.Client
	addr     string
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	domain   string
	contract effects.Contract
	sessions *sessions
}

var _ effects.Effect[Message] = (*Sender)(nil)

// New returns a Sender that submits mail to the SMTP server at addr
// ("host:port", e.g. "smtp.example.com:587") and records each key in the
// journal of [WithJournal], which is required. New does no I/O. It returns
// a *[effects.ConfigError] for a missing journal, a bad address or an
// invalid option.
func New(addr string, opts ...Option) (*Sender, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, effects.ConfigErrorf("email.New", "addr", "%q: %v (want host:port)", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 || host == "" {
		return nil, effects.ConfigErrorf("email.New", "addr", "%q: want a host and a port from 1 to 65535", addr)
	}
	cfg := config{idle: defaultIdleSessions, idleTimeout: defaultIdleTimeout}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	switch {
	case cfg.journal == nil:
		return nil, effects.ConfigErrorf("email.New", "WithJournal", "no journal; without a sent-record every redelivery sends again (postgres.NewJournal keeps one)")
	case cfg.domain != "" && !validDomain(cfg.domain):
		return nil, effects.ConfigErrorf("email.New", "WithMessageIDDomain", "%q is not a valid domain", cfg.domain)
	case cfg.dialSet && cfg.dial == nil:
		return nil, effects.ConfigErrorf("email.New", "WithDialContext", "nil dial function")
	case cfg.idle < 0:
		return nil, effects.ConfigErrorf("email.New", "WithIdleSessions", "max %d is negative", cfg.idle)
	case cfg.idleTimeout <= 0:
		return nil, effects.ConfigErrorf("email.New", "WithIdleSessions", "timeout %v is not positive", cfg.idleTimeout)
	}
	jopts := append(cfg.jopts[:len(cfg.jopts):len(cfg.jopts)], journal.WithNotApplied(notApplied))
	journaled, err := journal.NewJournaled(op, cfg.journal, jopts...)
	if err != nil {
		return nil, err
	}
	s := &Sender{j: journaled, addr: addr, domain: cfg.domain, dial: cfg.dial,
		sessions: &sessions{max: cfg.idle, timeout: cfg.idleTimeout}}
	if s.dial == nil {
		var d net.Dialer
		s.dial = d.DialContext
	}
	mopts := append([]mail.Option{mail.WithPort(port)}, cfg.mailOpts...)
	// The Sender checks its sessions itself (a session that died while
	// idle fails before anything is handed over, and the message goes out
	// on a new one), so go-mail's NOOP before each message and after it
	// would only cost two round trips; and RFC 5321 ends a mail
	// transaction with the reply to DATA, so the RSET after it is another
	// round trip the next MAIL does not need.
	mopts = append(mopts, mail.WithDialContextFunc(s.dialContext), mail.WithoutNoop(), mail.WithoutRset())
	s.client, err = mail.NewClient(host, mopts...)
	if err != nil {
		return nil, effects.ConfigErrorf("email.New", "WithMailOptions", "%v", err)
	}
	domain := "<the From address's domain>"
	if s.domain != "" {
		domain = s.domain
	}
	s.contract = effects.Contract{
		Guarantee: effects.AtLeastOnce,
		Enforcer: fmt.Sprintf("sent-record in the journal (%T, lease %v) and Message-ID <sha256(key)@%s>, "+
			"on which receivers may dedup (most do not)", cfg.journal, journaled.Lease(), domain),
		DuplicateWindow: effects.Window{
			Trigger: effects.AfterUnknownOutcome,
			Between: "after the SMTP server's 250 to DATA, before the sent-record commits",
		},
		DetectsKeyReuse: true,
	}
	return s, nil
}

// Close ends the SMTP sessions the Sender keeps open between messages
// (see [WithIdleSessions]), saying QUIT to each, and keeps none after. A
// Sender still sends after Close, on a session per message. Close always
// returns nil.
func (s *Sender) Close() error {
	s.sessions.close()
	return nil
}

// Contract declares at-least-once delivery with a duplicate only after an
// unknown outcome (a 250 that was lost or not recorded, followed by a retry
// after the lease), the journal and the Message-ID as enforcers, keys kept
// until the journal prunes them, and key reuse detected by the message's
// fingerprint.
func (s *Sender) Contract() effects.Contract { return s.contract }

// Apply sends m under key, or finds it sent. It returns
// [effects.Applied] with the server's reply to the end of DATA as Ref
// ("2.0.0 OK: queued as ..."), or [effects.Replayed] with the Ref recorded
// the first time. It refuses an invalid key ([effects.ErrInvalidKey]) or
// message ([ErrInvalidMessage], inside [effects.ErrPoison]) before any
// I/O. Every error is in one class of [effects.ClassOf]: the journal's
// [effects.ErrInFlight] and [effects.ErrKeyReused]; [effects.ErrTransient]
// when the journal failed before the send, or (wrapping an [SMTPError])
// when the message was definitely not delivered (a 4xx, a refused or
// broken connection); [effects.ErrRefused] wrapping an SMTPError that
// matches [ErrRejected] when the server refused it with a 5xx; a
// configuration error (errors.Is [effects.ErrInvalidConfig], a
// *[effects.ConfigError] naming the setting) when no retry can succeed
// before the configuration changes: a refused login or one the server
// requires (530, 534, 535, 538, or a mechanism the server does not offer;
// the Option names the SMTP AUTH options), a refused TLS handshake,
// STARTTLS required but not offered, a host that does not exist (the
// Option is the server's address); [effects.ErrAmbiguous] when the server
// may have it, which must be retried with the same key. Error texts
// carry no mail addresses (see [SMTPError.Error]). If the server accepted the
// message but the journal cannot record it, Apply still returns Applied
// (the message went out, and an error would only make the caller retry
// into the duplicate window) and logs the failure.
func (s *Sender) Apply(ctx context.Context, key effects.Key, m Message) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	msg, err := s.build(key, m)
	if err != nil {
		return effects.Result{}, &effects.Error{Kind: effects.ErrPoison, Op: op, Key: key, Err: redacted{err}}
	}
	return s.j.Apply(ctx, key, m.Fingerprint(), func(ctx context.Context, _ *journal.Attempt) (effects.Result, error) {
		// ctx ends at nine tenths of the lease: the SMTP session must end
		// before the lease does, so that an attempt that begins after the
		// lease expired never races this one.
		a := &attempt{ctx: ctx}
		sendErr := s.send(ctx, a, msg)
		a.finish()
		switch out, smtpErr := classify(msg, sendErr); out {
		case delivered:
			ref := msg.ServerResponse()
			if ref == "" {
				ref = msg.GetMessageID()
			}
			return effects.Result{Status: effects.Applied, Ref: ref}, nil
		case notSent:
			return effects.Result{}, s.notSentError(ctx, op, key, smtpErr)
		default:
			return effects.Result{}, ambiguousError(ctx, key, sendErr, s.j.Lease().String())
		}
	})
}

// Check opens an SMTP session the way Apply does (connect, greeting, EHLO,
// STARTTLS as the TLS policy says, AUTH when configured) and closes it
// with QUIT, sending no message (see [effects.Checker]). It returns nil
// when the session opened; the configuration error Apply would return for
// a refused login, a refused TLS handshake, STARTTLS required but not
// offered or a host that does not exist; [effects.ErrTransient] when the
// server could not be reached now (a refused connection, a timeout, a
// 4xx greeting).
func (s *Sender) Check(ctx context.Context) error {
	const op = "email.Sender.Check"
	a := &attempt{ctx: ctx}
	defer a.finish()
	client, err := s.client.DialToSMTPClientWithContext(context.WithValue(ctx, attemptKey{}, a))
	if err != nil {
		e := connectError(err)
		if err := s.notSentError(ctx, op, "", e); effects.ClassOf(err) != effects.Permanent {
			return err
		}
		// A 5xx to the greeting or EHLO: this server refuses the Sender
		// for good, which no retry fixes.
		return fmt.Errorf("%w: %w", &effects.ConfigError{Op: op, Option: s.addr,
			Reason: fmt.Sprintf("the server refused the session (%d); check the address and the HELO name", e.Code)}, e)
	}
	_ = client.Quit()
	return nil
}

var _ effects.Checker = (*Sender)(nil)

// notApplied is this adapter's part of the journal's classification: an
// [SMTPError] describes a failure that definitely did not deliver the
// message (a refused connection, a 4xx or 5xx before the server accepted
// the data), so the lease is released and the retry need not wait for it.
func notApplied(err error) bool {
	var se *SMTPError
	return errors.As(err, &se)
}

// build turns m into a go-mail message with the key's Message-ID.
func (s *Sender) build(key effects.Key, m Message) (*mail.Msg, error) {
	if m.From == "" {
		return nil, fmt.Errorf("%w: no From", ErrInvalidMessage)
	}
	if len(m.To)+len(m.Cc)+len(m.Bcc) == 0 {
		return nil, fmt.Errorf("%w: no recipient", ErrInvalidMessage)
	}
	msg := mail.NewMsg()
	if err := msg.From(m.From); err != nil {
		return nil, fmt.Errorf("%w: From: %w", ErrInvalidMessage, err)
	}
	for _, set := range []struct {
		name  string
		addrs []string
		add   func(...string) error
	}{{"To", m.To, msg.To}, {"Cc", m.Cc, msg.Cc}, {"Bcc", m.Bcc, msg.Bcc}} {
		if len(set.addrs) == 0 {
			continue
		}
		if err := set.add(set.addrs...); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalidMessage, set.name, err)
		}
	}
	if m.ReplyTo != "" {
		if err := msg.ReplyTo(m.ReplyTo); err != nil {
			return nil, fmt.Errorf("%w: Reply-To: %w", ErrInvalidMessage, err)
		}
	}
	domain := s.domain
	if domain == "" {
		addr, err := netmail.ParseAddress(m.From)
		if err != nil {
			return nil, fmt.Errorf("%w: From: %w", ErrInvalidMessage, err)
		}
		domain = addr.Address[strings.LastIndexByte(addr.Address, '@')+1:]
		if !validDomain(domain) {
			return nil, fmt.Errorf("%w: From's domain %q cannot be a Message-ID's domain; set WithMessageIDDomain",
				ErrInvalidMessage, domain)
		}
	}
	msg.Subject(m.Subject)
	switch {
	case m.HTML == "":
		msg.SetBodyString(mail.TypeTextPlain, m.Text)
	case m.Text == "":
		msg.SetBodyString(mail.TypeTextHTML, m.HTML)
	default:
		msg.SetBodyString(mail.TypeTextPlain, m.Text)
		msg.AddAlternativeString(mail.TypeTextHTML, m.HTML)
	}
	for _, h := range m.Headers {
		name := textproto.CanonicalMIMEHeaderKey(h.Name)
		switch {
		case !validHeaderName(h.Name):
			return nil, fmt.Errorf("%w: header name %q: want printable ASCII without a colon or a space", ErrInvalidMessage, h.Name)
		case reservedHeaders[name]:
			return nil, fmt.Errorf("%w: header %s is written by the Sender (use the Message's fields)", ErrInvalidMessage, name)
		case strings.ContainsAny(h.Value, "\r\n"):
			return nil, fmt.Errorf("%w: header %s: the value holds a line break", ErrInvalidMessage, name)
		}
		msg.SetGenHeader(mail.Header(name), h.Value)
	}
	for _, a := range m.Attachments {
		if a.Filename == "" || strings.ContainsAny(a.Filename, "\r\n\"/\\") {
			return nil, fmt.Errorf("%w: attachment file name %q: want a base name without quotes, slashes or line breaks", ErrInvalidMessage, a.Filename)
		}
		var opts []mail.FileOption
		if a.ContentType != "" {
			if _, _, err := mime.ParseMediaType(a.ContentType); err != nil {
				return nil, fmt.Errorf("%w: attachment %s: content type %q: %w", ErrInvalidMessage, a.Filename, a.ContentType, err)
			}
			opts = append(opts, mail.WithFileContentType(mail.ContentType(a.ContentType)))
		}
		if a.Inline {
			msg.EmbedReadSeeker(a.Filename, bytes.NewReader(a.Data), opts...)
		} else {
			msg.AttachReadSeeker(a.Filename, bytes.NewReader(a.Data), opts...)
		}
	}
	msg.SetMessageIDWithValue(MessageID(key, domain))
	return msg, nil
}

// validHeaderName accepts an RFC 5322 field name: printable ASCII other
// than the colon (and, to be safe, the space).
func validHeaderName(n string) bool {
	if n == "" {
		return false
	}
	for i := 0; i < len(n); i++ {
		if c := n[i]; c <= ' ' || c > '~' || c == ':' {
			return false
		}
	}
	return true
}

// validDomain accepts a dot-atom (RFC 5322 id-right): atext runs separated
// by single dots.
func validDomain(d string) bool {
	if d == "" || len(d) > 255 || d[0] == '.' || d[len(d)-1] == '.' || strings.Contains(d, "..") {
		return false
	}
	for i := 0; i < len(d); i++ {
		c := d[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.':
		case strings.IndexByte("!#$%&'*+-/=?^_`{|}~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// attemptKey carries an *attempt in the context go-mail passes to the
// dialer.
type attemptKey struct{}

// attempt tracks the connections one Apply dialed. Closing them when the
// attempt's context ends makes go-mail, which only watches the context
// while dialing, give up a session whose caller cancelled or whose lease
// ran out; closing them when Apply is done also closes a connection go-mail
// leaves open after a failed EHLO, STARTTLS or AUTH.
type attempt struct {
	ctx   context.Context
	mu    sync.Mutex
	conns []net.Conn
	stops []func() bool
}

func (s *Sender) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := s.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if a, ok := ctx.Value(attemptKey{}).(*attempt); ok {
		a.mu.Lock()
		a.conns = append(a.conns, c)
		a.stops = append(a.stops, context.AfterFunc(a.ctx, func() { c.Close() }))
		a.mu.Unlock()
	}
	return c, nil
}

// keep hands over the connection dialed last, which the caller keeps
// open past the attempt: finish will not close it. It returns nil if the
// attempt dialed nothing.
func (a *attempt) keep() net.Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.conns) - 1
	if n < 0 {
		return nil
	}
	c := a.conns[n]
	a.stops[n]()
	a.conns, a.stops = a.conns[:n], a.stops[:n]
	return c
}

func (a *attempt) finish() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, stop := range a.stops {
		stop()
	}
	for _, c := range a.conns {
		c.Close()
	}
}
