package email

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	netmail "net/mail"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/wneessen/go-mail"

	"effectively.dev/effects"
)

// op names the operation in the errors Apply returns.
const op = "email.Send"

// DefaultLease is how long an attempt holds its key unless [WithLease] says
// otherwise.
const DefaultLease = time.Minute

// recordTimeout bounds Complete and Release, which run even after the
// caller's context was cancelled: the message went out (or definitely did
// not), and recording that is what keeps the next attempt honest.
const recordTimeout = 10 * time.Second

// Message is one email. Every field is part of the message's fingerprint:
// applying a key again with any field changed is [effects.ErrKeyReused].
type Message struct {
	// From is the sender, "addr@example.com" or "Name <addr@example.com>".
	// Required. Unless [WithMessageIDDomain] is given, its domain is the
	// Message-ID's domain.
	From string
	// To, Cc and Bcc are the recipients; at least one is required in all.
	To, Cc, Bcc []string
	// ReplyTo is an optional Reply-To address.
	ReplyTo string
	// Subject is the subject line.
	Subject string
	// Text is the plain-text body.
	Text string
	// HTML is an optional HTML body; with Text it is sent as an
	// alternative, alone it is the body.
	HTML string
}

// fingerprint identifies the message's payload for key-reuse detection.
func (m Message) fingerprint() []byte {
	return effects.Fingerprint(
		[]byte("email/v1"),
		[]byte(m.From),
		[]byte(strings.Join(m.To, "\n")),
		[]byte(strings.Join(m.Cc, "\n")),
		[]byte(strings.Join(m.Bcc, "\n")),
		[]byte(m.ReplyTo),
		[]byte(m.Subject),
		[]byte(m.Text),
		[]byte(m.HTML),
	)
}

// MessageID returns the Message-ID a [Sender] gives the message sent under
// key, without angle brackets: the hex SHA-256 of the key, "@", domain. It
// is the same on every attempt, so a duplicate (see the package doc) can be
// recognised by receivers and counted by tests.
func MessageID(key effects.Key, domain string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:]) + "@" + domain
}

// DialContextFunc dials the SMTP server. Its signature fits net.Dialer's
// DialContext and conformance.Faults' DialContext.
type DialContextFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Option configures [New].
type Option func(*config)

type config struct {
	mailOpts []mail.Option
	dial     DialContextFunc
	lease    time.Duration
	domain   string
	logger   *slog.Logger
}

// WithMailOptions passes options to go-mail's client: TLS policy
// (mail.WithTLSPolicy; go-mail's default requires STARTTLS, a plaintext
// test server needs mail.NoTLS), authentication (mail.WithSMTPAuth,
// mail.WithUsername, mail.WithPassword), mail.WithTimeout, mail.WithHELO.
// Do not pass mail.WithDialContextFunc (use [WithDialContext]) or
// mail.WithSSL (implicit TLS is not supported, see the package doc).
func WithMailOptions(opts ...mail.Option) Option {
	return func(c *config) { c.mailOpts = append(c.mailOpts, opts...) }
}

// WithDialContext makes the Sender open its connections with dial instead
// of a net.Dialer, e.g. through conformance.Faults in tests.
func WithDialContext(dial DialContextFunc) Option {
	return func(c *config) { c.dial = dial }
}

// WithLease sets how long one attempt holds its key in the journal
// (default [DefaultLease]). The lease also bounds the attempt's SMTP
// session. It decides what happens after an unknown outcome: a retry within
// the lease gets [effects.ErrInFlight], a retry after it sends again. Keep
// it well above the time a send takes; shorter leases make the duplicate
// window reachable sooner, longer ones delay the retry after a crash.
func WithLease(d time.Duration) Option {
	return func(c *config) { c.lease = d }
}

// WithMessageIDDomain sets the domain of every Message-ID (see
// [MessageID]); by default it is the domain of the message's From address.
// Fix it when From varies but the Message-ID must be predictable.
func WithMessageIDDomain(domain string) Option {
	return func(c *config) { c.domain = domain }
}

// WithLogger sets where the Sender reports what it cannot return: a
// sent-record that could not be completed after the server accepted the
// message, a lease that could not be released, a resend after an unknown
// outcome. The default is slog.Default() at the time of the event.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// Sender is an [effects.Effect] that sends a [Message] under a key, keeping
// a sent-record in an [effects.Journal]. Its contract is
// [effects.AtLeastOnce]: see the package doc for the duplicate window and
// the lease. It is safe for concurrent use; create one per SMTP server and
// share it.
type Sender struct {
	journal  effects.Journal
	client   *mail.Client
	dial     DialContextFunc
	lease    time.Duration
	domain   string
	logger   *slog.Logger
	contract effects.Contract
}

var _ effects.Effect[Message] = (*Sender)(nil)

// New returns a Sender that submits mail to the SMTP server at addr
// ("host:port", e.g. "smtp.example.com:587") and records each key in j,
// which is required. New does no I/O.
func New(j effects.Journal, addr string, opts ...Option) (*Sender, error) {
	if j == nil {
		return nil, errors.New("email.New: a journal is required: without a sent-record every redelivery sends again")
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("email.New: address %q: %w (want host:port)", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return nil, fmt.Errorf("email.New: address %q: bad port", addr)
	}
	cfg := config{lease: DefaultLease}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.lease <= 0 {
		return nil, fmt.Errorf("email.New: lease %v is not positive", cfg.lease)
	}
	if cfg.domain != "" && !validDomain(cfg.domain) {
		return nil, fmt.Errorf("email.New: Message-ID domain %q is not a valid domain", cfg.domain)
	}
	s := &Sender{journal: j, lease: cfg.lease, domain: cfg.domain, logger: cfg.logger, dial: cfg.dial}
	if s.dial == nil {
		var d net.Dialer
		s.dial = d.DialContext
	}
	mopts := append([]mail.Option{mail.WithPort(port)}, cfg.mailOpts...)
	mopts = append(mopts, mail.WithDialContextFunc(s.dialContext))
	s.client, err = mail.NewClient(host, mopts...)
	if err != nil {
		return nil, fmt.Errorf("email.New: %w", err)
	}
	domain := "<the From address's domain>"
	if s.domain != "" {
		domain = s.domain
	}
	s.contract = effects.Contract{
		Guarantee: effects.AtLeastOnce,
		Enforcer: fmt.Sprintf("sent-record in the journal (%T, lease %v) and Message-ID <sha256(key)@%s>, "+
			"on which receivers may dedup (most do not)", j, s.lease, domain),
		DuplicateWindow: effects.Window{
			Trigger: effects.AfterUnknownOutcome,
			Between: "after the SMTP server's 250 to DATA, before the sent-record commits",
		},
		DetectsKeyReuse: true,
	}
	return s, nil
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
// message ([ErrInvalidMessage]) before any I/O. Errors: the journal's
// [effects.ErrInFlight] and [effects.ErrKeyReused]; [effects.ErrTransient]
// (wrapping an [SMTPError]) or [ErrRejected] when the message was
// definitely not delivered; [effects.ErrAmbiguous] when the server may have
// it, which must be retried with the same key. If the server accepted the
// message but the journal cannot record it, Apply still returns Applied
// (the message went out, and an error would only make the caller retry into
// the duplicate window) and logs the failure.
func (s *Sender) Apply(ctx context.Context, key effects.Key, m Message) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	msg, err := s.build(key, m)
	if err != nil {
		return effects.Result{}, fmt.Errorf("%s key %q: %w", op, key, err)
	}
	start := time.Now()
	rec, err := s.journal.Begin(ctx, key, m.fingerprint(), s.lease)
	if err != nil {
		// ErrInFlight, ErrKeyReused and ErrAmbiguous (a lost reply) are
		// already classified by the journal; keep them as they are.
		return effects.Result{}, err
	}
	if rec.Done {
		return effects.Result{Status: effects.Replayed, Ref: rec.Ref}, nil
	}
	if rec.Attempt > 1 {
		s.log().DebugContext(ctx, "email: sending a key whose earlier attempt recorded no send "+
			"(released after a failure, or its lease expired after an unknown outcome: then this may be the declared duplicate)",
			"key", string(key), "attempt", rec.Attempt, "message_id", msg.GetMessageID())
	}

	// The SMTP session must end before the lease does, so that an attempt
	// that begins after the lease expired never races this one.
	sctx, cancel := context.WithDeadline(ctx, start.Add(s.lease-s.lease/10))
	defer cancel()
	a := &attempt{ctx: sctx}
	sendErr := s.client.DialAndSendWithContext(context.WithValue(sctx, attemptKey{}, a), msg)
	a.finish()

	switch out, smtpErr := classify(msg, sendErr); out {
	case delivered:
		ref := msg.ServerResponse()
		if ref == "" {
			ref = msg.GetMessageID()
		}
		s.complete(ctx, key, ref)
		return effects.Result{Status: effects.Applied, Ref: ref}, nil
	case notSent:
		// Release is fenced by the attempt number: if our lease expired
		// and another attempt took the key over, it does nothing.
		s.release(ctx, key, rec.Attempt)
		return effects.Result{}, notSentError(sctx, key, smtpErr)
	default:
		return effects.Result{}, ambiguousError(sctx, key, sendErr, s.lease.String())
	}
}

// complete records the sent message. The server has it, so a failure here
// is not returned: reporting an error would make the caller retry, and the
// retry would find the record pending and, after the lease, send again.
// Returning success lets the caller ack; the unrecorded send is logged.
func (s *Sender) complete(ctx context.Context, key effects.Key, ref string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	var err error
	backoff := 10 * time.Millisecond
	for range 3 {
		if err = s.journal.Complete(cctx, key, ref); err == nil || !effects.Retryable(err) {
			break
		}
		select {
		case <-cctx.Done():
		case <-time.After(backoff):
		}
		backoff *= 4
	}
	if err != nil {
		s.log().ErrorContext(ctx, "email: the SMTP server accepted the message but the sent-record did not commit; "+
			"a redelivery after the lease will send it again",
			"key", string(key), "ref", ref, "error", err)
	}
}

// release gives up the lease after a definite failure. If it fails, the
// lease expires on its own; the next attempt only waits longer.
func (s *Sender) release(ctx context.Context, key effects.Key, attempt int) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if err := s.journal.Release(cctx, key, attempt); err != nil {
		s.log().WarnContext(ctx, "email: could not release the lease after a failed send; the next attempt waits for it to expire",
			"key", string(key), "lease", s.lease, "error", err)
	}
}

func (s *Sender) log() *slog.Logger {
	if s.logger != nil {
		return s.logger
	}
	return slog.Default()
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
	msg.SetMessageIDWithValue(MessageID(key, domain))
	return msg, nil
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
