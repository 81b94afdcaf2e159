package stripe

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/stripe/stripetest"
)

// The generic effect on three resources other than PaymentIntents and
// refunds (TestRefunds), without and with a journal: one object per key,
// replays with its id, reuse refused, past Stripe's horizon too when
// journaled.
func TestGenericEffectOnMoreResources(t *testing.T) {
	type resource struct {
		name, prefix string
		// apply builds the effect (with opts) and applies variant v.
		build func(api *client.API, opts ...Option) func(ctx context.Context, key effects.Key, v int) (effects.Result, error)
	}
	resources := []resource{
		{"customers", "cus_", func(api *client.API, opts ...Option) func(context.Context, effects.Key, int) (effects.Result, error) {
			e := must(New(api.Customers.New, opts...))
			return func(ctx context.Context, key effects.Key, v int) (effects.Result, error) {
				p := &stripego.CustomerParams{Email: stripego.String("ada@example.com"), Name: stripego.String(strings.Repeat("Ada", v+1))}
				p.AddMetadata("effect_key", string(key))
				return e.Apply(ctx, key, p)
			}
		}},
		{"transfers", "tr_", func(api *client.API, opts ...Option) func(context.Context, effects.Key, int) (effects.Result, error) {
			e := must(New(api.Transfers.New, opts...))
			return func(ctx context.Context, key effects.Key, v int) (effects.Result, error) {
				return e.Apply(ctx, key, &stripego.TransferParams{Amount: stripego.Int64(1000 + int64(v)),
					Currency: stripego.String("usd"), Destination: stripego.String("acct_seller")})
			}
		}},
		{"checkout sessions", "cs_test_", func(api *client.API, opts ...Option) func(context.Context, effects.Key, int) (effects.Result, error) {
			e := must(New(api.CheckoutSessions.New, opts...))
			return func(ctx context.Context, key effects.Key, v int) (effects.Result, error) {
				return e.Apply(ctx, key, &stripego.CheckoutSessionParams{
					Mode:       stripego.String("payment"),
					SuccessURL: stripego.String("https://shop.example/ok"),
					LineItems:  []*stripego.CheckoutSessionLineItemParams{{Price: stripego.String("price_1"), Quantity: stripego.Int64(1 + int64(v))}},
				})
			}
		}},
	}
	for _, r := range resources {
		t.Run(r.name, func(t *testing.T) {
			clk := newClock()
			srv := stripetest.Start(t, stripetest.WithClock(clk.Now))
			j := memjournal.New(clk.Now)
			plain := r.build(newAPI(t, srv, nil))
			journaled := r.build(newAPI(t, srv, nil), WithJournal(j))
			ctx := context.Background()

			key := effects.MustKey("test", r.name, "plain")
			first, err := plain(ctx, key, 0)
			if err != nil || first.Status != effects.Applied || !strings.HasPrefix(first.Ref, r.prefix) {
				t.Fatalf("first Apply: %+v, %v", first, err)
			}
			again, err := plain(ctx, key, 0)
			if err != nil || again.Status != effects.Replayed || again.Ref != first.Ref {
				t.Fatalf("redelivery: %+v, %v; want replayed %s", again, err, first.Ref)
			}
			if _, err := plain(ctx, key, 1); !errors.Is(err, effects.ErrKeyReused) || effects.ClassOf(err) == effects.Retryable {
				t.Fatalf("other params under the key: %v, want a permanent ErrKeyReused", err)
			}
			if n := srv.Created(string(key)); n != 1 {
				t.Fatalf("%d objects for the key, want 1", n)
			}

			jkey := effects.MustKey("test", r.name, "journaled")
			jfirst, err := journaled(ctx, jkey, 0)
			if err != nil || jfirst.Status != effects.Applied {
				t.Fatalf("journaled Apply: %+v, %v", jfirst, err)
			}
			if rec := j.Get(jkey); !rec.Done || rec.Ref != jfirst.Ref {
				t.Fatalf("journal record %+v, want done with %s", rec, jfirst.Ref)
			}
			clk.Advance(30 * 24 * time.Hour) // Stripe forgot the key
			before := srv.Requests()
			late, err := journaled(ctx, jkey, 0)
			if err != nil || late.Status != effects.Replayed || late.Ref != jfirst.Ref || srv.Requests() != before {
				t.Fatalf("after Stripe's horizon: %+v, %v, %d requests; want replayed from the journal", late, err, srv.Requests()-before)
			}
			if _, err := journaled(ctx, jkey, 1); !errors.Is(err, effects.ErrKeyReused) || srv.Requests() != before {
				t.Errorf("reuse past the horizon: %v", err)
			}
			if n := srv.Created(string(jkey)); n != 1 {
				t.Errorf("%d objects for the journaled key, want 1", n)
			}
		})
	}
}

func TestGenericEffectDoesNotTouchTheCallersParams(t *testing.T) {
	srv := stripetest.Start(t)
	customers := must(New(newAPI(t, srv, nil).Customers.New))
	p := &stripego.CustomerParams{Email: stripego.String("ada@example.com")}
	p.SetIdempotencyKey("the caller's own key")
	res, err := customers.Apply(context.Background(), "effect-key", p)
	if err != nil {
		t.Fatal(err)
	}
	if *p.IdempotencyKey != "the caller's own key" || p.Context != nil {
		t.Errorf("Apply changed the caller's params: key %q, context %v", *p.IdempotencyKey, p.Context)
	}
	if srv.Created("effect-key") != 1 || srv.Created("the caller's own key") != 0 {
		t.Errorf("Stripe saw the wrong key")
	}
	// A nil params pointer is an empty request, still under the key.
	empty, err := customers.Apply(context.Background(), "empty", nil)
	if err != nil || empty.Status != effects.Applied || srv.Created("empty") != 1 || empty.Ref == res.Ref {
		t.Errorf("nil params: %+v, %v", empty, err)
	}
}

// Fields of the caller's own params type (an id sent in the path) are part
// of the journal's fingerprint.
func TestGenericEffectFingerprintCoversFieldsNotSent(t *testing.T) {
	srv := stripetest.Start(t)
	api := newAPI(t, srv, nil)
	type payout struct {
		Order string
		stripego.TransferParams
	}
	e := must(New(func(p *payout) (*stripego.Transfer, error) { return api.Transfers.New(&p.TransferParams) },
		WithJournal(memjournal.New(nil))))
	in := func(order string) *payout {
		return &payout{Order: order, TransferParams: stripego.TransferParams{
			Amount: stripego.Int64(500), Currency: stripego.String("usd"), Destination: stripego.String("acct_1")}}
	}
	if _, err := e.Apply(context.Background(), "payout", in("order-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Apply(context.Background(), "payout", in("order-2")); !errors.Is(err, effects.ErrKeyReused) {
		t.Errorf("same key, same body, another order: %v, want ErrKeyReused from the journal", err)
	}
}

func TestConstructorsRefuseBadConfiguration(t *testing.T) {
	api := newAPI(t, stripetest.Start(t), nil)
	var nilPost func(*stripego.CustomerParams) (*stripego.Customer, error)
	type noID struct{ stripego.APIResource }
	type noResponse struct{ ID string }
	for _, tc := range []struct {
		name, option string
		err          error
	}{
		{"nil api", "api", second(NewPaymentIntents(nil))},
		{"uninitialised api", "api", second(NewPaymentIntents(&client.API{}))},
		{"zero lease", "WithLease", second(NewPaymentIntents(api, WithJournal(memjournal.New(nil), journal.WithLease(0))))},
		{"nil logger", "WithLogger", second(NewPaymentIntents(api, WithJournal(memjournal.New(nil), journal.WithLogger(nil))))},
		{"uninitialised check client", "WithCheckClient", second(New(api.Refunds.New, WithCheckClient(&client.API{})))},
		{"nil post", "post", second(New(nilPost))},
		{"object without ID", "post", second(New(func(*stripego.CustomerParams) (*noID, error) { return nil, nil }))},
		{"object without LastResponse", "post", second(New(func(*stripego.CustomerParams) (*noResponse, error) { return nil, nil }))},
		{"object not a pointer", "post", second(New(func(*stripego.CustomerParams) (stripego.Customer, error) { return stripego.Customer{}, nil }))},
	} {
		var ce *effects.ConfigError
		if !errors.As(tc.err, &ce) || ce.Option != tc.option {
			t.Errorf("%s: %v, want a *ConfigError naming %s", tc.name, tc.err, tc.option)
		}
	}
	if _, err := NewPaymentIntents(api, nil, WithJournal(nil, journal.WithLease(time.Second)), nil); err != nil {
		t.Errorf("nil options: %v, want them ignored", err)
	}
}

func second[T any](_ T, err error) error { return err }

// A TLS handshake no retry can fix is a configuration error, not an
// endless transient retry.
func TestRefusedTLSIsAConfigurationError(t *testing.T) {
	untrusted := httptest.NewUnstartedServer(http.NotFoundHandler())
	untrusted.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	untrusted.StartTLS()
	defer untrusted.Close()
	plain := httptest.NewServer(http.NotFoundHandler())
	defer plain.Close()
	for name, url := range map[string]string{
		"certificate not trusted": untrusted.URL,
		"TLS to a plain port":     strings.Replace(plain.URL, "http://", "https://", 1),
		"no scheme":               strings.TrimPrefix(plain.URL, "http://"),
	} {
		t.Run(name, func(t *testing.T) {
			tr := &http.Transport{TLSClientConfig: &tls.Config{}}
			defer tr.CloseIdleConnections()
			b := stripego.GetBackendWithConfig(stripego.APIBackend, &stripego.BackendConfig{
				URL:               stripego.String(url),
				HTTPClient:        &http.Client{Transport: tr},
				MaxNetworkRetries: stripego.Int64(0),
				LeveledLogger:     &stripego.LeveledLogger{Level: stripego.LevelNull},
			})
			j := memjournal.New(nil)
			charges := newPI(t, client.New(stripetest.APIKey, &stripego.Backends{API: b, Connect: b, Uploads: b}), WithJournal(j))
			_, err := charges.Apply(context.Background(), "k", order)
			var ce *effects.ConfigError
			if !errors.Is(err, effects.ErrInvalidConfig) || !errors.As(err, &ce) || effects.ClassOf(err) == effects.Retryable || errors.Is(err, effects.ErrTransient) {
				t.Fatalf("got %v, want a configuration error that is not retryable", err)
			}
			if !strings.Contains(err.Error(), "no retry fixes this") {
				t.Errorf("message %q does not say so", err)
			}
			if rec := j.Get("k"); rec.Done || rec.Attempt != 0 || j.Releases() != 0 {
				t.Errorf("journal %+v after %d releases, want no record: no lease is taken and nothing was applied", rec, j.Releases())
			}
		})
	}
}

// Stripe created the object but the journal could not record it: the
// truth is Applied (logged), and the next attempt, within Stripe's key
// horizon, reaches Stripe, which replays, and records the id.
func TestUnrecordedObjectIsAppliedAndRecordedByTheNextAttempt(t *testing.T) {
	srv := stripetest.Start(t)
	j := &failingComplete{Journal: memjournal.New(nil), fail: 1000}
	var logs bytes.Buffer
	charges := newPI(t, newAPI(t, srv, nil), WithJournal(j, journal.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))))
	key := effects.MustKey("test", "evt_1", "charge")
	first, err := charges.Apply(context.Background(), key, order)
	if err != nil || first.Status != effects.Applied {
		t.Fatalf("Apply = %+v, %v; want applied: Stripe has the PaymentIntent", first, err)
	}
	if !strings.Contains(logs.String(), "did not commit") || !strings.Contains(logs.String(), first.Ref) {
		t.Errorf("log %q does not report the unrecorded object", logs.String())
	}
	j.fail = 0
	again, err := charges.Apply(context.Background(), key, order)
	if err != nil || again.Status != effects.Replayed || again.Ref != first.Ref {
		t.Fatalf("redelivery = %+v, %v; want Stripe's replay", again, err)
	}
	if rec := j.Get(key); !rec.Done || rec.Ref != first.Ref {
		t.Errorf("journal %+v, want done with %s", rec, first.Ref)
	}
	if n := srv.Created(string(key)); n != 1 {
		t.Errorf("%d PaymentIntents, want 1", n)
	}
}

// failingComplete fails the next fail Complete or MarkDone calls with a
// retryable error.
type failingComplete struct {
	*memjournal.Journal
	fail int
}

func (j *failingComplete) Complete(ctx context.Context, key effects.Key, ref string) error {
	if j.fail > 0 {
		j.fail--
		return effects.Ambiguous("test.Complete", key, errors.New("reply lost"))
	}
	return j.Journal.Complete(ctx, key, ref)
}

func (j *failingComplete) MarkDone(ctx context.Context, key effects.Key, fp []byte, ref string) error {
	if j.fail > 0 {
		j.fail--
		return effects.Ambiguous("test.MarkDone", key, errors.New("reply lost"))
	}
	return j.Journal.MarkDone(ctx, key, fp, ref)
}
