package email

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"regexp"
	"strings"

	"github.com/wneessen/go-mail"

	"effectively.dev/effects"
)

var (
	// ErrRejected matches (with errors.Is) an [SMTPError] whose reply code
	// is 5xx: the server refused the message permanently before accepting
	// it (an unknown recipient, a policy rejection). Nothing was sent and
	// the lease was released; retrying the same key and message will be
	// refused again. Apply returns it inside an [effects.ErrRefused] error,
	// so its class is [effects.Permanent] and a consumer dead-letters the
	// delivery at once. A 5xx that says the Sender's configuration is wrong
	// (530, 534, 535, 538: authentication) is a configuration error
	// instead, see [Sender.Apply].
	ErrRejected = errors.New("email: rejected by the SMTP server")

	// ErrInvalidMessage means the [Message] cannot be sent as given (no
	// sender, no recipient, an address that does not parse, no domain for
	// the Message-ID). It is returned before any I/O, inside an
	// [effects.ErrPoison] error: permanent, the same message is refused
	// again.
	ErrInvalidMessage = errors.New("email: invalid message")
)

// SMTPError is a failure of the SMTP exchange that definitely did not
// deliver the message: the server answered with an error code, or the
// connection failed before the message's data was handed over. Apply
// returns it inside an [effects.ErrTransient] error for temporary failures
// (a 4xx reply, a refused or broken connection), inside an
// [effects.ErrRefused] one for permanent ones (a 5xx reply, see
// [ErrRejected]), or inside a configuration error (a refused login, a
// refused TLS handshake). Use errors.As to reach it, and errors.As again
// for go-mail's *mail.SendError underneath.
type SMTPError struct {
	// Stage is where the exchange failed: "connect" (dial, greeting, EHLO,
	// STARTTLS, AUTH), "MAIL", "RCPT", "DATA" (the command or the transfer
	// of the message) or "end of data" (the reply to the final ".").
	Stage string
	// Code is the server's reply code, e.g. 550 or 451; 0 when the failure
	// was not a reply (a refused connection, a cut, a timeout).
	Code int
	// EnhancedCode is the server's enhanced status code, e.g. "5.1.1", when
	// it sent one.
	EnhancedCode string
	// Err is go-mail's error.
	Err error

	invalid bool // go-mail refused the message itself: ErrInvalidMessage
}

// Error describes the failure, with the mail addresses in go-mail's and
// the server's words replaced by "<address>", so that logging the error
// does not log recipients. Err keeps them.
func (e *SMTPError) Error() string {
	msg := "email: SMTP " + e.Stage + " failed"
	if e.Code != 0 {
		msg += fmt.Sprintf(" with %d", e.Code)
		if e.EnhancedCode != "" {
			msg += " " + e.EnhancedCode
		}
	}
	if e.Err != nil {
		msg += ": " + redact(e.Err.Error())
	}
	return msg
}

// addressRE matches what looks like a mail address in an error's text.
var addressRE = regexp.MustCompile(`[^\s<>()\[\]"',;:]+@[^\s<>()\[\]"',;:]+`)

// redact replaces the mail addresses in s by "<address>".
func redact(s string) string { return addressRE.ReplaceAllString(s, "<address>") }

// redacted is an error whose text has its mail addresses redacted; the
// error underneath keeps them.
type redacted struct{ err error }

func (r redacted) Error() string { return redact(r.err.Error()) }
func (r redacted) Unwrap() error { return r.err }

// Unwrap returns go-mail's error.
func (e *SMTPError) Unwrap() error { return e.Err }

// Is reports whether target is ErrRejected and the failure is permanent.
func (e *SMTPError) Is(target error) bool { return target == ErrRejected && e.Permanent() }

// Permanent reports whether the server refused with a 5xx reply.
func (e *SMTPError) Permanent() bool { return e.Code >= 500 && e.Code < 600 }

// outcome is what a failed or successful send means for the journal.
type outcome int

const (
	delivered outcome = iota + 1 // the server answered 250 to the end of DATA
	notSent                      // definitely not delivered: release the lease
	unknown                      // may be delivered: keep the record pending
)

// classify maps go-mail's result for msg onto an outcome. For notSent it
// also returns the SMTPError describing the failure.
func classify(msg *mail.Msg, err error) (outcome, *SMTPError) {
	if msg.IsDelivered() {
		// go-mail sets this right after the 250 to the final "."; a later
		// RSET or QUIT failure does not undo the delivery.
		return delivered, nil
	}
	if err == nil {
		// Not delivered and no error: go-mail skipped the message. Treat
		// it as unknown rather than guess.
		return unknown, nil
	}
	var se *mail.SendError
	if !errors.As(err, &se) {
		// DialAndSendWithContext wraps every failure of the dial phase
		// (connect, greeting, EHLO, STARTTLS, AUTH) in a plain error and
		// every later one in a *mail.SendError. No MAIL FROM was sent.
		return notSent, connectError(err)
	}
	e := &SMTPError{Code: se.ErrorCode(), EnhancedCode: se.EnhancedStatusCode(), Err: err}
	switch se.Reason {
	case mail.ErrConnCheck:
		e.Stage = "connect"
	case mail.ErrGetSender, mail.ErrGetRcpts, mail.ErrNoUnencoded:
		// go-mail refused the message before sending a command for it.
		e.Stage, e.invalid = "MAIL", true
	case mail.ErrSMTPMailFrom:
		e.Stage = "MAIL"
	case mail.ErrSMTPRcptTo:
		e.Stage = "RCPT"
	case mail.ErrSMTPData, mail.ErrWriteContent:
		// The DATA command failed, or the transfer broke before the final
		// "." was written: the server cannot have accepted the message.
		e.Stage = "DATA"
	case mail.ErrSMTPDataClose:
		// The final "." was written; only a reply code proves the server
		// refused. A broken connection or a timeout here is the trap: the
		// server may have answered 250 and kept the message.
		e.Stage = "end of data"
		if e.Code < 400 {
			return unknown, nil
		}
	default:
		return unknown, nil
	}
	return notSent, e
}

// connectError describes a failure of the dial phase (connect,
// greeting, EHLO, STARTTLS, AUTH).
func connectError(err error) *SMTPError {
	e := &SMTPError{Stage: "connect", Err: err}
	var te *textproto.Error
	if errors.As(err, &te) {
		e.Code = te.Code
		e.EnhancedCode = enhanced(te.Msg)
	}
	return e
}

var enhancedRE = regexp.MustCompile(`\b[245]\.\d{1,3}\.\d{1,3}\b`)

func enhanced(s string) string { return enhancedRE.FindString(s) }

// notSentError is the error op returns after a definite failure, in one
// class of [effects.ClassOf]: a configuration error when no retry can fix
// it (see configError), ErrInvalidMessage (poison) when go-mail refused
// the message, ErrRefused for any other 5xx, ErrTransient otherwise.
func (s *Sender) notSentError(ctx context.Context, op string, key effects.Key, e *SMTPError) error {
	if ctx.Err() != nil && e.Code == 0 {
		// The session was cut because the context ended (cancelled, or the
		// lease ran out) before anything was handed over: keep the
		// context's error reachable with errors.Is. A server's reply code
		// speaks for itself.
		e.Err = fmt.Errorf("%w (%w)", ctx.Err(), e.Err)
	}
	if cerr := s.configError(ctx, op, e); cerr != nil {
		return cerr
	}
	if e.invalid {
		return &effects.Error{Kind: effects.ErrPoison, Op: op, Key: key, Err: fmt.Errorf("%w: %w", ErrInvalidMessage, e)}
	}
	if e.Permanent() {
		return effects.Refused(op, key, e)
	}
	return effects.Transient(op, key, e)
}

// authCodes are the replies that say the Sender's authentication is wrong
// or missing: 530 authentication required, 534 mechanism too weak, 535
// credentials invalid, 538 encryption required for the mechanism.
// authEnhanced are their enhanced codes (RFC 4954), which some servers
// send with another reply code; a 5.7.0 to MAIL is also "authentication
// required" (go-smtp answers 502 5.7.0).
var (
	authCodes    = map[int]bool{530: true, 534: true, 535: true, 538: true}
	authEnhanced = map[string]bool{"5.7.8": true, "5.7.9": true, "5.7.11": true}
)

// configError returns a configuration error for a failure no retry fixes,
// and nil otherwise: a refused login or a login the server requires
// (Option names the SMTP AUTH options), STARTTLS required but not offered,
// a refused TLS handshake or a host that does not exist (Option is the
// server's address). It unwraps to a *[effects.ConfigError] and to e.
func (s *Sender) configError(ctx context.Context, op string, e *SMTPError) error {
	const auth = "WithMailOptions (SMTP AUTH: mail.WithSMTPAuth, mail.WithUsername, mail.WithPassword)"
	if authCodes[e.Code] || authEnhanced[e.EnhancedCode] || (e.Stage == "MAIL" && e.EnhancedCode == "5.7.0") {
		return fatal(op, e, auth, fmt.Sprintf("the server at %s refused the login or requires one (%d); check the credentials and the mechanism", s.addr, e.Code))
	}
	if e.Stage != "connect" || e.Code != 0 || ctx.Err() != nil || e.Err == nil {
		return nil
	}
	text := e.Err.Error()
	switch {
	case strings.Contains(text, "does not support STARTTLS"):
		return fatal(op, e, s.addr, "the server does not offer STARTTLS, which go-mail requires by default (mail.WithTLSPolicy(mail.TLSMandatory)); "+
			"use a server or port with STARTTLS, or choose mail.TLSOpportunistic or mail.NoTLS if plain text is acceptable")
	case strings.Contains(strings.ToUpper(text), "SMTP AUTH"):
		// go-mail's words for a mechanism the server does not offer, or a
		// login refused without a reply code (PLAIN over plain text).
		return fatal(op, e, auth, fmt.Sprintf("the login to %s cannot be made as configured; check the mechanism against the server's and the TLS policy", s.addr))
	}
	return effects.Misconfigured(op, s.addr, e)
}

// ambiguousError is the error Apply returns when the server may have the
// message.
func ambiguousError(ctx context.Context, key effects.Key, err error, lease string) error {
	if err == nil {
		err = errors.New("go-mail reported neither delivery nor an error")
	}
	err = redacted{err}
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return effects.Ambiguous(op, key, fmt.Errorf(
		"the message was handed to the SMTP server but its reply was not read, so the server may have it; "+
			"the sent-record stays pending: a retry within the lease (%s) gets ErrInFlight, a retry after it sends again "+
			"with the same Message-ID: %w", lease, err))
}

// fatal is the configuration error of configError: a *[effects.ConfigError]
// of op naming option, wrapping e.
func fatal(op string, e *SMTPError, option, reason string) error {
	return fmt.Errorf("%w (no retry fixes this): %w", effects.ConfigErrorf(op, option, "%s", reason), e)
}
