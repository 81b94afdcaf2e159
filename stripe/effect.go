package stripe

import (
	"context"
	"reflect"

	stripego "github.com/stripe/stripe-go/v76"

	"effectively.dev/effects"
)

// Effect is an [effects.Effect] over one stripe-go POST: Customers,
// Transfers, Payouts, Invoices, Subscriptions, Checkout Sessions, a
// PaymentIntent's confirmation or capture, anything stripe-go sends with
// a params struct. Its input is that params struct (P, e.g.
// *stripe.CustomerParams); Apply sends it with the effect's key as
// Idempotency-Key and returns the object's id as Result.Ref. Everything
// the package doc says about errors, the journal and the horizon holds
// for every Effect. Build one with [New]; it is safe for concurrent use.
type Effect[P stripego.ParamsContainer] struct {
	e     effect
	elem  reflect.Type // the params struct P points to
	ptype string       // P's type, part of the fingerprint
	post  func(P) (id string, resp *stripego.APIResponse, err error)
}

// New returns the effect of post, a stripe-go method that POSTs params P
// and returns the object O it created or changed:
//
//	customers, err := stripe.New(api.Customers.New)
//	res, err := customers.Apply(ctx, key, &stripego.CustomerParams{Email: stripego.String("ada@example.com")})
//	// res.Ref is "cus_...", the same on every redelivery
//
// A call that needs more than the params (an id in the path, such as
// api.PaymentIntents.Confirm) takes a params type of its own that embeds
// stripe-go's, so that the whole request is the effect's input and part
// of its fingerprint:
//
//	type Confirm struct {
//		ID string // the PaymentIntent to confirm
//		stripego.PaymentIntentConfirmParams
//	}
//	confirm, err := stripe.New(func(c *Confirm) (*stripego.PaymentIntent, error) {
//		return api.PaymentIntents.Confirm(c.ID, &c.PaymentIntentConfirmParams)
//	})
//
// P must be a pointer to a struct embedding stripego.Params (every
// stripe-go params type is), and O a pointer to a stripe-go object with an
// ID and a LastResponse (every stripe-go resource is); New checks both,
// and post, and returns a *[effects.ConfigError] otherwise.
//
// Apply never changes the params it is given: it sends a shallow copy that
// carries the key and the context. A nil params pointer sends no
// parameters. With a journal, the fingerprint is every field of the params
// (as JSON: those stripe-go sends in the body, the Stripe-Account and
// Stripe-Version headers, and fields of your own such as an id in the
// path) and the params type. Use one Effect per kind of call: a key used
// with another call is key reuse, at Stripe as in the journal.
func New[P stripego.ParamsContainer, O any](post func(P) (O, error), opts ...Option) (*Effect[P], error) {
	name := reflect.TypeFor[O]()
	if name.Kind() == reflect.Pointer {
		name = name.Elem()
	}
	return newGeneric("stripe.New", "stripe."+name.Name()+".Apply", post, opts)
}

// newGeneric is New with the constructor's and the operation's names.
func newGeneric[P stripego.ParamsContainer, O any](ctor, op string, post func(P) (O, error), opts []Option) (*Effect[P], error) {
	if post == nil {
		return nil, effects.ConfigErrorf(ctor, "post", "nil; pass a stripe-go method such as api.Customers.New")
	}
	pt, ot := reflect.TypeFor[P](), reflect.TypeFor[O]()
	if pt.Kind() != reflect.Pointer || pt.Elem().Kind() != reflect.Struct {
		return nil, effects.ConfigErrorf(ctor, "post", "its parameter %s is not a pointer to a stripe-go params struct", pt)
	}
	if ot.Kind() != reflect.Pointer || ot.Elem().Kind() != reflect.Struct {
		return nil, effects.ConfigErrorf(ctor, "post", "its result %s is not a pointer to a stripe-go object", ot)
	}
	idField, ok := ot.Elem().FieldByName("ID")
	if !ok || idField.Type.Kind() != reflect.String {
		return nil, effects.ConfigErrorf(ctor, "post", "its result %s has no string ID", ot)
	}
	respField, ok := ot.Elem().FieldByName("LastResponse")
	if !ok || respField.Type != reflect.TypeFor[*stripego.APIResponse]() {
		return nil, effects.ConfigErrorf(ctor, "post", "its result %s has no LastResponse (stripe-go's APIResource)", ot)
	}
	e, err := newEffect(ctor, op, opts)
	if err != nil {
		return nil, err
	}
	return &Effect[P]{
		e:     e,
		elem:  pt.Elem(),
		ptype: pt.String(),
		post: func(p P) (string, *stripego.APIResponse, error) {
			o, err := post(p)
			if err != nil {
				return "", nil, err
			}
			v := reflect.ValueOf(o)
			if !v.IsValid() || v.IsNil() {
				return "", nil, nil // "answered without an object id"
			}
			v = v.Elem()
			resp, _ := v.FieldByIndex(respField.Index).Interface().(*stripego.APIResponse)
			return v.FieldByIndex(idField.Index).String(), resp, nil
		},
	}, nil
}

// Contract declares EffectivelyOnce, enforced by Stripe's Idempotency-Key
// with a 24 h horizon and key-reuse detection; with [WithJournal], the
// horizon is 0 (until the journal prunes).
func (e *Effect[P]) Contract() effects.Contract { return e.e.contract }

// Apply sends params under key, or finds them sent: it returns Applied
// with the object's id the first time and Replayed with the same id
// afterwards. Errors are classified as the package doc describes.
func (e *Effect[P]) Apply(ctx context.Context, key effects.Key, params P) (effects.Result, error) {
	return e.apply(ctx, key, e.clone(params))
}

// apply runs one Apply on params that nobody else holds.
func (e *Effect[P]) apply(ctx context.Context, key effects.Key, params P) (effects.Result, error) {
	fingerprint := func() ([]byte, error) {
		// Every field of the request, those sent in the path too, as
		// JSON: deterministic (struct order, sorted maps), and without
		// what Apply sets itself.
		p := params.GetParams()
		p.Context, p.IdempotencyKey = nil, nil
		return effects.FingerprintJSON(struct {
			Params  string
			Request P
		}{e.ptype, params})
	}
	return e.e.apply(ctx, key, fingerprint, func(sp *stripego.Params) (string, *stripego.APIResponse, error) {
		p := params.GetParams()
		p.Context, p.IdempotencyKey = sp.Context, sp.IdempotencyKey
		return e.post(params)
	})
}

// clone returns a shallow copy of params (a new zero value for nil), so
// that setting the key and the context never touches the caller's.
func (e *Effect[P]) clone(params P) P {
	cp := reflect.New(e.elem)
	if v := reflect.ValueOf(params); v.IsValid() && !v.IsNil() {
		cp.Elem().Set(v.Elem())
	}
	return cp.Interface().(P)
}
