package httpkey

import (
	"net/http"
	"time"
)

// Provider is one API's idempotency-key convention, from its public
// documentation: where the key goes and its format, what each answer
// means, the replay signal and the horizon the provider publishes. A
// Provider is an [Option]: give it to [New] before the options that adjust
// it (an option given before it is reset by it, except a horizon where the
// provider publishes none). [IETF] and the vendors' values ([Adyen],
// [PayPal], [Worldline], [Checkout], [GoCardless], [Mollie], [Square],
// [RazorpayX], [Braintree]) are the providers this package knows;
// [Neutral] is the base for any other.
type Provider struct {
	horizon time.Duration // published; 0: none
	set     func(c *config)
}

func (p Provider) apply(c *config) { p.set(c) }

// Horizon returns how long the provider keeps a key by its documentation
// (the shortest it has published), 0 when it publishes none.
func (p Provider) Horizon() time.Duration { return p.horizon }

// String returns the provider's name as this package spells its value:
// "IETF", "Neutral", "Adyen", "PayPal", "Worldline", "Checkout",
// "GoCardless", "Mollie", "Square", "RazorpayX" or "Braintree"; "" for the
// zero Provider.
func (p Provider) String() string {
	if p.set == nil {
		return ""
	}
	var c config
	p.set(&c)
	return c.preset
}

// The providers this package knows.
var (
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
	IETF = Provider{0, presetIETF}

	// Neutral is the base for a vendor without a preset, claiming nothing the
	// vendor has not said: the key in the Idempotency-Key header as it is, at
	// most 255 bytes; no replay signal; no status that means a reused key
	// (422 is [Refused], as every 4xx but these: 409 [InFlight], since a
	// retry with the key is harmless whatever the 409 meant; 401 and 403
	// [Misconfigured]; 408 and 429 [Transient]); any 5xx [Ambiguous]; and no
	// horizon: [New] requires one, [WithHorizon] with the retention the vendor
	// publishes, or [WithAssumedHorizon] with your estimate where it publishes
	// none, which the contract marks as assumed
	// (effects.Contract.HorizonAssumed). Add what the vendor documents: its header
	// ([WithKeyHeader]) or body member ([WithKeyField]), key format
	// ([WithMaxKeyLen], [WithKeyAlphabet], [WithKeyUUID]), replay signal
	// ([WithReplayHeader]), reuse status ([WithStatus]) or error code
	// ([WithRule]). The contract follows from what is set, and nothing else.
	Neutral = Provider{0, presetNeutral}

	// Adyen is Adyen's convention, from "API idempotency"
	// (https://docs.adyen.com/development-resources/api-idempotency): the key
	// in the Idempotency-Key header as it is, at most 64 characters (longer
	// keys are shortened, see [WithMaxKeyLen]); a request repeated with the
	// key gets the response to the first attempt; keys are kept for at least
	// 7 days ([Provider.Horizon]; Adyen has said "a minimum of 7 days" and
	// "a minimum of 31 days" over time) after the first submission, at the company account
	// level, and not checked across regional endpoints (send a key to one
	// region only).
	//
	// A request while the key's first one is still in progress gets HTTP 422
	// or 409 with errorCode "704" and the header "transient-error: true",
	// which means retry with the same key: the preset's rules make either
	// sign [InFlight]. Any other 422 is [Refused] (Adyen's "Unprocessable
	// Entity", https://docs.adyen.com/development-resources/response-handling),
	// any other 409 [InFlight]. The page names no replay signal (the
	// Idempotency-Key header Adyen returns is on every response) and no answer
	// to a key reused with another payload, so Apply reports every success as
	// Applied and, without a journal, the contract is at-least-once and does
	// not detect key reuse. Errors carry Adyen's errorCode and pspReference.
	Adyen = Provider{adyenHorizon, presetAdyen}

	// PayPal is PayPal's convention, from "Idempotency"
	// (https://developer.paypal.com/api/rest/reference/idempotency/) and the
	// Orders v2 reference
	// (https://developer.paypal.com/docs/api/orders/v2/#orders_create): the
	// key in the PayPal-Request-Id header as it is, 1 to 108 characters
	// (longer keys are shortened); a request repeated with
	// the key gets the latest status of the first request; calls that failed
	// with a timeout or a 5xx may be retried with the key for as long as the
	// server stores it. How long that is differs between PayPal's APIs (6
	// hours to 45 days; "see the reference for your API"), so PayPal sets no
	// horizon: [New] requires [WithHorizon] with the value your API's
	// reference gives.
	//
	// The page names no replay signal and no answer to a key reused with
	// another payload, so without a journal the contract is at-least-once and
	// does not detect key reuse (see the package doc). Of two simultaneous
	// requests with one key the second "might fail", without a status: the
	// preset keeps 409 as [InFlight]. PayPal's "API responses"
	// (https://developer.paypal.com/api/rest/responses/) uses 422
	// UNPROCESSABLE_ENTITY for a request that fails business validation, so
	// 422 is [Refused]. Errors carry PayPal's error name and Paypal-Debug-Id.
	PayPal = Provider{0, presetPayPal}

	// Worldline is Worldline Direct's convention, from "Idempotent requests"
	// (https://docs.direct.worldline-solutions.com/en/integration/api-developer-guide/idempotent-requests):
	// the key in the X-GCS-Idempotence-Key header as it is, at most 40
	// characters of ASCII (longer keys are shortened, non-ASCII bytes escaped,
	// see [WithMaxKeyLen]); keys kept for at least 24 hours
	//; a repeat of a finished request gets the same
	// response, and one while the first request is in progress gets 409
	// ([InFlight]). Every response to a repeat carries
	// X-GCS-Idempotence-Request-Timestamp, the
	// replay signal (its presence: [WithReplayHeader] with an empty value), so the contract is
	// effectively-once for 24 hours without a journal.
	//
	// The documentation says that a repeat gets the first response "even with
	// different payloads": Worldline does not detect a reused key, so the
	// preset maps 422 to [Refused] and the contract does not claim
	// DetectsKeyReuse (a journal adds it). It also says that information in a
	// replayed response, such as a payment's status, may be updated: the ref
	// (the payment's id) is the same, the rest of the body may not be.
	Worldline = Provider{worldlineHorizon, presetWorldline}

	// Checkout is Checkout.com's convention, from "Idempotency"
	// (https://www.checkout.com/docs/payments/manage-payments/idempotency):
	// the key in the Cko-Idempotency-Key header as it is; keys kept for 24
	// hours by default (an account manager can change the
	// window, then give it with [WithHorizon]); concurrent requests with one
	// key get 409 ([InFlight]). Only a 2xx answer is stored: after a 4xx or
	// 5xx a repeat is executed again ([WithFailuresNotStored]), so a 5xx that
	// followed a payment's creation is duplicated by its retry, and the
	// contract says so (at-least-once after an unknown outcome with a
	// journal). The page names no replay signal and no answer to a key reused
	// with another payload: without a journal the contract is at-least-once,
	// and 422 (Checkout's validation error) is [Refused]. Errors carry
	// Checkout's error_type and Cko-Request-Id.
	Checkout = Provider{checkoutHorizon, presetCheckout}

	// GoCardless is GoCardless's convention, from "Idempotency keys" in the
	// API reference (https://developer.gocardless.com/api-reference/#making-requests-idempotency-keys)
	// and "Safely retrying API requests" (https://gocardless.com/blog/idempotency-keys):
	// the key in the Idempotency-Key header as it is. A repeat of a finished
	// creation gets 409 with the error reason idempotent_creation_conflict and
	// links.conflicting_resource_id, the id of what the first request
	// created: the preset makes a 409 that names a conflicting resource
	// [Done], a replay whose Ref is that id, so
	// use a [WithRef] that reads the same id from a 2xx (e.g.
	// JSONField("payments", "id")). That is the replay signal: the contract
	// is effectively-once for the horizon. Any other 409 is [InFlight]; 422
	// (validation_failed) is [Refused]. GoCardless publishes no retention for
	// keys: [New] requires [WithHorizon], and the contract marks it as
	// assumed. It documents no answer to a key reused with another payload,
	// so the contract does not detect key reuse (a journal adds it). Errors
	// carry the first error's reason and the request_id.
	GoCardless = Provider{0, presetGoCardless}

	// Mollie is Mollie's convention, from "API idempotency"
	// (https://docs.mollie.com/reference/api-idempotency): the key in the
	// Idempotency-Key header as it is; kept for 24 hours; a
	// repeat of a finished request gets the stored response with the header
	// "Idempotent-Replayed: true", the replay signal, so the contract is
	// effectively-once for 24 hours; a repeat while the first request is in
	// progress gets 409 ([InFlight]); the key with another payload gets 400,
	// which the preset maps to [KeyReused] (Mollie answers a request that
	// fails validation with 422, [Refused]).
	Mollie = Provider{mollieHorizon, presetMollie}

	// Square is Square's convention, from "Idempotency"
	// (https://developer.squareup.com/docs/working-with-apis/idempotency):
	// the key in the JSON body's idempotency_key member, at most 45
	// characters (longer keys are shortened); a repeat
	// gets the first successful response; the key with another payload gets
	// an error whose code is IDEMPOTENCY_KEY_REUSED, which a rule makes
	// [KeyReused] at any status. Square documents neither a retention for
	// keys ([New] requires [WithHorizon], marked as assumed), nor an answer
	// to a request in progress (409 stays [InFlight]), nor a replay signal:
	// without a journal the contract is at-least-once. Errors carry the
	// first error's code.
	Square = Provider{0, presetSquare}

	// RazorpayX is RazorpayX's convention for payouts, from "Make a Request
	// Idempotent" (https://razorpay.com/docs/api/x/payout-idempotency/make-request):
	// the key in the X-Payout-Idempotency header, 4 to 36 characters of
	// letters, digits, space, '-' and '_' (every key is written so, see
	// [WithKeyAlphabet]);
	// the saved response to the first request answers a repeat; a repeat with
	// another payload "will be rejected as a BAD_REQUEST", a 400 that the
	// preset's rules make [KeyReused] when its error names the idempotency
	// header or key, while any other 400 stays [Refused]. RazorpayX publishes
	// neither a retention ([New] requires [WithHorizon], marked as assumed),
	// nor an answer to a request in progress (409 stays [InFlight]), nor a
	// replay signal: without a journal the contract is at-least-once. Errors
	// carry Razorpay's error code.
	RazorpayX = Provider{0, presetRazorpayX}

	// Braintree is Braintree's GraphQL API's at-most-once processing, from
	// "Idempotency" (https://developer.paypal.com/braintree/graphql/integration_guides/idempotency):
	// the key in the mutation's input object, as apiRequestKey, which for a
	// request whose input is in the GraphQL variables is the member
	// variables.input.apiRequestKey (use [WithKeyField] after the preset for
	// another path); kept for 30 days; a repeat returns
	// the current state of the first request's intent, with no replay signal,
	// so without a journal the contract is at-least-once.
	//
	// Braintree answers errors with HTTP 200 and an "errors" array: such a
	// response is never Applied. A request still in progress gets a
	// VALIDATION error, which the documentation calls retryable: the preset
	// makes an error of class VALIDATION [InFlight]; any other error in a 200
	// is [Refused]. Braintree documents nothing that tells that error from the
	// one for a key reused with another payload, so the contract does not
	// detect key reuse, and a reused key is retried as in flight until the
	// consumer gives up; a journal detects reuse before the call. Errors
	// carry the first error's class and the response's requestId.
	Braintree = Provider{braintreeHorizon, presetBraintree}
)

func defaults() config {
	c := config{maxBody: defaultMaxBody, timeout: defaultTimeout, pathOf: versionlessPath}
	IETF.apply(&c)
	return c
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

// reset sets what every preset sets: the key in header name as it is, up
// to 255 bytes; the draft's statuses with 422 as reuse = false:
// [Refused]; no replay signal, rules or error code; failures stored;
// the request id from X-Request-Id. A preset with a published horizon
// sets it; one without leaves a horizon given before it.
func reset(c *config, preset, name string, reuse422 bool) {
	c.preset = preset
	c.place, c.name, c.field = inHeader, name, nil
	c.keyFmt = keyFormat{max: defaultMaxKeyLen}
	c.replayName, c.replayValue, c.replayAny = "", "", false
	c.unpublished, c.failsKept = false, true
	c.statuses = ietfStatuses()
	if !reuse422 {
		c.statuses[http.StatusUnprocessableEntity] = Refused
	}
	c.assigned, c.rules = nil, nil
	c.codePath, c.requestID, c.requestPath = nil, "X-Request-Id", nil
}

// published sets a horizon the provider documents.
func published(c *config, d time.Duration) { c.horizon, c.assumed = d, false }

// presetIETF sets what [IETF] declares.
func presetIETF(c *config) {
	reset(c, "IETF", defaultKeyHeader, true)
	c.place = inStructuredHeader
}

// presetNeutral sets what [Neutral] declares.
func presetNeutral(c *config) {
	reset(c, "Neutral", defaultKeyHeader, false)
}

// adyenHorizon is how long Adyen keeps an idempotency key, as the preset
// declares it: 7 days. Adyen's documentation has said "a minimum of 7
// days" and "a minimum of 31 days" over time; the preset declares the
// shorter, which holds under either.
const adyenHorizon = 7 * 24 * time.Hour

// presetAdyen sets what [Adyen] declares.
func presetAdyen(c *config) {
	reset(c, "Adyen", "Idempotency-Key", false)
	c.keyFmt = keyFormat{max: 64}
	published(c, adyenHorizon)
	inProgress := []int{http.StatusConflict, http.StatusUnprocessableEntity}
	c.rules = []Rule{
		{Outcome: InFlight, Status: inProgress, Header: "Transient-Error", HeaderValue: "true"},
		{Outcome: InFlight, Status: inProgress, Field: []string{"errorCode"}, Value: "704"},
	}
	c.codePath, c.requestID, c.requestPath = []string{"errorCode"}, "", []string{"pspReference"}
}

// payPalMaxKeyLen is the longest PayPal-Request-Id PayPal's Orders v2 API
// accepts: 108 characters.
const payPalMaxKeyLen = 108

// presetPayPal sets what [PayPal] declares.
func presetPayPal(c *config) {
	reset(c, "PayPal", "PayPal-Request-Id", false)
	c.keyFmt = keyFormat{max: payPalMaxKeyLen}
	c.codePath, c.requestID = []string{"name"}, "Paypal-Debug-Id"
}

// worldlineHorizon is how long Worldline Direct keeps an idempotency key:
// at least 24 hours, by Worldline's documentation.
const worldlineHorizon = 24 * time.Hour

// worldlineReplayHeader is the header Worldline Direct adds to every
// response to a request that repeats a key (its value is the time of the
// first request).
const worldlineReplayHeader = "X-GCS-Idempotence-Request-Timestamp"

// presetWorldline sets what [Worldline] declares.
func presetWorldline(c *config) {
	reset(c, "Worldline", "X-GCS-Idempotence-Key", false)
	c.keyFmt = keyFormat{max: 40}
	c.replayName, c.replayAny = worldlineReplayHeader, true
	published(c, worldlineHorizon)
}

// checkoutHorizon is how long Checkout.com keeps an idempotency key by
// default: 24 hours (configurable per account; give yours with
// [WithHorizon]).
const checkoutHorizon = 24 * time.Hour

// presetCheckout sets what [Checkout] declares.
func presetCheckout(c *config) {
	reset(c, "Checkout", "Cko-Idempotency-Key", false)
	published(c, checkoutHorizon)
	c.failsKept = false
	c.codePath, c.requestID = []string{"error_type"}, "Cko-Request-Id"
}

// presetGoCardless sets what [GoCardless] declares.
func presetGoCardless(c *config) {
	reset(c, "GoCardless", "Idempotency-Key", false)
	c.unpublished = true
	conflicting := []string{"error", "errors", "*", "links", "conflicting_resource_id"}
	c.rules = []Rule{{Outcome: Done, Status: []int{http.StatusConflict}, Field: conflicting, Ref: JSONField(conflicting...)}}
	c.codePath, c.requestID, c.requestPath = []string{"error", "errors", "*", "reason"}, "", []string{"error", "request_id"}
}

// mollieHorizon is how long Mollie keeps an idempotency key: 24 hours.
const mollieHorizon = 24 * time.Hour

// presetMollie sets what [Mollie] declares.
func presetMollie(c *config) {
	reset(c, "Mollie", "Idempotency-Key", false)
	published(c, mollieHorizon)
	c.replayName, c.replayValue = "Idempotent-Replayed", "true"
	c.statuses[http.StatusBadRequest] = KeyReused
}

// squareMaxKeyLen is the longest idempotency_key Square accepts: 45
// characters.
const squareMaxKeyLen = 45

// presetSquare sets what [Square] declares.
func presetSquare(c *config) {
	reset(c, "Square", "", false)
	c.place, c.field = inField, []string{"idempotency_key"}
	c.keyFmt = keyFormat{max: squareMaxKeyLen}
	c.unpublished = true
	c.rules = []Rule{{Outcome: KeyReused, Field: []string{"errors", "*", "code"}, Value: "IDEMPOTENCY_KEY_REUSED"}}
	c.codePath = []string{"errors", "*", "code"}
}

// razorpayXAlphabet is what a RazorpayX payout idempotency key may hold:
// letters, digits, space, '-' and '_'.
const razorpayXAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 _-"

// presetRazorpayX sets what [RazorpayX] declares.
func presetRazorpayX(c *config) {
	reset(c, "RazorpayX", "X-Payout-Idempotency", false)
	c.keyFmt = keyFormat{alphabet: razorpayXAlphabet, min: 4, max: 36}
	c.unpublished = true
	reused := []int{http.StatusBadRequest}
	c.rules = []Rule{
		{Outcome: KeyReused, Status: reused, Field: []string{"error", "field"}, Value: "X-Payout-Idempotency"},
		{Outcome: KeyReused, Status: reused, Field: []string{"error", "description"}, Contains: "idempoten"},
	}
	c.codePath = []string{"error", "code"}
}

// braintreeHorizon is how long Braintree's at-most-once processing keeps
// an apiRequestKey: 30 days.
const braintreeHorizon = 30 * 24 * time.Hour

// statuses returns the statuses from through to.
func statuses(from, to int) []int {
	out := make([]int, 0, to-from+1)
	for code := from; code <= to; code++ {
		out = append(out, code)
	}
	return out
}

// presetBraintree sets what [Braintree] declares.
func presetBraintree(c *config) {
	reset(c, "Braintree", "", false)
	c.place, c.field = inField, []string{"variables", "input", "apiRequestKey"}
	published(c, braintreeHorizon)
	c.rules = []Rule{{Outcome: InFlight, Field: []string{"errors", "*", "extensions", "errorClass"}, Value: "VALIDATION"}}
	// GraphQL's errors come with HTTP 200 (or another 2xx).
	c.rules = append(c.rules, Rule{Outcome: Refused, Status: statuses(200, 299), Field: []string{"errors"}})
	c.codePath, c.requestID, c.requestPath = []string{"errors", "*", "extensions", "errorClass"}, "", []string{"extensions", "requestId"}
}
