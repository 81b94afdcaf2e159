package stripe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	stripego "github.com/stripe/stripe-go/v76"

	"effectively.dev/effects"
)

// configCodes are Stripe error codes that say the API key or the account
// it belongs to cannot make the request, whatever the request: fixing the
// configuration is the only remedy.
var configCodes = map[stripego.ErrorCode]bool{
	stripego.ErrorCodeAPIKeyExpired:         true,
	stripego.ErrorCodePlatformAPIKeyExpired: true,
	stripego.ErrorCodeSecretKeyRequired:     true,
	stripego.ErrorCodeLivemodeMismatch:      true,
	stripego.ErrorCodeTestmodeChargesOnly:   true,
}

// classify maps a stripe-go error to the effects error classes: every
// error it returns is retryable, permanent or a configuration error
// ([effects.ClassOf]), and none carries stripe-go's raw JSON in its text
// (see [summary]).
func (e *effect) classify(ctx context.Context, key effects.Key, err error) error {
	var se *stripego.Error
	if !errors.As(err, &se) {
		return e.classifyTransport(ctx, key, err)
	}
	sum := &summary{err: se}
	replayed := se.LastResponse != nil && se.LastResponse.Header.Get(replayedHeader) == "true"
	retryHint := ""
	if se.LastResponse != nil {
		retryHint = se.LastResponse.Header.Get("Stripe-Should-Retry")
	}
	status := se.HTTPStatusCode
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden || configCodes[se.Code]:
		return keyError(e.op, sum)
	case se.Type == stripego.ErrorTypeIdempotency:
		return &effects.Error{Kind: effects.ErrKeyReused, Op: e.op, Key: key, Err: sum}
	case status == http.StatusConflict && se.Code == stripego.ErrorCodeIdempotencyKeyInUse:
		return &effects.Error{Kind: effects.ErrInFlight, Op: e.op, Key: key, Err: sum}
	case status >= 500 && replayed:
		// No retry of the key can tell what the first request did while
		// Stripe keeps the key: a delivery no retry can handle.
		return &effects.Error{Kind: effects.ErrPoison, Op: e.op, Key: key, Err: &replayedError{sum: sum}}
	case status >= 500:
		return effects.Ambiguous(e.op, key, sum)
	case status == http.StatusTooManyRequests, status == http.StatusConflict, retryHint == "true" && !replayed:
		return &effects.Error{Kind: effects.ErrTransient, Op: e.op, Key: key, Err: sum, RetryAfter: retryAfter(se.LastResponse)}
	}
	return &RequestError{Op: e.op, Key: key, Err: se}
}

// classifyTransport classifies a failure without a Stripe-shaped answer: a
// transport error, a cancelled context or an undecodable body (a proxy's
// 502 page). A TLS handshake that was refused, a host that does not exist
// or a backend URL that is not http(s) is a configuration error; otherwise
// only a connection that was never made proves that nothing was sent.
// When ctx has ended, the error wraps ctx's error too, whichever of the
// two the HTTP client saw first.
func (e *effect) classifyTransport(ctx context.Context, key effects.Key, err error) error {
	if cerr := backendError(e.op, err); cerr != nil {
		return cerr
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w (%w)", err, cerr)
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return effects.Transient(e.op, key, err)
	}
	return effects.Ambiguous(e.op, key, err)
}

// backendError returns the configuration error for a transport failure no
// retry fixes (the backend URL is not http(s), the host does not exist, the
// TLS handshake was refused), and nil otherwise.
func backendError(op string, err error) error {
	endpoint := "Stripe API endpoint"
	var ue *url.Error
	if errors.As(err, &ue) {
		u, perr := url.Parse(ue.URL)
		if perr == nil {
			endpoint = u.Scheme + "://" + u.Host
		}
		if ue.Op == "parse" || perr != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			// The request was never built: the backend URL is wrong.
			return fmt.Errorf("%w: %w", &effects.ConfigError{Op: op, Option: "backend URL " + ue.URL,
				Reason: "not an http:// or https:// URL (no retry fixes this)"}, err)
		}
	}
	return effects.Misconfigured(op, endpoint, err)
}

// keyError is the configuration error for a Stripe answer that refuses the
// API key itself (401, 403, an expired or wrong-mode key): no request
// with it succeeds until the key is fixed. It unwraps to the summary, and
// through it to stripe-go's *stripe.Error.
func keyError(op string, sum *summary) error {
	var reason string
	switch se := sum.err; {
	case se.HTTPStatusCode == http.StatusUnauthorized:
		reason = "Stripe refused the key (HTTP 401): it is invalid, expired or was rolled; give client.New a current secret key"
	case se.HTTPStatusCode == http.StatusForbidden:
		reason = "Stripe refused the key for this request (HTTP 403): a restricted key without the permission, or an account it cannot act for; grant the permission or use another key"
	default:
		reason = fmt.Sprintf("Stripe refused the key for this account (%s); give client.New a key for the right account and mode", se.Code)
	}
	return fmt.Errorf("%w: %w", &effects.ConfigError{Op: op, Option: "API key", Reason: reason + " (no retry fixes this)"}, sum)
}

// retryAfter reads a Retry-After header (seconds, or an HTTP date) from
// Stripe's answer; 0 when there is none.
func retryAfter(resp *stripego.APIResponse) time.Duration {
	if resp == nil {
		return 0
	}
	v := strings.TrimSpace(resp.Header.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil {
		return max(time.Duration(n)*time.Second, 0)
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// summary is what this package says of a *stripe.Error: its HTTP status,
// type, code, decline code, parameter and request id. stripe-go's own
// Error() is the error's whole JSON (the message, which may quote what
// the customer typed, and the PaymentIntent), which does not belong in a
// log line; the *stripe.Error stays reachable with errors.As.
type summary struct{ err *stripego.Error }

// Error summarizes the Stripe error, e.g. "stripe: HTTP 402
// card_error/card_declined/insufficient_funds (request req_123)".
func (s *summary) Error() string { return "stripe: " + describe(s.err) }

// Unwrap returns stripe-go's error.
func (s *summary) Unwrap() error { return s.err }

// describe is the summary of se without a prefix.
func describe(se *stripego.Error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP %d %s", se.HTTPStatusCode, se.Type)
	if se.Code != "" {
		b.WriteString("/" + string(se.Code))
	}
	if se.DeclineCode != "" {
		b.WriteString("/" + string(se.DeclineCode))
	}
	if se.Param != "" {
		b.WriteString(", parameter " + se.Param)
	}
	if se.RequestID != "" {
		b.WriteString(" (request " + se.RequestID + ")")
	}
	return b.String()
}

// replayedError is a 5xx that Stripe replayed for the key: it matches
// [ErrReplayedServerError] and unwraps to the summary.
type replayedError struct{ sum *summary }

func (e *replayedError) Error() string { return ErrReplayedServerError.Error() + ": " + e.sum.Error() }

func (e *replayedError) Unwrap() []error { return []error{ErrReplayedServerError, e.sum} }

// RequestError is Stripe's definite refusal of a request, which retrying
// the same key cannot change: a card decline (402 card_error), an invalid
// request (400 invalid_request_error: a missing parameter, an unknown
// customer, a refund of more than is left). It matches
// [effects.ErrRefused] with errors.Is, so it is in class [effects.Permanent]:
// a consumer dead-letters it at the first attempt. Stripe stores a
// decline under the key and replays it; a validation failure is not
// stored, so a corrected request may reuse the key.
//
// Err is stripe-go's *stripe.Error, also reachable with errors.As (and
// through it *stripe.CardError and the other typed errors); its Type,
// Code, DeclineCode and Msg say what happened. Error() summarizes it
// without Stripe's message, which may quote what the customer typed.
type RequestError struct {
	// Op names the operation, e.g. "stripe.PaymentIntents.Apply".
	Op string
	// Key is the idempotency key of the request.
	Key effects.Key
	// Err is stripe-go's error.
	Err *stripego.Error
}

// Error says what Stripe refused: status, type, code, decline code,
// parameter and request id.
func (e *RequestError) Error() string {
	msg := fmt.Sprintf("%s key %q: stripe refused the request: %s", e.Op, e.Key, describe(e.Err))
	if e.Err.LastResponse != nil && e.Err.LastResponse.Header.Get(replayedHeader) == "true" {
		msg += " (replayed: Stripe stored this answer for the key; a corrected request needs another key)"
	}
	return msg
}

// Is reports whether target is [effects.ErrRefused].
func (e *RequestError) Is(target error) bool { return target == effects.ErrRefused }

// Unwrap returns stripe-go's error.
func (e *RequestError) Unwrap() error { return e.Err }
