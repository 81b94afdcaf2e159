package httpkey

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrReplayedServerError means the server answered with a 5xx that it had
// stored for the key earlier and now replays (its replay signal said so):
// the outcome of the first request is unknown, and retrying the key
// cannot resolve it while the server keeps the key; a retry after that
// executes again and may duplicate. Apply returns it under
// [effects.ErrPoison], so it is permanent: dead-letter the message and
// reconcile with the server (its dashboard, a search by your own
// reference). The *[ResponseError] is reachable with errors.As.
var ErrReplayedServerError = errors.New("the server replayed a stored server error for this idempotency key; " +
	"the outcome is unknown and retrying the key cannot resolve it: reconcile")

// maxErrorBody is how much of an error response's body a *ResponseError
// keeps.
const maxErrorBody = 64 << 10

// ResponseError is a response whose status is not 2xx, or a 2xx that a
// [Rule] made an error. Apply returns it wrapped in the error of its
// [Outcome] (an *effects.Error whose Kind is ErrInFlight, ErrKeyReused,
// ErrRefused, ErrTransient or ErrAmbiguous, or an *effects.ConfigError),
// so errors.Is tells the class and errors.As reaches the response.
type ResponseError struct {
	// StatusCode is the response's status, e.g. 402.
	StatusCode int
	// Header is the response's header.
	Header http.Header
	// Code is the vendor's error code, where [WithErrorCode] (or the
	// preset) says the body holds it, when it is a short identifier.
	Code string
	// RequestID is the id the vendor gave the request
	// ([WithRequestIDHeader], [WithRequestIDField]), to quote to its
	// support, when it is a short identifier.
	RequestID string
	// Body is the start of the response's body (at most 64 KiB), kept
	// only with [WithErrorBody]; nil otherwise. It never enters Error.
	Body []byte
	// Replayed reports whether the server's replay signal marked the
	// response as the stored answer to an earlier request with the key.
	Replayed bool
}

// Error gives the status, the vendor's error code and the request's id,
// never the body, which may hold a customer's data.
func (e *ResponseError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	if e.Replayed {
		b.WriteString(" (replayed: the server stored this answer for the key)")
	}
	if e.Code != "" {
		fmt.Fprintf(&b, ", error code %q", e.Code)
	}
	if e.RequestID != "" {
		fmt.Fprintf(&b, ", request id %q", e.RequestID)
	}
	return b.String()
}

// retryAfter reads a Retry-After header (seconds, or an HTTP date) as a
// duration from now; 0 when there is none or it has passed.
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		if secs > 0 {
			return time.Duration(secs) * time.Second
		}
		return 0
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
