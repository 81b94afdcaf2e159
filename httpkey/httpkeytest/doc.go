// Package httpkeytest is a local HTTP API with the idempotency semantics
// of the IETF draft "The Idempotency-Key HTTP Header Field"
// (draft-ietf-httpapi-idempotency-key-header-07), for testing code that
// calls such APIs (package httpkey's effects, or your own client) without
// a vendor's sandbox: the first response per key is stored for a horizon,
// read against a clock the test can move; a request while the key's first
// one executes gets 409; the key with another payload gets 422; a request
// without a key gets 400. It counts the objects created per key, which is
// what a conformance harness counts.
//
//	srv := httpkeytest.Start(t)
//	// POST srv.URL+"/objects" with Idempotency-Key: "k" → 201 {"id":"obj_1",...}
//	// the same again → the same 201 and body; srv.Count("k") == 1
//	srv.Age(ctx, 25*time.Hour) // past the horizon: the key executes again
//
// It can play the provider of each of httpkey's Provider values ([As]) as
// its documentation says: where the key goes and what format it must have,
// how long it is kept, what a request in progress and a reused key get
// (Adyen's 422 with errorCode 704, GoCardless's 409
// idempotent_creation_conflict, Braintree's errors in a 200), whether
// replays are marked and failures stored. A request whose
// body holds [DeclineMarker] is declined, as a test card is; [Server.Age]
// makes its keys older through its own clock (a conformance.Ager that
// reaches the key store), and [Server.CrashRestart] kills and restarts
// it. Failures can be injected as the key's stored response
// ([Server.FailNext], [Server.FailNextAfterCreate]) or without touching
// the key store: a 409 for a concurrent request ([Server.ConflictNext])
// and a 5xx from in front of the server, before the request reached it
// ([Server.FailNextInFront]) or after it was executed and its response
// stored ([Server.FailNextReplyInFront]). It can also misbehave, so that a test can
// show what the conformance suite makes of a contract that claims more
// than the server does: a server without a replay signal
// ([WithReplayHeader] left out, or given an empty name) under an effect
// that declares one, a server that forgets keys early ([WithHorizon]
// shorter than the effect declares).
//
// The server listens on 127.0.0.1 only. It keeps everything in memory and
// keeps it across [Server.Restart].
package httpkeytest
