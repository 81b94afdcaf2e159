package stripe

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"effectively.dev/effects"
	"effectively.dev/stripe/stripetest"
)

// TestEveryFailureHasOneClass: each way Stripe (stripetest) can refuse or
// fail a request gives an error in the class the package doc names, with
// the sentinel a consumer branches on, and a text that summarizes
// Stripe's answer instead of quoting stripe-go's JSON.
func TestEveryFailureHasOneClass(t *testing.T) {
	srv := stripetest.Start(t)
	ctx := context.Background()
	declined := PaymentIntent{Amount: 2000, Currency: "usd", PaymentMethod: "pm_card_chargeDeclined", Confirm: true}
	for _, tc := range []struct {
		name  string
		apply func(t *testing.T) error
		class effects.Class
		is    error
	}{
		{"card declined", func(t *testing.T) error {
			_, err := newPI(t, newAPI(t, srv, nil)).Apply(ctx, "declined", declined)
			return err
		}, effects.Permanent, effects.ErrRefused},
		{"card declined, replayed", func(t *testing.T) error {
			_, err := newPI(t, newAPI(t, srv, nil)).Apply(ctx, "declined", declined)
			return err
		}, effects.Permanent, effects.ErrRefused},
		{"invalid request", func(t *testing.T) error {
			_, err := newPI(t, newAPI(t, srv, nil)).Apply(ctx, "no-currency", PaymentIntent{Amount: 2000})
			return err
		}, effects.Permanent, effects.ErrRefused},
		{"key reused", func(t *testing.T) error {
			charges := newPI(t, newAPI(t, srv, nil))
			if _, err := charges.Apply(ctx, "reused", order); err != nil {
				t.Fatal(err)
			}
			other := order
			other.Amount++
			_, err := charges.Apply(ctx, "reused", other)
			return err
		}, effects.Permanent, effects.ErrKeyReused},
		{"first 500", func(t *testing.T) error {
			srv.FailNext(1, 500)
			_, err := newPI(t, newAPI(t, srv, nil)).Apply(ctx, "k500", order)
			return err
		}, effects.Retryable, effects.ErrAmbiguous},
		{"replayed 500", func(t *testing.T) error {
			_, err := newPI(t, newAPI(t, srv, nil)).Apply(ctx, "k500", order)
			if !errors.Is(err, ErrReplayedServerError) {
				t.Errorf("%v, want ErrReplayedServerError", err)
			}
			return err
		}, effects.Permanent, effects.ErrPoison},
		{"429", func(t *testing.T) error {
			srv.FailNext(1, 429)
			_, err := newPI(t, newAPI(t, srv, nil)).Apply(ctx, "k429", order)
			return err
		}, effects.Retryable, effects.ErrTransient},
		{"refused connection", func(t *testing.T) error {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			_, err = newPI(t, apiFor(t, "http://"+addr, stripetest.APIKey)).Apply(ctx, "refused", order)
			return err
		}, effects.Retryable, effects.ErrTransient},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.apply(t)
			if got := effects.ClassOf(err); got != tc.class || !errors.Is(err, tc.is) {
				t.Fatalf("%v: class %v, want %v matching %v", err, got, tc.class, tc.is)
			}
			if effects.ClassOf(err) == effects.Permanent == (effects.ClassOf(err) == effects.Retryable) {
				t.Errorf("Permanent %v and Retryable %v disagree", effects.ClassOf(err) == effects.Permanent, effects.ClassOf(err) == effects.Retryable)
			}
			var se *stripego.Error
			if errors.As(err, &se) && (strings.Contains(err.Error(), "{") || !strings.Contains(err.Error(), se.RequestID)) {
				t.Errorf("text %q: want a summary with the request id %s, not stripe-go's JSON", err, se.RequestID)
			}
		})
	}
}

// A decline is a *RequestError that a consumer dead-letters at once:
// effects.ClassOf (Permanent) and errors.Is(effects.ErrRefused) say so, and its text
// names the decline without Stripe's message.
func TestDeclineIsPermanent(t *testing.T) {
	srv := stripetest.Start(t)
	declined := PaymentIntent{Amount: 2000, Currency: "usd", PaymentMethod: "pm_card_chargeDeclinedInsufficientFunds", Confirm: true}
	_, err := newPI(t, newAPI(t, srv, nil)).Apply(context.Background(), "declined", declined)
	var re *RequestError
	if !errors.As(err, &re) || effects.ClassOf(err) != effects.Permanent || !errors.Is(err, effects.ErrRefused) {
		t.Fatalf("%v: want a permanent *RequestError matching ErrRefused", err)
	}
	for _, want := range []string{"HTTP 402", "card_error/card_declined/insufficient_funds", "(request req_"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("text %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), re.Err.Msg) {
		t.Errorf("text %q quotes Stripe's message", err)
	}
}

// A 429 with Retry-After is ErrTransient carrying the hint.
func TestRateLimitCarriesRetryAfter(t *testing.T) {
	srv := stripetest.Start(t)
	srv.RateLimitNext(1, 3*time.Second)
	_, err := newPI(t, newAPI(t, srv, nil)).Apply(context.Background(), "k", order)
	if d, ok := effects.RetryAfter(err); !errors.Is(err, effects.ErrTransient) || !ok || d != 3*time.Second {
		t.Errorf("%v: RetryAfter %v, %v; want ErrTransient with 3s", err, d, ok)
	}
}

// A revoked or rolled key (401) and a key without the permission (403)
// are configuration errors naming the API key: no retry and no dead
// letter helps, the worker must stop. Nothing is created.
func TestRefusedKeyIsAConfigurationError(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(*stripetest.Server)
	}{
		{"revoked (401)", func(s *stripetest.Server) { s.RevokeKey(stripetest.APIKey) }},
		{"rolled (401)", func(s *stripetest.Server) { s.RollKey(stripetest.APIKey, "sk_test_rolled_key") }},
		{"restricted (403)", func(s *stripetest.Server) { s.RestrictKey(stripetest.APIKey) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := stripetest.Start(t)
			tc.setup(srv)
			_, err := newPI(t, newAPI(t, srv, nil)).Apply(context.Background(), "k", order)
			var ce *effects.ConfigError
			if effects.ClassOf(err) != effects.InvalidConfig || !errors.As(err, &ce) || ce.Option != "API key" || errors.Is(err, effects.ErrRefused) {
				t.Fatalf("%v: want only a configuration error naming the API key", err)
			}
			if srv.Total() != 0 {
				t.Errorf("%d objects created", srv.Total())
			}
		})
	}
}

// Check probes the key with one GET and creates nothing: a good key
// passes, a revoked one is a configuration error, a restricted one passes
// (it authenticates; its first Apply says what it may not do), a server
// that is down is retryable.
func TestCheck(t *testing.T) {
	ctx := context.Background()
	srv := stripetest.Start(t)
	api := newAPI(t, srv, nil)
	if err := newPI(t, api).Check(ctx); err != nil || srv.Requests() != 1 || srv.Total() != 0 {
		t.Fatalf("good key: %v after %d requests and %d objects, want nil after one GET", err, srv.Requests(), srv.Total())
	}
	if err := newRefunds(t, api).Check(ctx); err != nil {
		t.Errorf("refunds, good key: %v", err)
	}
	customers, err := New(api.Customers.New)
	if err != nil {
		t.Fatal(err)
	}
	before := srv.Requests()
	if err := customers.Check(ctx); err != nil || srv.Requests() != before {
		t.Errorf("New without WithCheckClient: %v after %d requests, want nil and none", err, srv.Requests()-before)
	}

	srv.RestrictKey(stripetest.APIKey)
	if err := newPI(t, api).Check(ctx); err != nil {
		t.Errorf("restricted key: %v, want nil (it authenticates)", err)
	}

	srv.RevokeKey(stripetest.APIKey)
	checked, err := New(api.Customers.New, WithCheckClient(api))
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]effects.Checker{"payment intents": newPI(t, api), "refunds": newRefunds(t, api), "generic": checked} {
		err := c.Check(ctx)
		var ce *effects.ConfigError
		if effects.ClassOf(err) != effects.InvalidConfig || !errors.As(err, &ce) || ce.Option != "API key" || !strings.Contains(err.Error(), ".Check") {
			t.Errorf("%s, revoked key: %v, want a configuration error naming the API key", name, err)
		}
	}

	down := stripetest.Start(t)
	downAPI := newAPI(t, down, nil)
	down.Close()
	if err := newPI(t, downAPI).Check(ctx); effects.ClassOf(err) != effects.Retryable {
		t.Errorf("server down: %v, want a retryable error", err)
	}
}

// apiFor is a stripe-go client for url with key, without retries, closed
// when t ends.
func apiFor(t *testing.T, url, key string) *client.API {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	b := stripego.GetBackendWithConfig(stripego.APIBackend, &stripego.BackendConfig{
		URL:               stripego.String(url),
		HTTPClient:        &http.Client{Transport: tr},
		MaxNetworkRetries: stripego.Int64(0),
		LeveledLogger:     &stripego.LeveledLogger{Level: stripego.LevelNull},
	})
	return client.New(key, &stripego.Backends{API: b, Connect: b, Uploads: b})
}

func TestWithCheckClientRefusesNil(t *testing.T) {
	api := newAPI(t, stripetest.Start(t), nil)
	_, err := New(api.Customers.New, WithCheckClient(nil))
	var ce *effects.ConfigError
	if !errors.As(err, &ce) || ce.Option != "WithCheckClient" {
		t.Errorf("%v, want a ConfigError naming WithCheckClient", err)
	}
}
