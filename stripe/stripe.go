package stripe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	stripego "github.com/stripe/stripe-go/v76"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
)

// Horizon is how long Stripe keeps an Idempotency-Key: at least 24 hours.
const Horizon = 24 * time.Hour

// ReplayedHeader is the response header with which Stripe marks a replay
// of a stored response.
const ReplayedHeader = "Idempotent-Replayed"

// ErrReplayedServerError means Stripe answered with a 5xx that it had
// stored for the key earlier and now replays: the outcome of the first
// request is unknown, and retrying the same key cannot resolve it while
// Stripe keeps the key (at least 24 h); a retry after that executes again
// and may duplicate. It is permanent ([effects.Retryable] is false):
// dead-letter the message and reconcile the outcome with Stripe (webhooks,
// the Dashboard, a metadata search). The *stripe.Error is reachable with
// errors.As.
var ErrReplayedServerError = errors.New("stripe replayed a stored server error for this idempotency key; the outcome is unknown and retrying the key cannot resolve it: reconcile")

// Option configures an effect built by [New], [NewPaymentIntents] or
// [NewRefunds]. A nil Option is ignored.
type Option func(*config)

type config struct {
	journal   journal.Journal
	lease     time.Duration
	logger    *slog.Logger
	loggerSet bool
}

// WithJournal makes the effect keep the id of every object it created in
// j, and replay it from there without calling Stripe, so keys stay
// effective past Stripe's 24 h horizon (the contract's Horizon becomes 0:
// until j prunes). See the package doc for how the journal and Stripe's
// key overlap, and why the journal's lease does not gate the call. The
// journal runs [journal.Journaled]'s protocol and policy.
func WithJournal(j journal.Journal) Option { return func(c *config) { c.journal = j } }

// WithLease sets how long one attempt holds its key in a journal that
// takes leases (default [journal.DefaultLease]; a journal that implements
// [journal.DoneJournal] takes none, see the package doc); it bounds the
// call too, which ends at nine tenths of it. Without [WithJournal] it
// does nothing. d must be positive.
func WithLease(d time.Duration) Option { return func(c *config) { c.lease = d } }

// WithLogger sets where the effect reports what it cannot return (an
// object the journal did not record); the default is slog.Default() at the
// time of the event. l must not be nil.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger, c.loggerSet = l, true }
}

// effect is what every Stripe effect shares: its name, the journaled
// protocol (with or without a journal) and the contract.
type effect struct {
	op       string // "stripe.PaymentIntents.Apply"
	j        *journal.Journaled
	contract effects.Contract
}

// newEffect validates opts once for the constructor ctor.
func newEffect(ctor, op string, opts []Option) (effect, error) {
	cfg := config{lease: journal.DefaultLease}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	switch {
	case cfg.lease <= 0:
		return effect{}, &effects.ConfigError{Op: ctor, Option: "WithLease", Reason: fmt.Sprintf("lease %v is not positive", cfg.lease)}
	case cfg.loggerSet && cfg.logger == nil:
		return effect{}, &effects.ConfigError{Op: ctor, Option: "WithLogger", Reason: "nil logger"}
	}
	jopts := []journal.Option{
		journal.WithLease(cfg.lease),
		journal.WithOwnerIdempotency(),
		journal.WithNotApplied(notApplied),
	}
	if cfg.logger != nil {
		jopts = append(jopts, journal.WithLogger(cfg.logger))
	}
	j, err := journal.NewJournaled(op, cfg.journal, jopts...)
	if err != nil {
		return effect{}, err
	}
	e := effect{op: op, j: j, contract: effects.Contract{
		Guarantee:       effects.EffectivelyOnce,
		Enforcer:        "stripe: Idempotency-Key, kept by Stripe for at least 24h",
		Horizon:         Horizon,
		DetectsKeyReuse: true,
	}}
	if cfg.journal != nil {
		e.contract.Enforcer += ", then the journal's record of the object id"
		e.contract.Horizon = 0
	}
	return e, nil
}

// send is one Stripe request: it sends params (which carry the key and the
// context) and returns the object's id and the response.
type send func(params *stripego.Params) (id string, resp *stripego.APIResponse, err error)

// apply runs one Apply: validate the key, then the journaled protocol
// around the call, which sends the key and classifies the outcome.
// fingerprint is computed only when there is a journal.
func (e *effect) apply(ctx context.Context, key effects.Key, fingerprint func() ([]byte, error), do send) (effects.Result, error) {
	if err := e.validate(key); err != nil {
		return effects.Result{}, err
	}
	var fp []byte
	if e.j.Journal() != nil {
		var err error
		if fp, err = fingerprint(); err != nil {
			return effects.Result{}, fmt.Errorf("%s key %q: %w", e.op, key, err)
		}
	}
	return e.j.Apply(ctx, key, fp, func(ctx context.Context, _ *journal.Attempt) (effects.Result, error) {
		return e.call(ctx, key, do)
	})
}

// call sends one request with the key and classifies its outcome.
func (e *effect) call(ctx context.Context, key effects.Key, do send) (effects.Result, error) {
	params := &stripego.Params{Context: ctx}
	params.SetIdempotencyKey(string(key))
	id, resp, err := do(params)
	if err == nil && id == "" {
		err = errors.New("stripe answered without an object id")
	}
	if err != nil {
		return effects.Result{}, e.classify(key, err)
	}
	res := effects.Result{Status: effects.Applied, Ref: id}
	if resp != nil && resp.Header.Get(ReplayedHeader) == "true" {
		res.Status = effects.Replayed
	}
	return res, nil
}

// notApplied is this adapter's part of the journal's classification: a
// Stripe refusal (a decline, an invalid request) proves that Stripe did
// not apply the effect. ErrTransient, ErrKeyReused, ErrInFlight and
// configuration errors are covered by journal.Journaled's default;
// ambiguous outcomes and replayed server errors are not refusals.
func notApplied(err error) bool {
	var re *RequestError
	return errors.As(err, &re)
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
		// or an undecodable body (a proxy's 502 page). A TLS handshake that
		// was refused or a host that does not exist is a configuration
		// error; otherwise only a connection that was never made proves
		// that nothing was sent.
		endpoint := "Stripe API endpoint"
		var ue *url.Error
		if errors.As(err, &ue) {
			u, perr := url.Parse(ue.URL)
			if perr == nil {
				endpoint = u.Scheme + "://" + u.Host
			}
			if ue.Op == "parse" || perr != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
				// The request was never built: the backend URL is wrong.
				return fmt.Errorf("%w: %w", &effects.ConfigError{Op: e.op, Option: "backend URL " + ue.URL,
					Reason: "not an http:// or https:// URL (no retry fixes this)"}, err)
			}
		}
		if cerr := effects.Misconfigured(e.op, endpoint, err); cerr != nil {
			return cerr
		}
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
