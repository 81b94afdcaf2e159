// Package stripetest is a local Stripe API endpoint for tests: an
// in-process HTTP server on 127.0.0.1 that serves the create (POST) and
// retrieve (GET .../{id}) endpoints stripe-go calls for PaymentIntents,
// Refunds, Customers, Transfers and Checkout Sessions, and the balance
// (GET /v1/balance, the authenticated read that changes nothing which
// stripe's Check makes). It follows Stripe's documented idempotency rules
// for API v1, which stripe-mock does not implement, the same way for every
// endpoint:
//
//   - The first response for an Idempotency-Key is stored once the
//     endpoint began executing, whatever it was (a success, a card decline,
//     a 500), and every later request with the key gets it back with the
//     header "Idempotent-Replayed: true".
//   - The same key with other parameters, or on another endpoint, is
//     refused with 400 and an error of type "idempotency_error".
//   - The same key while its first request is still executing is refused
//     with 409 and the code "idempotency_key_in_use"; nothing is stored.
//   - Nothing is stored when the request failed validation (a missing
//     amount, an unknown currency format, a refund of an unknown
//     PaymentIntent, a customer email that is not one, a transfer without
//     a connected account as destination, a Checkout Session without a
//     mode, a success_url or line items), nor for 401s, 403s and
//     rate-limited 429s, which Stripe answers before its idempotency
//     layer: a corrected retry with the same key executes.
//   - Keys are scoped to the account of the API key and the
//     Stripe-Account header, expire 24 h after their first request (as
//     [WithClock] tells time), and are refused with 400
//     when longer than 255 characters.
//
// API keys: any non-empty bearer token is accepted, each its own
// account, until the test revokes it ([Server.RevokeKey]: 401 "Invalid
// API Key provided"), rolls it ([Server.RollKey]: the old key gets 401,
// the new one acts for the same account) or restricts it
// ([Server.RestrictKey]: 403 on every POST). A card is declined as in
// Stripe's test mode: a PaymentIntent confirmed with the test payment
// method "pm_card_chargeDeclined" (or "pm_card_visa_chargeDeclined",
// "pm_card_chargeDeclinedInsufficientFunds") gets 402
// card_error/card_declined, stored under its key and replayed.
//
// The server counts what it created per idempotency key ([Server.Created],
// [Server.Total], [Server.CreatedWithMetadata]): that is the backend's own
// count, which the conformance suite compares with what an adapter
// claims. Failures can be injected: Stripe's own, stored under the key
// ([Server.FailNext], [Server.FailNextAfterCreate]), and those Stripe
// does not store ([Server.RateLimitNext], [Server.ConflictNext], and a
// proxy's in front of the API, [Server.FailNextInFront] and
// [Server.FailNextReplyInFront]); requests can be
// slowed to create in-flight overlap ([WithLatency]), and the server can
// be restarted with its state ([Server.Restart]).
//
// When not to use it: it models idempotency, not payments. Amounts are not
// checked against currencies' minimums, customers, prices, connected
// accounts and payment methods are not looked up (except the decline test
// method "pm_card_chargeDeclined"), unknown parameters are accepted, and
// only the endpoints listed above exist. Test payment logic against
// Stripe's test mode.
package stripetest
