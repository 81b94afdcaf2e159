package stripe

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
)

// horizon is how long Stripe keeps an Idempotency-Key: at least 24 hours.
const horizon = 24 * time.Hour

// replayedHeader is the response header with which Stripe marks a replay
// of a stored response.
const replayedHeader = "Idempotent-Replayed"

// ErrReplayedServerError means Stripe answered with a 5xx that it had
// stored for the key earlier and now replays: the outcome of the first
// request is unknown, and retrying the same key cannot resolve it while
// Stripe keeps the key (at least 24 h); a retry after that executes again
// and may duplicate. The error Apply returns matches it and
// [effects.ErrPoison] (a delivery no retry can handle), so it is
// in class [effects.Permanent]: dead-letter the message and reconcile the
// outcome with Stripe (webhooks, the Dashboard, a metadata search). The
// *stripe.Error is reachable with errors.As.
var ErrReplayedServerError = errors.New("stripe replayed a stored server error for this idempotency key; the outcome is unknown and retrying the key cannot resolve it: reconcile")

// Option configures an effect built by [New] or [NewPaymentIntents]. A nil
// Option is ignored.
type Option interface{ apply(*config) }

type option func(*config)

func (f option) apply(c *config) { f(c) }

type config struct {
	journal journal.Journal
	jopts   []journal.Option
	api     *client.API
	apiSet  bool
}

// WithJournal makes the effect keep the id of every object it created in
// j, and replay it from there without calling Stripe, so keys stay
// effective past Stripe's 24 h horizon (the contract's Horizon becomes 0:
// until j prunes); opts set the journal's lease, record timeout, observer
// and logger ([journal.WithLease], [journal.WithRecordTimeout], ...). The
// call ends at nine tenths of the lease. See the package doc for how the
// journal and Stripe's key overlap, and why the journal's lease does not
// gate the call. The journal runs [journal.Journaled]'s protocol and
// policy.
func WithJournal(j journal.Journal, opts ...journal.Option) Option {
	return option(func(c *config) { c.journal, c.jopts = j, opts })
}

// WithCheckClient gives an effect built by [New] the stripe-go client its
// Check probes the API key with (see [Effect.Check]): pass the client
// whose method New was given. [NewPaymentIntents] uses its own client
// and needs no such option. api must not be nil.
func WithCheckClient(api *client.API) Option {
	return option(func(c *config) { c.api, c.apiSet = api, true })
}

// effect is what every Stripe effect shares: its name, the journaled
// protocol (with or without a journal) and the contract.
type effect struct {
	op       string // "stripe.PaymentIntents.Apply"
	j        *journal.Journaled
	contract effects.Contract
	api      *client.API // what Check probes with; nil: nothing to probe
}

// newEffect validates opts once for the constructor ctor.
func newEffect(ctor, op string, opts []Option) (effect, error) {
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if cfg.apiSet && (cfg.api == nil || cfg.api.Balance == nil) {
		return effect{}, effects.ConfigErrorf(ctor, "WithCheckClient", "nil or uninitialised *client.API; build it with client.New")
	}
	jopts := append(cfg.jopts[:len(cfg.jopts):len(cfg.jopts)], journal.WithOwnerIdempotency(), journal.WithNotApplied(notApplied))
	j, err := journal.NewJournaled(op, cfg.journal, jopts...)
	if err != nil {
		return effect{}, err
	}
	e := effect{op: op, j: j, api: cfg.api, contract: effects.Contract{
		Guarantee:       effects.EffectivelyOnce,
		Enforcer:        "stripe: Idempotency-Key, kept by Stripe for at least 24h",
		Horizon:         horizon,
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
			// The params cannot be told apart from others (a string that
			// is not UTF-8): refused before any request.
			return effects.Result{}, effects.Refused(e.op, key,
				fmt.Errorf("refused before sending, since no journal could tell it from other params: %w", err))
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
		return effects.Result{}, e.classify(ctx, key, err)
	}
	res := effects.Result{Status: effects.Applied, Ref: id}
	if resp != nil && resp.Header.Get(replayedHeader) == "true" {
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
