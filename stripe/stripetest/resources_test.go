package stripetest_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	stripego "github.com/stripe/stripe-go/v76"

	"effectively.dev/effects"
	"effectively.dev/stripe/stripetest"
)

// Every resource goes through the same idempotency layer: a first create,
// a replay under the key, 400 idempotency_error for other parameters, and
// nothing stored for a request that failed validation.
func TestResourcesFollowTheIdempotencyRules(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)
	type created struct {
		id, object string
		resp       *stripego.APIResponse
	}
	for _, tc := range []struct {
		name, prefix string
		create       func(key string, variant int) (created, error)
		invalid      func(key string) error // fails validation
		get          func(id string) (string, error)
	}{
		{
			name: "customers", prefix: "cus_",
			create: func(key string, v int) (created, error) {
				p := &stripego.CustomerParams{Email: stripego.String("ada@example.com"), Name: stripego.String("Ada")}
				if v == 1 {
					p.Name = stripego.String("Ada L.")
				}
				p.AddMetadata("account", "acct-7")
				p.SetIdempotencyKey(key)
				c, err := api.Customers.New(p)
				if err != nil {
					return created{}, err
				}
				if c.Email != "ada@example.com" || c.Metadata["account"] != "acct-7" {
					t.Errorf("customer %+v", c)
				}
				return created{c.ID, c.Object, c.LastResponse}, nil
			},
			invalid: func(key string) error {
				p := &stripego.CustomerParams{Email: stripego.String("not an address")}
				p.SetIdempotencyKey(key)
				_, err := api.Customers.New(p)
				return err
			},
			get: func(id string) (string, error) {
				c, err := api.Customers.Get(id, nil)
				if err != nil {
					return "", err
				}
				return c.ID, nil
			},
		},
		{
			name: "transfers", prefix: "tr_",
			create: func(key string, v int) (created, error) {
				p := &stripego.TransferParams{Amount: stripego.Int64(700 + int64(v)), Currency: stripego.String("usd"),
					Destination: stripego.String("acct_1Seller"), TransferGroup: stripego.String("order-7")}
				p.SetIdempotencyKey(key)
				tr, err := api.Transfers.New(p)
				if err != nil {
					return created{}, err
				}
				if tr.Amount != 700+int64(v) || tr.Destination == nil || tr.Destination.ID != "acct_1Seller" || tr.TransferGroup != "order-7" {
					t.Errorf("transfer %+v", tr)
				}
				return created{tr.ID, tr.Object, tr.LastResponse}, nil
			},
			invalid: func(key string) error {
				p := &stripego.TransferParams{Amount: stripego.Int64(700), Currency: stripego.String("usd"), Destination: stripego.String("cus_1")}
				p.SetIdempotencyKey(key)
				_, err := api.Transfers.New(p)
				return err
			},
			get: func(id string) (string, error) {
				tr, err := api.Transfers.Get(id, nil)
				if err != nil {
					return "", err
				}
				return tr.ID, nil
			},
		},
		{
			name: "checkout sessions", prefix: "cs_test_",
			create: func(key string, v int) (created, error) {
				p := &stripego.CheckoutSessionParams{
					Mode:       stripego.String(string(stripego.CheckoutSessionModePayment)),
					SuccessURL: stripego.String("https://shop.example/ok"),
					LineItems:  []*stripego.CheckoutSessionLineItemParams{{Price: stripego.String("price_1"), Quantity: stripego.Int64(1 + int64(v))}},
				}
				p.SetIdempotencyKey(key)
				cs, err := api.CheckoutSessions.New(p)
				if err != nil {
					return created{}, err
				}
				if cs.Mode != stripego.CheckoutSessionModePayment || cs.Status != stripego.CheckoutSessionStatusOpen ||
					!strings.HasSuffix(cs.URL, cs.ID) || cs.SuccessURL != "https://shop.example/ok" {
					t.Errorf("checkout session %+v", cs)
				}
				return created{cs.ID, cs.Object, cs.LastResponse}, nil
			},
			invalid: func(key string) error {
				p := &stripego.CheckoutSessionParams{Mode: stripego.String("payment"), SuccessURL: stripego.String("https://shop.example/ok")}
				p.SetIdempotencyKey(key) // no line items
				_, err := api.CheckoutSessions.New(p)
				return err
			},
			get: func(id string) (string, error) {
				cs, err := api.CheckoutSessions.Get(id, nil)
				if err != nil {
					return "", err
				}
				return cs.ID, nil
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "key-" + tc.name
			first, err := tc.create(key, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(first.id, tc.prefix) || replayed(first.resp) {
				t.Fatalf("first create: id %q, replayed %v", first.id, replayed(first.resp))
			}
			again, err := tc.create(key, 0)
			if err != nil || again.id != first.id || !replayed(again.resp) {
				t.Fatalf("same key again: %+v, %v; want %s replayed", again, err, first.id)
			}
			_, err = tc.create(key, 1)
			stripeErr(t, err, 400, stripego.ErrorTypeIdempotency)
			if id, err := tc.get(first.id); err != nil || id != first.id {
				t.Errorf("GET %s: %q, %v", first.id, id, err)
			}
			wantCreated(t, srv, key, 1)

			// Validation failures store nothing: the corrected request
			// executes under the same key.
			fixKey := "fix-" + tc.name
			stripeErr(t, tc.invalid(fixKey), 400, stripego.ErrorTypeInvalidRequest)
			fixed, err := tc.create(fixKey, 0)
			if err != nil || replayed(fixed.resp) {
				t.Fatalf("corrected request under the same key: %v, want a fresh success", err)
			}
			wantCreated(t, srv, fixKey, 1)
		})
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	for name, opt := range map[string]stripetest.Option{
		"WithClock":   stripetest.WithClock(nil),
		"WithLatency": stripetest.WithLatency(-time.Millisecond),
	} {
		srv, err := stripetest.New(opt)
		var ce *effects.ConfigError
		if !errors.As(err, &ce) || ce.Option != name || srv != nil {
			t.Errorf("%s: %v, want a *ConfigError naming it", name, err)
		}
	}
	srv, err := stripetest.New(nil, stripetest.WithLatency(0), nil)
	if err != nil {
		t.Fatalf("nil options: %v, want them ignored", err)
	}
	srv.Close()
}
