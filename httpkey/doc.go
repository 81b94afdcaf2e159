// Package httpkey makes a call to any HTTP API that takes an idempotency
// key effectively once: a payment provider (Adyen, PayPal, Worldline,
// Checkout.com, GoCardless, Mollie, Square, RazorpayX, Braintree, ...),
// an internal service, anything that follows the IETF draft "The
// Idempotency-Key HTTP Header Field"
// (draft-ietf-httpapi-idempotency-key-header-07) or a vendor's variant of
// it. [New] turns a function that builds the request from an input into an
// [effects.Effect]; Apply sends the request over your *http.Client with
// the effect's key as the idempotency key, and the server, which stores
// its first response per key, turns every redelivery, retry and racing
// duplicate into that one response.
//
//	charges, err := httpkey.New(client, buildCharge, // func(ctx, Charge) (*http.Request, error)
//		httpkey.IETF, httpkey.WithHorizon(24*time.Hour),
//		httpkey.WithRef(httpkey.JSONField("id")),
//		httpkey.WithJournal(pgJournal)) // effectively-once past the server's 24 h
//	key, _ := effects.NewKey("billing", event.ID, "charge")
//	res, err := charges.Apply(ctx, key, Charge{Amount: 2000, Currency: "EUR"})
//	// res.Ref is the charge's id, the same on every redelivery
//
// For Stripe, use package stripe, which knows Stripe's errors and its
// 24-hour horizon.
//
// # The request and the key
//
// The request function gets the input (never the key) and returns the
// request: method, absolute URL, credentials, body. Apply adds the key
// where the configuration says: the Idempotency-Key header as a quoted
// Structured Field String by default ([IETF]), another header as it is
// ([WithKeyHeader]), or a member of the JSON body, nested or not
// ([WithKeyField]). Keys are sent as they are when they hold only
// printable ASCII other than '%', '"' and '\' and fit the server's limit;
// other bytes are escaped as %XX, and a key still too long is shortened
// with a digest ([WithMaxKeyLen]). A server that takes a narrower format
// gets every key in it: over an alphabet within a length range
// ([WithKeyAlphabet], RazorpayX's 4 to 36 of [A-Za-z0-9 _-]) or as a UUID
// ([WithKeyUUID]), derived with a digest of the key. Either way any key
// [effects.NewKey] makes, in any script, reaches the server distinct from
// every other, and none is ever placed in a URL. [Effect.WireKey] tells
// the form the server sees. Keys are validated before any I/O
// ([effects.ErrInvalidKey]).
//
// # The contract
//
// What an idempotency key promises depends on the server, so the contract
// is derived from the configuration and says exactly that:
//
//   - With a replay signal ([WithReplayHeader]: the server marks a stored
//     response it replays, as Stripe's "Idempotent-Replayed: true", or
//     a header's presence, as [Worldline]; or a [Rule] whose outcome
//     is [Done], as [GoCardless]'s conflict naming what the first request
//     created) and a horizon H ([WithHorizon]): effectively-once for H. A
//     repeat within H creates nothing and reports [effects.Replayed]; one
//     after H is executed again.
//   - With a journal ([WithJournal]), whatever the server signals:
//     effectively-once with Horizon 0, until the journal prunes. The
//     journal replays its record without calling the server, however old.
//   - With neither: at-least-once, duplicates on any redelivery. This is
//     what the [IETF] draft alone, [Adyen] and [PayPal] give, because they
//     define no replay signal. Within H the server still creates nothing
//     for a repeat and answers it with the first response, but Apply cannot
//     tell that answer from a first one: it reports every success as
//     Applied, with the first response's ref. Past H a repeat executes
//     again. A caller that counts effects from Results, or a plan that
//     relies on Replayed, cannot trust it; add a journal.
//   - A server that stores only its 2xx answers ([WithFailuresNotStored],
//     [Checkout]) executes a retry after a 5xx again: with a journal the
//     contract is at-least-once, duplicates after an unknown outcome.
//
// A horizon the provider does not publish ([GoCardless], [Square],
// [RazorpayX], or [WithAssumedHorizon]) is an assumption, and
// the contract says so (effects.Contract.HorizonAssumed): nothing checks
// it but a run against the provider itself.
//
// DetectsKeyReuse is true when a status or a [Rule] says [KeyReused] (the
// draft's 422, Square's IDEMPOTENCY_KEY_REUSED) or with a journal, which
// compares the request's fingerprint before the call. The fingerprint
// covers what providers scope a key to: the method, the URL's path with
// its version segments left out ([WithPathTemplate]:
// an API version bump between a request and its redelivery is not a
// reused key), and the body; not the host, the query or the headers.
// The conformance suite (package conformance) holds every such declaration
// to its word against package httpkeytest, a local server with the
// draft's semantics whose clock the test moves.
//
// # Errors
//
// Apply's errors say what a caller may do next ([effects.ClassOf]); the
// classes are the configuration's: [Rule]s on the status, a header and the
// JSON body first ([WithRule]: an error a GraphQL API returns with
// HTTP 200 is never Applied), then the status ([WithStatus];
// the defaults follow the draft):
//
//   - 409, a request with the key still in progress: [effects.ErrInFlight],
//     retryable, with the server's Retry-After in
//     [effects.Error].RetryAfter.
//   - 422, the key used with another payload: [effects.ErrKeyReused],
//     permanent. ([Adyen], [PayPal] and [Worldline] map 422 to [Refused]:
//     the first two use it for refused requests, and none documents a
//     status for a reused key.)
//   - 401 and 403: a *[effects.ConfigError] naming the endpoint: stop the
//     worker and fix the credentials. A 3xx too (Apply never follows a
//     redirect), and a TLS handshake refused or a host that does not exist
//     ([effects.Misconfigured]).
//   - 408 and 429: [effects.ErrTransient], with Retry-After.
//   - Any other 4xx: [effects.ErrRefused], permanent (a decline, a failed
//     validation).
//   - 5xx: [effects.ErrAmbiguous]: the request may have been applied, and
//     a retry with the same key resolves it. A 5xx that the replay signal
//     marks as replayed is [ErrReplayedServerError] (permanent): the server
//     stored its failure for the key, and no retry can learn more until it
//     forgets the key.
//   - No response (connection cut, reply lost, context ended after the
//     request left): [effects.ErrAmbiguous]. A connection never made:
//     [effects.ErrTransient].
//
// Every such error unwraps to a *[ResponseError] with the status, the
// headers, the vendor's error code ([WithErrorCode]) and the request's id
// ([WithRequestIDHeader]). The body stays out of errors, which reach
// logs, spans and dead-letter headers: vendors echo card numbers and
// email addresses in it; [WithErrorBody] keeps it in the ResponseError
// for code that reads it, never in the text. A URL in an error loses its
// user information and query.
//
// # Limits
//
// A 2xx body is read only when something needs it ([WithRef], a [Rule]
// on the body), and never past [WithMaxBody] (default 1 MiB). Without a journal each
// call ends after [WithTimeout] (default 30 s); with one, at nine tenths of the lease.
//
// # Horizon and the journal
//
// A journal extends the key past the server's horizon as stripe.WithJournal
// does, through [journal.Journaled]: Apply consults the journal first and
// replays a completed record without calling the server; otherwise it
// sends the request and records the ref. The two records overlap: the
// journal covers everything after its record commits, and the server's
// key covers the gap between the call and the record (a crash or a lost
// reply there is retried with the same key, which the server answers with
// its stored response, and the retry writes the record). The one gap left
// is a success whose record never committed, redelivered only after the
// server forgot the key; keep redelivery of failed messages well inside
// the server's horizon if that matters to you.
//
// How the journal and the server share the work depends on the server:
//
//   - A server with a replay signal that also refuses a reused key (a 422)
//     needs no lease: as with Stripe, the call goes ahead even when another
//     attempt holds the key, since the server answers in-flight or replays,
//     and with a [journal.DoneJournal] (postgres.Journal) each response is
//     recorded with one write. A lost reply costs one retry.
//   - Otherwise the journal's lease gates the call: one attempt at a time
//     sends the request, the others get [effects.ErrInFlight] until it
//     records the ref (then they replay it, as Replayed) or its lease ends.
//     That is what lets Apply report replays that the server does not
//     mark, and refuse a reused key the server does not check. A lost
//     reply costs a lease ([journal.WithLease]): the next attempt sends the request
//     again after the lease, and the server answers with the stored
//     response.
//
// # Presets
//
// [IETF] is the draft's scheme (and the default); [Adyen], [PayPal],
// [Worldline] (Worldline Direct), [Checkout] (Checkout.com),
// [GoCardless], [Mollie], [Square], [RazorpayX] (payouts) and [Braintree]
// (GraphQL) are those vendors' documented conventions, each citing its
// documentation and claiming nothing more. Options given after a preset
// change it. For another vendor, start from [Neutral], which claims
// nothing (no replay signal, no reuse status, no horizon), and
// set what its documentation says: the header ([WithKeyHeader]) or body
// member ([WithKeyField]), the key format, the horizon, the replay signal,
// the statuses and rules. Starting from [IETF] would claim that a 422
// means a reused key, which few vendors say.
//
// # No start-up check
//
// The effect does not implement [effects.Checker]: the draft defines no
// cheap probe, and a request to the endpoint would be a real call. A wrong
// credential shows at the first Apply as a configuration error, which
// stops a consumer before it dead-letters anything.
//
// # When not to use it
//
// For requests that are idempotent by nature (GET, PUT of a whole
// resource, DELETE), a key adds nothing. For Stripe, package stripe. For
// an API without idempotency keys, no client-side trick makes a POST
// effectively once: use an effect whose owner dedups (package postgres)
// or a journal-backed adapter that declares its duplicate window. And no
// key helps if it is not stable: build it with [effects.NewKey] from the
// message's identity, never per attempt.
package httpkey
