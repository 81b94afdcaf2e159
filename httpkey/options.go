package httpkey

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
)

// Defaults of an effect, used when no option or preset says otherwise.
const (
	// DefaultKeyHeader is the header that carries the key: the IETF
	// draft's Idempotency-Key.
	DefaultKeyHeader = "Idempotency-Key"
	// DefaultMaxKeyLen is the longest key sent as it is ([WithMaxKeyLen]);
	// a longer one is shortened. 255 is the limit many servers document
	// (Stripe's among them) and [effects.MaxKeyLen].
	DefaultMaxKeyLen = 255
)

// Outcome is what a response status means for the request that got it: a
// class of [effects.ClassOf], named for an idempotency-keyed API. Assign
// statuses to outcomes with [WithStatus].
type Outcome int

const (
	// InFlight: another request with the key is being processed (the
	// draft's 409). [effects.ErrInFlight], retryable: retry later with the
	// same key and get that request's response.
	InFlight Outcome = iota + 1
	// KeyReused: the key was used with another payload (the draft's 422).
	// [effects.ErrKeyReused], permanent.
	KeyReused
	// Refused: the server refused the request for good (a decline, a
	// failed validation). [effects.ErrRefused], permanent.
	Refused
	// Transient: the server answered before doing anything (a rate
	// limit). [effects.ErrTransient], retryable; the promise that nothing
	// was applied is the server's.
	Transient
	// Ambiguous: the request may have been applied (a 5xx).
	// [effects.ErrAmbiguous], retryable with the same key.
	Ambiguous
	// Misconfigured: the credentials or the endpoint are wrong (401, 403).
	// A *[effects.ConfigError]: stop the worker, fix the configuration.
	Misconfigured
)

// String names the outcome.
func (o Outcome) String() string {
	switch o {
	case InFlight:
		return "in flight"
	case KeyReused:
		return "key reused"
	case Refused:
		return "refused"
	case Transient:
		return "transient"
	case Ambiguous:
		return "ambiguous"
	case Misconfigured:
		return "misconfigured"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// ietfStatuses are the outcomes of the statuses the IETF draft names, and
// of those whose meaning HTTP fixes; a status not listed is Refused (4xx)
// or Ambiguous (5xx).
func ietfStatuses() map[int]Outcome {
	return map[int]Outcome{
		http.StatusUnauthorized:        Misconfigured,
		http.StatusForbidden:           Misconfigured,
		http.StatusRequestTimeout:      Transient, // the server gave up waiting for the request
		http.StatusConflict:            InFlight,
		http.StatusUnprocessableEntity: KeyReused,
		http.StatusTooManyRequests:     Transient,
	}
}

// placement is where the key goes.
type placement int

const (
	inHeader           placement = iota + 1 // the value as it is
	inStructuredHeader                      // an RFC 8941 String: "..."
	inField                                 // a top-level member of a JSON object body
)

// Option configures an effect built by [New]. Options record a value; New
// validates them once and returns a *[effects.ConfigError] naming the
// first bad one. A nil Option is ignored. Presets ([IETF], [Adyen],
// [PayPal], [Worldline]) are Options that set several values; put a preset first and
// the options that change it after it.
type Option func(*config)

type config struct {
	place       placement
	name        string // header or field name
	maxKeyLen   int
	replayName  string
	replayValue string
	replayAny   bool // any non-empty value of replayName marks a replay
	horizon     time.Duration
	statuses    map[int]Outcome
	assigned    []assignment // WithStatus, in order, validated by New
	ref         func(*http.Response, []byte) (string, error)
	refSet      bool
	journal     journal.Journal
	lease       time.Duration
	logger      *slog.Logger
	loggerSet   bool
	observer    effects.Observer
}

type assignment struct {
	outcome Outcome
	codes   []int
}

func defaults() config {
	c := config{lease: journal.DefaultLease}
	IETF()(&c)
	return c
}

// IETF is the scheme of the IETF draft "The Idempotency-Key HTTP Header
// Field" (draft-ietf-httpapi-idempotency-key-header-07,
// https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/),
// which is also what [New] does without a preset: the key in the
// Idempotency-Key header as a Structured Field String (in quotes); 409
// means the key's first request is still being processed ([InFlight]),
// 422 that the key was used with another payload ([KeyReused]); 401 and
// 403 are [Misconfigured], 408 and 429 [Transient], any other 4xx
// [Refused] and any 5xx [Ambiguous]. The draft defines no replay signal
// and leaves the key's expiry to each server, which should publish it, so
// IETF sets neither: give the server's horizon with [WithHorizon], and a
// replay header with [WithReplayHeader] if the server sends one.
func IETF() Option {
	return func(c *config) {
		c.place, c.name = inStructuredHeader, DefaultKeyHeader
		c.maxKeyLen = DefaultMaxKeyLen
		c.replayName, c.replayValue, c.replayAny = "", "", false
		c.statuses = ietfStatuses()
		c.assigned = nil
	}
}

// AdyenHorizon is how long Adyen keeps an idempotency key: at least 31
// days after its first submission, by Adyen's documentation.
const AdyenHorizon = 31 * 24 * time.Hour

// Adyen is Adyen's convention, from "API idempotency"
// (https://docs.adyen.com/development-resources/api-idempotency): the key
// in the Idempotency-Key header as it is, at most 64 characters (longer
// keys are shortened, see [WithMaxKeyLen]); a request repeated with the
// key gets the response to the first attempt; keys are valid for at least
// 31 days after the first submission ([AdyenHorizon]).
//
// The page names no replay signal (the Idempotency-Key header that Adyen
// returns tells that the request was processed idempotently, not that it
// was a replay), so Apply reports every success as Applied and, without a
// journal, the contract is at-least-once (see the package doc). Nor does
// it name the status of a concurrent request or of a key reused with
// another payload: the preset keeps 409 as [InFlight] and maps 422 to
// [Refused], because Adyen's error reference
// (https://docs.adyen.com/errors/unprocessable-entity) answers 422 when
// it cannot process the information in the request. Adyen scopes keys to
// the company account and does not check them across regional endpoints:
// send a key to one region only.
func Adyen() Option {
	return func(c *config) {
		c.place, c.name = inHeader, "Idempotency-Key"
		c.maxKeyLen = 64
		c.replayName, c.replayValue, c.replayAny = "", "", false
		c.horizon = AdyenHorizon
		c.statuses = ietfStatuses()
		c.statuses[http.StatusUnprocessableEntity] = Refused
		c.assigned = nil
	}
}

// PayPal is PayPal's convention, from "Idempotency"
// (https://developer.paypal.com/api/rest/reference/idempotency/): the key
// in the PayPal-Request-Id header as it is; a request repeated with the
// key gets the latest status of the first request; calls that failed with
// a timeout or a 5xx may be retried with the key for as long as the
// server stores it. How long that is differs between PayPal's APIs ("see
// the reference for your API"), so PayPal sets no horizon: [New] requires
// [WithHorizon] with the value your API's reference gives. Not every
// PayPal API supports the header; check yours.
//
// The page names no replay signal and no answer to a key reused with
// another payload, so without a journal the contract is at-least-once and
// does not detect key reuse (see the package doc). It says that of two
// simultaneous requests with one key the second "might fail", without a
// status: the preset keeps 409 as [InFlight]. PayPal's "API responses"
// (https://developer.paypal.com/api/rest/responses/) uses 422
// UNPROCESSABLE_ENTITY for a request that fails business validation, so
// the preset maps 422 to [Refused].
func PayPal() Option {
	return func(c *config) {
		c.place, c.name = inHeader, "PayPal-Request-Id"
		c.maxKeyLen = DefaultMaxKeyLen
		c.replayName, c.replayValue, c.replayAny = "", "", false
		c.statuses = ietfStatuses()
		c.statuses[http.StatusUnprocessableEntity] = Refused
		c.assigned = nil
	}
}

// WorldlineHorizon is how long Worldline Direct keeps an idempotency key:
// at least 24 hours, by Worldline's documentation.
const WorldlineHorizon = 24 * time.Hour

// WorldlineReplayHeader is the header Worldline Direct adds to every
// response to a request that repeats a key (its value is the time of the
// first request).
const WorldlineReplayHeader = "X-GCS-Idempotence-Request-Timestamp"

// Worldline is Worldline Direct's convention, from "Idempotent requests"
// (https://docs.direct.worldline-solutions.com/en/integration/api-developer-guide/idempotent-requests):
// the key in the X-GCS-Idempotence-Key header as it is, at most 40
// characters of ASCII (longer keys are shortened, non-ASCII bytes escaped,
// see [WithMaxKeyLen]); keys kept for at least 24 hours
// ([WorldlineHorizon]); a repeat of a finished request gets the same
// response, and one while the first request is in progress gets 409
// ([InFlight]). Every response to a repeat carries
// X-GCS-Idempotence-Request-Timestamp ([WorldlineReplayHeader]), the
// replay signal ([WithReplayHeaderPresent]), so the contract is
// effectively-once for 24 hours without a journal.
//
// The documentation says that a repeat gets the first response "even with
// different payloads": Worldline does not detect a reused key, so the
// preset maps 422 to [Refused] and the contract does not claim
// DetectsKeyReuse (a journal adds it). It also says that information in a
// replayed response, such as a payment's status, may be updated: the ref
// (the payment's id) is the same, the rest of the body may not be.
func Worldline() Option {
	return func(c *config) {
		c.place, c.name = inHeader, "X-GCS-Idempotence-Key"
		c.maxKeyLen = 40
		c.replayName, c.replayValue, c.replayAny = WorldlineReplayHeader, "", true
		c.horizon = WorldlineHorizon
		c.statuses = ietfStatuses()
		c.statuses[http.StatusUnprocessableEntity] = Refused
		c.assigned = nil
	}
}

// WithKeyHeader sends the key in header name, as it is (no quotes): what
// most vendors document (Adyen's Idempotency-Key, PayPal's
// PayPal-Request-Id, Worldline's X-GCS-Idempotence-Key). See
// [WithMaxKeyLen] for how the key is written.
func WithKeyHeader(name string) Option {
	return func(c *config) { c.place, c.name = inHeader, name }
}

// WithKeyStructuredHeader sends the key in header name as an RFC 8941
// Structured Field String, in double quotes, as the IETF draft specifies
// for Idempotency-Key ([IETF] uses it).
func WithKeyStructuredHeader(name string) Option {
	return func(c *config) { c.place, c.name = inStructuredHeader, name }
}

// WithKeyField sends the key as the string member name of the request's
// JSON body, for APIs that take the key in the body (Square's
// idempotency_key). The body the request function builds must be a JSON
// object without that member; Apply adds it first, leaving the rest of the
// body as it is.
func WithKeyField(name string) Option {
	return func(c *config) { c.place, c.name = inField, name }
}

// WithMaxKeyLen sets the longest key the server accepts, in bytes
// (default [DefaultMaxKeyLen], at least [MinKeyLen]). A key is sent as it
// is when it holds only printable ASCII other than '%', '"' and '\' and
// fits; otherwise the other bytes are escaped as %XX (so "café" is sent
// as "caf%C3%A9"), and an escaped key still too long is shortened to a
// prefix, "%~" and a SHA-256 digest. Distinct keys stay distinct; the
// server's form of a key is what [Effect.WireKey] returns.
func WithMaxKeyLen(n int) Option {
	return func(c *config) { c.maxKeyLen = n }
}

// WithReplayHeader declares the server's replay signal: a response whose
// header name equals value (ignoring case) is a stored response replayed
// for the key, and Apply reports it as [effects.Replayed] (Stripe's
// "Idempotent-Replayed: true"). With it, the contract is effectively-once
// for the horizon; declare it only if the server sends it, since the
// conformance suite checks it. A replayed 5xx is
// [ErrReplayedServerError].
func WithReplayHeader(name, value string) Option {
	return func(c *config) { c.replayName, c.replayValue, c.replayAny = name, value, false }
}

// WithReplayHeaderPresent declares a replay signal that is a header's
// presence: a response with a non-empty header name is a stored response
// replayed for the key, whatever the value (Worldline's
// X-GCS-Idempotence-Request-Timestamp, which holds the first request's
// time). Otherwise as [WithReplayHeader].
func WithReplayHeaderPresent(name string) Option {
	return func(c *config) { c.replayName, c.replayValue, c.replayAny = name, "", true }
}

// WithHorizon declares how long the server keeps a key after its first
// request, from the API's documentation; it is the contract's Horizon
// without a journal. Past it a repeated request is executed again. d must
// be positive; [New] requires it unless the preset documents it
// ([Adyen], [Worldline]).
func WithHorizon(d time.Duration) Option {
	return func(c *config) { c.horizon = d }
}

// WithStatus assigns the response statuses codes (each 400 to 599) to
// outcome, replacing what the preset said for them. Statuses never
// assigned are [Refused] (4xx) or [Ambiguous] (5xx). For example, for an
// API that answers a request still in progress with 425:
//
//	httpkey.WithStatus(httpkey.InFlight, 425)
func WithStatus(outcome Outcome, codes ...int) Option {
	return func(c *config) {
		c.assigned = append(c.assigned, assignment{outcome, append([]int(nil), codes...)})
	}
}

// WithRef sets how Apply reads the result's reference from a 2xx response
// (its body, read whole, is given too): the id of what the request
// created, kept in the journal and returned as [effects.Result].Ref on
// every replay. Without it Ref is empty. [JSONField] reads a member of a
// JSON body. A ref that cannot be read is a configuration error (the
// request was applied: a retry after the fix replays it); ref must not be
// nil.
func WithRef(ref func(resp *http.Response, body []byte) (string, error)) Option {
	return func(c *config) { c.ref, c.refSet = ref, true }
}

// WithJournal makes the effect keep every response's reference in j and
// replay it from there without calling the server, however old it is:
// the contract becomes effectively-once with Horizon 0 (until j prunes),
// and Apply reports replays even when the server gives no replay signal.
// The journal runs [journal.Journaled]'s protocol and policy; see the
// package doc for how it and the server's key overlap.
func WithJournal(j journal.Journal) Option {
	return func(c *config) { c.journal = j }
}

// WithLease sets how long one attempt holds its key in the journal
// (default [journal.DefaultLease]); the request ends at nine tenths of it.
// When the journal's lease gates the call (see the package doc), a retry
// after an unknown outcome waits for the lease to end. Without
// [WithJournal] it does nothing. d must be positive.
func WithLease(d time.Duration) Option {
	return func(c *config) { c.lease = d }
}

// WithLogger sets where the effect reports what it cannot return (a
// response the journal did not record); the default is slog.Default() at
// the time of the event. l must not be nil.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger, c.loggerSet = l, true }
}

// WithObserver sends what the effect cannot return to o as events, in
// place of log lines: [effects.EventFailed] for a response the journal did not record and for a lease it
// could not release, [effects.EventInFlight] when another attempt holds
// the key's lease (see [journal.WithObserver]). Without it (or with a nil
// o) the failures go to the logger ([WithLogger]), rate-limited.
func WithObserver(o effects.Observer) Option {
	return func(c *config) { c.observer = o }
}
