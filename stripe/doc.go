// Package stripe makes Stripe calls effectively once over stripe-go v76,
// with the effect's key as Stripe's Idempotency-Key. [New] turns any
// stripe-go POST into an [effects.Effect] (Customers, Transfers, Payouts,
// Invoices, Subscriptions, Checkout Sessions, a confirmation or a
// capture, a refund: New(api.Refunds.New)); [PaymentIntents] is its typed
// form for the most common call.
//
// A message delivered twice, a retry after a lost reply, sixteen workers
// racing on one key: Stripe creates one object, and every Apply after the
// first reports [effects.Replayed] with the same id:
//
//	import (
//		stripego "github.com/stripe/stripe-go/v76"
//		"github.com/stripe/stripe-go/v76/client"
//
//		"effectively.dev/effects"
//		"effectively.dev/stripe"
//	)
//
//	api := client.New(secretKey, nil) // stripe-go's client
//	charges, err := stripe.NewPaymentIntents(api)
//	key, _ := effects.NewKey("billing", event.ID, "charge")
//	res, err := charges.Apply(ctx, key, stripe.PaymentIntent{Amount: 2000, Currency: "usd", Customer: "cus_123"})
//	// res.Ref is "pi_...", the same on every redelivery; errors.Is(err, effects.ErrKeyReused) etc.
//
//	customers, err := stripe.New(api.Customers.New)
//	res, err = customers.Apply(ctx, key, &stripego.CustomerParams{Email: stripego.String("ada@example.com")})
//
// # How
//
// Every request carries the effect's key as its Idempotency-Key, set
// explicitly: stripe-go otherwise sends a random key per call, which makes
// each retry a new charge. Stripe stores the first response for a key and
// replays it, with "Idempotent-Replayed: true", to every later request with
// the key; Apply reports such a replay as [effects.Replayed]. The key is
// validated before any I/O ([effects.ErrInvalidKey]); keys with leading or
// trailing white space are refused too, because stripe-go trims them and
// " k" would silently share Stripe's record with "k".
//
// # Errors
//
// Every error Apply returns is in one class of [effects.ClassOf], which
// tells a consumer what to do:
//
//   - Retryable, retry the same key: 409 idempotency_key_in_use (another
//     request with the key is executing) is [effects.ErrInFlight], and
//     the retry gets the other request's result. No response (connection
//     cut, reply lost, context cancelled or timed out after the request
//     left) is [effects.ErrAmbiguous]: the request may have been applied,
//     and retrying the same key either applies it or replays it; never
//     retry with a new key. A connection that was never made, a 429, and
//     other 409s are [effects.ErrTransient]: Stripe's rate limiter answers
//     before its idempotency layer, so nothing was stored; a 429 with a
//     Retry-After header carries it ([effects.RetryAfter]).
//   - 5xx: Stripe documents a 500's outcome as indeterminate and stores it
//     under the key like any response, so a retry with the same key replays
//     the same 500 for as long as Stripe keeps the key. The first 5xx is
//     [effects.ErrAmbiguous]: one retry tells a stored 500 from one that
//     never reached the idempotency layer (which then executes). A 5xx that
//     comes back replayed matches [ErrReplayedServerError] and
//     [effects.ErrPoison], which is permanent: retrying cannot resolve it
//     for at least 24 h, and a retry after Stripe forgets the key executes
//     again and may duplicate. Dead-letter such a message and reconcile
//     (webhooks, the Dashboard, a metadata search) instead.
//   - Permanent, dead-letter at once: 400 idempotency_error (the key was
//     used with other parameters, or on another endpoint) is
//     [effects.ErrKeyReused]. A card decline (402 card_error), an invalid
//     request (400 invalid_request_error: a missing parameter, an unknown
//     customer) and any other refusal are a [*RequestError], which
//     matches [effects.ErrRefused] and wraps stripe-go's *stripe.Error
//     (errors.As reaches it, and through it *stripe.CardError and the
//     other typed errors). Stripe stores such an answer when the endpoint
//     had begun executing (a decline: the retry replays it), but not when
//     validation failed (a missing currency): then the corrected request
//     executes under the same key.
//   - Configuration, stop the worker and fix it: 401 (the secret key is
//     invalid, expired or was rolled), 403 (a restricted key without the
//     permission, an account the key cannot act for) and the codes that
//     refuse the key for the account (api_key_expired, livemode_mismatch,
//     ...) are an *[effects.ConfigError] naming the "API key". A failure
//     no retry fixes on the way to Stripe, a refused TLS handshake (a
//     certificate not trusted or for another host, TLS to a plain-text
//     port), a host name that does not exist, a backend URL that is not
//     http(s), is an *[effects.ConfigError] naming the endpoint (see
//     [effects.Misconfigured]). A refused connection stays
//     [effects.ErrTransient], since a restarting server looks the same.
//     Nothing is applied before such an error.
//
// The errors' texts summarize Stripe's answer (HTTP status, type, code,
// decline code, parameter, request id) and never carry stripe-go's own
// Error(), the error's whole JSON: Stripe's message may quote what the
// customer typed. The *stripe.Error, with its message, stays reachable
// with errors.As.
//
// # Start-up check
//
// Every effect implements [effects.Checker]: Check makes one authenticated
// GET /v1/balance, which creates nothing, and returns an
// *[effects.ConfigError] naming the "API key" if Stripe refuses the key,
// so a worker that runs [effects.Plan.Check] at start-up stops before the
// first delivery instead of failing every one. A key that may not read
// the balance (a restricted key) passes: Check proves that the key
// authenticates, and a request it may not make fails on its first Apply as
// a configuration error. [NewPaymentIntents] checks with its client; give
// [New] the client with [WithCheckClient].
//
// # stripe-go's own logger
//
// stripe-go logs on its own, apart from the journal's [journal.WithLogger]
// and [journal.WithObserver]: unless the backend is built with a LeveledLogger, it
// uses stripe-go's DefaultLeveledLogger (level Error, to standard error), which
// prints every error response as "Request error from Stripe (status N):"
// followed by Stripe's error JSON (message, code, decline code, request
// id, the parameter at fault), and 402 card errors at Info. That text can
// carry what your logs should not (customer details echoed in a message)
// and goes around your log pipeline. This package already returns the
// same information as errors; build the client with a logger of your
// choice, or none:
//
//	cfg := &stripego.BackendConfig{LeveledLogger: &stripego.LeveledLogger{Level: stripego.LevelNull}}
//	api := client.New(secretKey, &stripego.Backends{
//		API:     stripego.GetBackendWithConfig(stripego.APIBackend, cfg),
//		Uploads: stripego.GetBackendWithConfig(stripego.UploadsBackend, cfg),
//	})
//
// or set stripego.DefaultLeveledLogger before creating clients.
//
// # Horizon and the journal
//
// Stripe keeps keys for at least 24 hours, so the contract's Horizon is
// 24 h: a redelivery after that creates a second object. If messages can
// come back later (a long broker retention, a replay tool), give the
// effect an [journal.Journal] with [WithJournal]. Apply then consults the
// journal first: a completed record replays the stored id without calling
// Stripe, however old it is; otherwise Apply calls Stripe and records the
// id. The contract's Horizon becomes 0, until the journal prunes.
//
// This stays effectively once past Stripe's horizon because the two
// records overlap: the journal covers everything after the record commits,
// and Stripe's key covers the gap between the call and the record (a crash
// or a lost reply there is resolved by a retry with the same key, which
// Stripe replays, and the retry writes the record). The one gap left is a
// success whose record never committed, redelivered only after Stripe
// forgot the key (the process died between the call and the record, and
// the message came back more than 24 h later). Keep redelivery of failed
// messages well inside 24 h if that matters to you.
//
// With a journal that implements [journal.DoneJournal] (postgres.Journal
// does), the effect takes no lease: a lease would only make a concurrent
// attempt wait, and Stripe's key already does that (409 while the first
// request executes, its stored result after). Apply reads the journal
// (Lookup: a done record replays, another fingerprint is
// [effects.ErrKeyReused]), calls Stripe, and records the id with one
// write (MarkDone): one journal write per object instead of two (the
// lease's and the record's). A failed call leaves nothing behind to
// release.
//
// The journal runs [journal.Journaled]'s protocol and policy, the same as
// package email's and the Kafka producer's: a journal failure before the
// call is [effects.ErrTransient]; the record of a created object is
// completed on a context detached from the caller's and retried; if it
// still does not commit, Apply reports the object as Applied (Stripe has
// it) and logs it ([journal.WithLogger]), and the next attempt records it
// from Stripe's replay. With a journal that is not a DoneJournal, Apply
// takes a lease ([journal.WithLease], one minute by default), and
// it does not gate the call. Within Stripe's horizon
// Stripe's key is the enforcer, so an attempt that finds the key leased by
// another attempt ([effects.ErrInFlight] from Begin) calls Stripe anyway:
// Stripe answers 409 (reported as ErrInFlight) while the other request
// executes, or replays its result, which this attempt then records. So a
// lost reply costs one retry, not a lease expiry. The lease is released
// only after a failure that cannot have applied the effect
// ([effects.ErrTransient], a configuration error or a permanent Stripe
// refusal), and only by the attempt that took it; the call ends at nine
// tenths of the lease.
//
// The journal's fingerprint is every field of the params stripe-go sends
// (as JSON), and the params type.
//
// # When not to use it
//
// For Stripe calls that are reads, or updates that are idempotent by
// nature, a key adds nothing. Connect platforms acting for connected
// accounts: Stripe scopes keys per account (the Stripe-Account header),
// and the journal's fingerprint includes it, so build keys per account
// too. And no key makes a charge effectively once if the key is not
// stable: build it with [effects.NewKey] from the message's identity,
// never per attempt.
package stripe
