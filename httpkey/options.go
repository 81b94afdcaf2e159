package httpkey

import (
	"fmt"
	"net/http"
	"time"

	"effectively.dev/effects/journal"
)

// Defaults of an effect, used when no option or preset says otherwise.
const (
	// defaultKeyHeader is the header that carries the key: the IETF
	// draft's Idempotency-Key.
	defaultKeyHeader = "Idempotency-Key"
	// defaultMaxKeyLen is the longest key sent as it is ([WithMaxKeyLen]);
	// a longer one is shortened. 255 is the limit many servers document
	// (Stripe's among them) and [effects.MaxKeyLen].
	defaultMaxKeyLen = 255
	// defaultMaxBody is the longest 2xx body Apply reads ([WithMaxBody]).
	defaultMaxBody = 1 << 20
	// defaultTimeout bounds one call without a journal ([WithTimeout]).
	defaultTimeout = 30 * time.Second
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
	// Done: the request was already applied by an earlier request with
	// the key, and the response names what it created (GoCardless's 409
	// idempotent_creation_conflict with links.conflicting_resource_id).
	// Apply reports [effects.Replayed] with the reference the [Rule]'s Ref
	// reads. Only a Rule can assign it.
	Done
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
	case Done:
		return "done"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// placement is where the key goes.
type placement int

const (
	inHeader           placement = iota + 1 // the value as it is
	inStructuredHeader                      // an RFC 8941 String: "..."
	inField                                 // a member of a JSON object body
)

// Option configures an effect built by [New]. Options record a value; New
// validates them once and returns a *[effects.ConfigError] naming the
// first bad one. A nil Option is ignored. A [Provider] is an Option that
// sets several values; put it first and the options that change it after
// it.
type Option interface{ apply(*config) }

type option func(*config)

func (f option) apply(c *config) { f(c) }

type config struct {
	preset      string // the preset's name, for messages
	place       placement
	name        string   // header name
	field       []string // the JSON member's path, for inField
	keyFmt      keyFormat
	replayName  string
	replayValue string
	replayAny   bool // any non-empty value of replayName marks a replay
	horizon     time.Duration
	assumed     bool // horizon is the user's assumption (WithAssumedHorizon)
	unpublished bool // the preset's provider publishes no horizon
	failsKept   bool // the server stores failures (false: only 2xx answers)
	statuses    map[int]Outcome
	assigned    []assignment // WithStatus, in order, validated by New
	rules       []Rule
	codePath    []string // where the body holds the vendor's error code
	requestID   string   // the header that holds the request's id
	requestPath []string // or where the body holds it
	keepBody    bool
	maxBody     int64
	timeout     time.Duration
	pathOf      func(path string) string
	ref         func(*http.Response, []byte) (string, error)
	refSet      bool
	journal     journal.Journal
	jopts       []journal.Option
}

type assignment struct {
	outcome Outcome
	codes   []int
}

// WithKeyHeader sends the key in header name, as it is (no quotes): what
// most vendors document (Adyen's Idempotency-Key, PayPal's
// PayPal-Request-Id, Worldline's X-GCS-Idempotence-Key). See
// [WithMaxKeyLen] for how the key is written. The IETF draft's form, the
// key in Idempotency-Key as an RFC 8941 Structured Field String in double
// quotes, is [IETF]'s (the default).
func WithKeyHeader(name string) Option {
	return option(func(c *config) { c.place, c.name, c.field = inHeader, name, nil })
}

// WithKeyField sends the key as a string member of the request's JSON
// body, at path: WithKeyField("idempotency_key") for a top-level member
// (Square), WithKeyField("variables", "input", "apiRequestKey") for a
// member of a nested object (a Braintree GraphQL mutation's input). The
// body the request function builds must be a JSON object in which the
// objects on the path exist and the member does not; Apply adds the
// member first in its object, leaving the rest of the body as it is.
func WithKeyField(path ...string) Option {
	path = append([]string(nil), path...)
	return option(func(c *config) { c.place, c.name, c.field = inField, "", path })
}

// WithMaxKeyLen sets the longest key the server accepts, in bytes
// (default 255, the limit many servers document and [effects.MaxKeyLen];
// at least 24, room for a digest that keeps shortened keys apart). A key
// is sent as it is when it holds only printable ASCII other than '%', '"' and '\' and
// fits; otherwise the other bytes are escaped as %XX (so "café" is sent
// as "caf%C3%A9"), and an escaped key still too long is shortened to a
// prefix, "%~" and a SHA-256 digest. Distinct keys stay distinct; the
// server's form of a key is what [Effect.WireKey] returns. It replaces a
// format set by [WithKeyAlphabet] or [WithKeyUUID].
func WithMaxKeyLen(n int) Option {
	return option(func(c *config) { c.keyFmt = keyFormat{max: n} })
}

// WithKeyAlphabet writes every key with the bytes of alphabet only, in
// min to max bytes, for a server that accepts no other (RazorpayX:
// 4 to 36 of letters, digits, space, '-' and '_'). The wire key is a
// readable prefix (the key's bytes that are in the alphabet, each run of
// others as one '-' or '_' when the alphabet has one) and a digest of the
// whole key written in the alphabet, of at least 128 bits: deterministic,
// distinct for distinct keys, and never equal to another key's form
// however a key is crafted. Space and tab are accepted in alphabet but
// never written (HTTP trims them from a header's ends). [New] refuses an
// alphabet whose digest does not fit in max.
func WithKeyAlphabet(alphabet string, min, max int) Option {
	return option(func(c *config) { c.keyFmt = keyFormat{alphabet: alphabet, min: min, max: max} })
}

// WithKeyUUID writes every key as a UUID (RFC 9562 version 5, from a
// SHA-1 of the key in a namespace of this package's), for a server that
// accepts only UUIDs: deterministic, and distinct for distinct keys (122
// bits).
func WithKeyUUID() Option {
	return option(func(c *config) { c.keyFmt = keyFormat{uuid: true, max: 36} })
}

// WithReplayHeader declares the server's replay signal: a response whose
// header name equals value (ignoring case) is a stored response replayed
// for the key, and Apply reports it as [effects.Replayed] (Stripe's
// "Idempotent-Replayed: true"). With an empty value the signal is the
// header's presence: a response with a non-empty header name is a replay,
// whatever the value (Worldline's X-GCS-Idempotence-Request-Timestamp,
// which holds the first request's time). With it, the contract is
// effectively-once for the horizon; declare it only if the server sends
// it, since the conformance suite checks it. A replayed 5xx is
// [ErrReplayedServerError].
func WithReplayHeader(name, value string) Option {
	return option(func(c *config) { c.replayName, c.replayValue, c.replayAny = name, value, value == "" })
}

// WithHorizon declares how long the server keeps a key after its first
// request, from the API's documentation; it is the contract's Horizon
// without a journal. Past it a repeated request is executed again. d must
// be positive; [New] requires a horizon unless the preset documents one
// ([Adyen], [Worldline], [Checkout], [Mollie], [Braintree]). Under a
// preset whose provider publishes none ([GoCardless], [Square],
// [RazorpayX]) the horizon is an assumption, and the contract
// says so (effects.Contract.HorizonAssumed), as with
// [WithAssumedHorizon].
func WithHorizon(d time.Duration) Option {
	return option(func(c *config) { c.horizon, c.assumed = d, false })
}

// WithAssumedHorizon declares a horizon that the API does not publish:
// your estimate, or what its support told you. The contract marks it as
// assumed (effects.Contract.HorizonAssumed): unverified until a check
// against the server itself confirms it, such as the conformance suite's
// horizon scenario run against the real API's sandbox with a harness that
// can wait it out. d must be positive.
func WithAssumedHorizon(d time.Duration) Option {
	return option(func(c *config) { c.horizon, c.assumed = d, true })
}

// WithFailuresNotStored declares that the server stores only its 2xx
// answers for a key (Checkout.com): a request that failed, even with a
// 5xx after it began executing, is executed again by a retry with the
// key. With a journal the contract is then at-least-once, duplicates after
// an unknown outcome; without one it is at-least-once in any case.
func WithFailuresNotStored() Option {
	return option(func(c *config) { c.failsKept = false })
}

// WithStatus assigns the response statuses codes (each 400 to 599) to
// outcome, replacing what the preset said for them. Statuses never
// assigned are [Refused] (4xx) or [Ambiguous] (5xx). For example, for an
// API that answers a request still in progress with 425:
//
//	httpkey.WithStatus(httpkey.InFlight, 425)
func WithStatus(outcome Outcome, codes ...int) Option {
	return option(func(c *config) {
		c.assigned = append(c.assigned, assignment{outcome, append([]int(nil), codes...)})
	})
}

// WithRef sets how Apply reads the result's reference from a 2xx response
// (its body, read whole, is given too): the id of what the request
// created, kept in the journal and returned as [effects.Result].Ref on
// every replay. Without it Ref is empty. [JSONField] reads a member of a
// JSON body. A ref that cannot be read is a configuration error (the
// request was applied: a retry after the fix replays it); ref must not be
// nil.
func WithRef(ref func(resp *http.Response, body []byte) (string, error)) Option {
	return option(func(c *config) { c.ref, c.refSet = ref, true })
}

// WithErrorCode reads the vendor's error code from the member of an
// error response's JSON body at path (as [Rule].Field), into
// [ResponseError].Code, which the error's text shows. Only a short
// identifier is kept (at most 64 letters, digits and "._:/-"); anything
// else, which might carry a customer's data, is left out.
func WithErrorCode(path ...string) Option {
	path = append([]string(nil), path...)
	return option(func(c *config) { c.codePath = path })
}

// WithRequestIDHeader reads the id the vendor gives the request from the
// response header name (default X-Request-Id), into
// [ResponseError].RequestID, shown in the error's text, kept only when a
// short identifier as for [WithErrorCode].
func WithRequestIDHeader(name string) Option {
	return option(func(c *config) { c.requestID, c.requestPath = name, nil })
}

// WithRequestIDField reads the request's id from the member of an error
// response's JSON body at path (Adyen's pspReference), as
// [WithRequestIDHeader] does from a header.
func WithRequestIDField(path ...string) Option {
	path = append([]string(nil), path...)
	return option(func(c *config) { c.requestPath, c.requestID = path, "" })
}

// WithErrorBody keeps the start of an error response's body (at most 64
// KiB) in [ResponseError].Body, for code that reads what the vendor's
// error says. The body never enters the error's text; without this option
// it is not kept at all, because vendors echo the request (a card number,
// an email address) in their errors, and an error reaches logs, spans and
// dead-letter headers.
func WithErrorBody() Option {
	return option(func(c *config) { c.keepBody = true })
}

// WithMaxBody sets the longest 2xx body Apply reads (default 1 MiB); n must
// be positive. Apply reads a 2xx body only for [WithRef] and for a [Rule] on
// a member of the body, never past n+1 bytes: a longer body is a
// configuration error (raise the limit) wrapping [effects.ErrAmbiguous],
// since the request was applied and a retry after the fix replays it.
func WithMaxBody(n int64) Option {
	return option(func(c *config) { c.maxBody = n })
}

// WithTimeout bounds each call without a journal (default 30 s): a request
// with no answer by then ends with [effects.ErrAmbiguous], and the retry
// with the key resolves it. With a journal, the call ends at nine tenths of
// the lease ([journal.WithLease]) and this option does nothing. d must be
// positive; the caller's context and the client's own Timeout still apply.
func WithTimeout(d time.Duration) Option {
	return option(func(c *config) { c.timeout = d })
}

// WithPathTemplate sets how the journal's fingerprint of a request reads
// its URL path: the fingerprint covers the method, path(u.Path) and the
// body, which is what most providers scope a key to, and never the host,
// the query or the headers. The default writes every segment that names
// an API version ("v70", "v2.1", "2024-06-01") as "{version}", so that
// /checkout/v70/payments and /checkout/v71/payments are one path and an API
// version bump between a request and its redelivery is not taken for a
// key reused with another payload. Use func(p string) string { return p }
// for a provider whose keys are scoped to the versioned path.
func WithPathTemplate(path func(p string) string) Option {
	return option(func(c *config) { c.pathOf = path })
}

// WithJournal makes the effect keep every response's reference in j and
// replay it from there without calling the server, however old it is:
// the contract becomes effectively-once with Horizon 0 (until j prunes),
// and Apply reports replays even when the server gives no replay signal.
// opts set the journal's lease, record timeout, observer and logger
// ([journal.WithLease], [journal.WithRecordTimeout], ...); the request
// ends at nine tenths of the lease. The journal runs
// [journal.Journaled]'s protocol and policy; see the package doc for how
// it and the server's key overlap.
func WithJournal(j journal.Journal, opts ...journal.Option) Option {
	return option(func(c *config) { c.journal, c.jopts = j, opts })
}
