package stripe

import (
	"context"
	"errors"
	"net/http"
	"strings"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"effectively.dev/effects"
)

// check probes the API key with an authenticated GET /v1/balance, which
// changes nothing. It returns nil when Stripe authenticated the key (a
// 403, the key lacks permission to read the balance, passes: a restricted
// key may still create what the effect creates, and a request it may not
// make fails on its first Apply as a configuration error); a configuration
// error for a key Stripe refuses (401, an expired key) or a backend it
// cannot reach for good; a retryable error otherwise.
func (e *effect) check(ctx context.Context) error {
	if e.api == nil {
		return nil
	}
	op := strings.TrimSuffix(e.op, ".Apply") + ".Check"
	_, err := e.api.Balance.Get(&stripego.BalanceParams{Params: stripego.Params{Context: ctx}})
	if err == nil {
		return nil
	}
	var se *stripego.Error
	if !errors.As(err, &se) {
		if cerr := backendError(op, err); cerr != nil {
			return cerr
		}
		return effects.Transient(op, "", err)
	}
	sum := &summary{err: se}
	switch {
	case se.HTTPStatusCode == http.StatusForbidden:
		return nil
	case se.HTTPStatusCode == http.StatusUnauthorized || configCodes[se.Code]:
		return keyError(op, sum)
	}
	return &effects.Error{Kind: effects.ErrTransient, Op: op, Err: sum, RetryAfter: retryAfter(se.LastResponse)}
}

// withCheck adds the typed constructors' own client to opts as the one
// Check probes with, without touching the caller's slice.
func withCheck(opts []Option, api *client.API) []Option {
	if api.Balance == nil {
		return opts // a hand-built client without the Balance resource: nothing to probe with
	}
	return append(opts[:len(opts):len(opts)], WithCheckClient(api))
}

// Check implements [effects.Checker]: it probes the API key of the client
// given with [WithCheckClient] with an authenticated GET /v1/balance,
// which creates nothing. It returns nil when Stripe authenticated the key
// (also when the key may not read the balance: a restricted key is
// checked for what it may do by its first Apply); an
// *[effects.ConfigError] naming the "API key" when Stripe refuses it
// (401: invalid, expired or rolled), or naming the endpoint when the
// backend cannot be reached for good (see the package doc); and an
// [effects.ErrTransient] when Stripe could not be reached now or failed.
// Without WithCheckClient there is nothing to probe, and Check returns
// nil.
func (e *Effect[P]) Check(ctx context.Context) error { return e.e.check(ctx) }

// Check implements [effects.Checker] as [Effect.Check] does, with the
// client given to [NewPaymentIntents].
func (p *PaymentIntents) Check(ctx context.Context) error { return p.e.Check(ctx) }

var (
	_ effects.Checker = (*Effect[*stripego.CustomerParams])(nil)
	_ effects.Checker = (*PaymentIntents)(nil)
)
