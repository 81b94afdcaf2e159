package stripe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	stripego "github.com/stripe/stripe-go/v76"

	"effectively.dev/effects"
)

// Horizon is how long Stripe keeps an Idempotency-Key: at least 24 hours.
const Horizon = 24 * time.Hour

// ReplayedHeader is the response header with which Stripe marks a replay
// of a stored response.
const ReplayedHeader = "Idempotent-Replayed"

// journalLease is the lease an Apply asks the journal for. Apply does not
// wait on leases (see the package doc), so it only bounds how long another
// attempt's Begin reports ErrInFlight.
const journalLease = time.Minute

// completeTimeout bounds recording a success in the journal after the
// caller's context was cancelled: Stripe has applied the effect, so the
// record is worth a few more seconds.
const completeTimeout = 10 * time.Second

// ErrReplayedServerError means Stripe answered with a 5xx that it had
// stored for the key earlier and now replays: the outcome of the first
// request is unknown, and retrying the same key cannot resolve it while
// Stripe keeps the key (at least 24 h); a retry after that executes again
// and may duplicate. It is permanent ([effects.Retryable] is false):
// dead-letter the message and reconcile the outcome with Stripe (webhooks,
// the Dashboard, a metadata search). The *stripe.Error is reachable with
// errors.As.
var ErrReplayedServerError = errors.New("stripe replayed a stored server error for this idempotency key; the outcome is unknown and retrying the key cannot resolve it: reconcile")

// Option configures an effect built by [NewPaymentIntents] or [NewRefunds].
type Option func(*config)

type config struct {
	journal effects.Journal
}

// WithJournal makes the effect keep the id of every object it created in
// j, and replay it from there without calling Stripe, so keys stay
// effective past Stripe's 24 h horizon (the contract's Horizon becomes 0:
// until j prunes). See the package doc for how the journal and Stripe's
// key overlap, and why the journal's lease does not gate the call.
func WithJournal(j effects.Journal) Option { return func(c *config) { c.journal = j } }

// effect holds what PaymentIntents and Refunds share.
type effect struct {
	op      string // "stripe.PaymentIntents.Apply"
	object  string // "payment_intent", part of the fingerprint
	journal effects.Journal
}

func newEffect(op, object string, opts []Option) effect {
	var c config
	for _, o := range opts {
		o(&c)
	}
	return effect{op: op, object: object, journal: c.journal}
}

func (e *effect) contract() effects.Contract {
	if e.journal != nil {
		return effects.Contract{
			Guarantee:       effects.EffectivelyOnce,
			Enforcer:        "stripe: Idempotency-Key, kept by Stripe for at least 24h, then the journal's record of the object id",
			Horizon:         0,
			DetectsKeyReuse: true,
		}
	}
	return effects.Contract{
		Guarantee:       effects.EffectivelyOnce,
		Enforcer:        "stripe: Idempotency-Key, kept by Stripe for at least 24h",
		Horizon:         Horizon,
		DetectsKeyReuse: true,
	}
}

// call is one Stripe request: it sends params (which carry the key and the
// context) and returns the object's id and the response.
type call func(params *stripego.Params) (id string, resp *stripego.APIResponse, err error)

// apply runs one Apply: validate the key, consult the journal, call Stripe
// with the key, classify the outcome, record it.
func (e *effect) apply(ctx context.Context, key effects.Key, in any, do call) (effects.Result, error) {
	if err := e.validate(key); err != nil {
		return effects.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return effects.Result{}, fmt.Errorf("%s key %q: not sent: %w", e.op, key, err)
	}
	leased, attempt := false, 0
	if e.journal != nil {
		fp, err := effects.FingerprintJSON(struct {
			Object string
			Input  any
		}{e.object, in})
		if err != nil {
			return effects.Result{}, fmt.Errorf("%s key %q: %w", e.op, key, err)
		}
		rec, err := e.journal.Begin(ctx, key, fp, journalLease)
		switch {
		case err == nil && rec.Done:
			return effects.Result{Status: effects.Replayed, Ref: rec.Ref}, nil
		case err == nil:
			leased, attempt = true, rec.Attempt
		case errors.Is(err, effects.ErrInFlight):
			// Another attempt holds the lease; Stripe's key still guards
			// the call (see the package doc).
		case errors.Is(err, effects.ErrKeyReused):
			return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Op: e.op, Key: key, Err: err}
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			return effects.Result{}, fmt.Errorf("%s key %q: journal: %w", e.op, key, err)
		default:
			return effects.Result{}, effects.Transient(e.op, key, fmt.Errorf("journal: %w", err))
		}
	}

	params := &stripego.Params{Context: ctx}
	params.SetIdempotencyKey(string(key))
	id, resp, err := do(params)
	if err == nil && id == "" {
		err = errors.New("stripe answered without an object id")
	}
	if err != nil {
		cerr := e.classify(key, err)
		if leased && notApplied(cerr) {
			// Nothing was applied: let the next attempt go without waiting
			// for the lease. Best effort; the lease expires anyway.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), completeTimeout)
			_ = e.journal.Release(rctx, key, attempt)
			cancel()
		}
		return effects.Result{}, cerr
	}
	res := effects.Result{Status: effects.Applied, Ref: id}
	if resp != nil && resp.Header.Get(ReplayedHeader) == "true" {
		res.Status = effects.Replayed
	}
	if e.journal != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), completeTimeout)
		err := e.journal.Complete(cctx, key, id)
		cancel()
		if err != nil {
			return res, effects.Ambiguous(e.op, key,
				fmt.Errorf("stripe has %s but the journal did not record it (a retry with the same key replays it from Stripe and records it): %w", id, err))
		}
	}
	return res, nil
}

// notApplied reports whether a classified failure proves that Stripe did
// not apply the effect: nothing reached its idempotency layer (transient),
// or Stripe refused the request (a decline, an invalid request, a reused
// key). Ambiguous outcomes and replayed server errors do not.
func notApplied(err error) bool {
	var re *RequestError
	return errors.Is(err, effects.ErrTransient) || errors.Is(err, effects.ErrKeyReused) || errors.As(err, &re)
}

// validate refuses keys no Stripe call may carry.
func (e *effect) validate(key effects.Key) error {
	if err := key.Validate(); err != nil {
		var ke *effects.Error
		if errors.As(err, &ke) {
			return &effects.Error{Kind: effects.ErrInvalidKey, Op: e.op, Key: key, Err: ke.Err}
		}
		return err
	}
	if strings.TrimSpace(string(key)) != string(key) {
		return &effects.Error{Kind: effects.ErrInvalidKey, Op: e.op, Key: key,
			Err: errors.New("leading or trailing white space: stripe-go trims it, so the key would share Stripe's record with its trimmed form")}
	}
	return nil
}

// classify maps a stripe-go error to the effects error taxonomy.
func (e *effect) classify(key effects.Key, err error) error {
	var se *stripego.Error
	if !errors.As(err, &se) {
		// No Stripe-shaped answer: a transport error, a cancelled context
		// or an undecodable body (a proxy's 502 page). Only a connection
		// that was never made proves that nothing was sent.
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return effects.Transient(e.op, key, err)
		}
		return effects.Ambiguous(e.op, key, err)
	}
	replayed := se.LastResponse != nil && se.LastResponse.Header.Get(ReplayedHeader) == "true"
	retryHint := ""
	if se.LastResponse != nil {
		retryHint = se.LastResponse.Header.Get("Stripe-Should-Retry")
	}
	switch {
	case se.Type == stripego.ErrorTypeIdempotency:
		return &effects.Error{Kind: effects.ErrKeyReused, Op: e.op, Key: key, Err: err}
	case se.HTTPStatusCode == http.StatusConflict && se.Code == stripego.ErrorCodeIdempotencyKeyInUse:
		return &effects.Error{Kind: effects.ErrInFlight, Op: e.op, Key: key, Err: err}
	case se.HTTPStatusCode >= 500 && replayed:
		return fmt.Errorf("%s key %q: %w: %w", e.op, key, ErrReplayedServerError, err)
	case se.HTTPStatusCode >= 500:
		return effects.Ambiguous(e.op, key, err)
	case se.HTTPStatusCode == http.StatusTooManyRequests, se.HTTPStatusCode == http.StatusConflict, retryHint == "true" && !replayed:
		return effects.Transient(e.op, key, err)
	}
	return &RequestError{Op: e.op, Key: key, Err: se}
}

// RequestError is a Stripe error that retrying cannot fix: a card decline,
// an invalid request, an unknown object. It is permanent
// ([effects.Retryable] is false). Err is stripe-go's *stripe.Error, also
// reachable with errors.As; its Type, Code and DeclineCode say what
// happened.
type RequestError struct {
	// Op names the operation, e.g. "stripe.PaymentIntents.Apply".
	Op string
	// Key is the idempotency key of the request.
	Key effects.Key
	// Err is stripe-go's error.
	Err *stripego.Error
}

// Error says what Stripe refused and why.
func (e *RequestError) Error() string {
	msg := fmt.Sprintf("%s key %q: stripe refused the request (HTTP %d, %s", e.Op, e.Key, e.Err.HTTPStatusCode, e.Err.Type)
	if e.Err.Code != "" {
		msg += "/" + string(e.Err.Code)
	}
	if e.Err.DeclineCode != "" {
		msg += "/" + string(e.Err.DeclineCode)
	}
	msg += "): " + e.Err.Msg
	if e.Err.LastResponse != nil && e.Err.LastResponse.Header.Get(ReplayedHeader) == "true" {
		msg += " (replayed: Stripe stored this answer for the key; a corrected request needs another key)"
	}
	return msg
}

// Unwrap returns stripe-go's error.
func (e *RequestError) Unwrap() error { return e.Err }
