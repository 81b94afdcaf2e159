package stripetest_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
	"go.uber.org/goleak"

	"effectively.dev/stripe/stripetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newClient returns a stripe-go client for srv on its own transport,
// whose idle connections are closed when t ends.
func newClient(t *testing.T, srv *stripetest.Server) *client.API {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return srv.Client(&http.Client{Transport: tr})
}

// clientWithKey is newClient with another API key (another account).
func clientWithKey(t *testing.T, srv *stripetest.Server, apiKey string) *client.API {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	b := stripego.GetBackendWithConfig(stripego.APIBackend, &stripego.BackendConfig{
		URL:               stripego.String(srv.URL),
		HTTPClient:        &http.Client{Transport: tr},
		MaxNetworkRetries: stripego.Int64(0),
		EnableTelemetry:   stripego.Bool(false),
		LeveledLogger:     &stripego.LeveledLogger{Level: stripego.LevelNull},
	})
	return client.New(apiKey, &stripego.Backends{API: b, Connect: b, Uploads: b})
}

func piParams(key string, amount int64) *stripego.PaymentIntentParams {
	p := &stripego.PaymentIntentParams{Amount: stripego.Int64(amount), Currency: stripego.String("usd")}
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return p
}

func charged(key string, amount int64) *stripego.PaymentIntentParams {
	p := piParams(key, amount)
	p.Confirm = stripego.Bool(true)
	p.PaymentMethod = stripego.String("pm_card_visa")
	return p
}

func replayed(r *stripego.APIResponse) bool {
	return r != nil && r.Header.Get("Idempotent-Replayed") == "true"
}

// stripeErr asserts that err is a *stripe.Error with status and type.
func stripeErr(t *testing.T, err error, status int, typ stripego.ErrorType) *stripego.Error {
	t.Helper()
	var se *stripego.Error
	if !errors.As(err, &se) {
		t.Fatalf("got %v (%T), want a *stripe.Error with status %d", err, err, status)
	}
	if se.HTTPStatusCode != status || se.Type != typ {
		t.Fatalf("got status %d type %q (%s), want %d %q", se.HTTPStatusCode, se.Type, se.Msg, status, typ)
	}
	return se
}

func wantCreated(t *testing.T, srv *stripetest.Server, key string, n int) {
	t.Helper()
	if got := srv.Created(key); got != n {
		t.Errorf("Created(%q) = %d, want %d", key, got, n)
	}
}

func TestCreatesPaymentIntentShapedForStripeGo(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)
	p := piParams("k1", 2000)
	p.Customer = stripego.String("cus_123")
	p.AddMetadata("order", "o-1")
	pi, err := api.PaymentIntents.New(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(pi.ID, "pi_") || pi.Object != "payment_intent" || pi.Amount != 2000 ||
		pi.Currency != "usd" || pi.Customer == nil || pi.Customer.ID != "cus_123" ||
		pi.Status != stripego.PaymentIntentStatusRequiresPaymentMethod || pi.Metadata["order"] != "o-1" {
		t.Errorf("unexpected PaymentIntent %+v", pi)
	}
	if replayed(pi.LastResponse) {
		t.Error("first response marked as replayed")
	}
	if pi.LastResponse.IdempotencyKey != "k1" || !strings.HasPrefix(pi.LastResponse.RequestID, "req_") {
		t.Errorf("headers: Idempotency-Key %q, Request-Id %q", pi.LastResponse.IdempotencyKey, pi.LastResponse.RequestID)
	}
	got, err := api.PaymentIntents.Get(pi.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != pi.ID || got.Amount != 2000 {
		t.Errorf("GET returned %+v", got)
	}
	_, err = api.PaymentIntents.Get("pi_missing", nil)
	if se := stripeErr(t, err, 404, stripego.ErrorTypeInvalidRequest); se.Code != stripego.ErrorCodeResourceMissing {
		t.Errorf("code %q, want resource_missing", se.Code)
	}
	wantCreated(t, srv, "k1", 1)
	if srv.Total() != 1 || srv.CreatedWithMetadata("order", "o-1") != 1 {
		t.Errorf("Total %d, CreatedWithMetadata %d, want 1, 1", srv.Total(), srv.CreatedWithMetadata("order", "o-1"))
	}
}

func TestConfirmSucceeds(t *testing.T) {
	srv := stripetest.Start(t)
	pi, err := newClient(t, srv).PaymentIntents.New(charged("k", 1500))
	if err != nil {
		t.Fatal(err)
	}
	if pi.Status != stripego.PaymentIntentStatusSucceeded || pi.AmountReceived != 1500 || pi.LatestCharge == nil ||
		!strings.HasPrefix(pi.LatestCharge.ID, "ch_") {
		t.Errorf("confirmed PaymentIntent: status %s, received %d, charge %v", pi.Status, pi.AmountReceived, pi.LatestCharge)
	}
}

func TestSameKeyReplaysTheFirstResponse(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)
	first, err := api.PaymentIntents.New(piParams("k", 2000))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		again, err := api.PaymentIntents.New(piParams("k", 2000))
		if err != nil {
			t.Fatal(err)
		}
		if again.ID != first.ID || !replayed(again.LastResponse) {
			t.Errorf("retry %d: id %s replayed %v, want %s replayed", i, again.ID, replayed(again.LastResponse), first.ID)
		}
		if again.LastResponse.Header.Get("Original-Request") != first.LastResponse.RequestID {
			t.Errorf("Original-Request %q, want %q", again.LastResponse.Header.Get("Original-Request"), first.LastResponse.RequestID)
		}
	}
	wantCreated(t, srv, "k", 1)
}

func TestSameKeyOtherParametersIsAnIdempotencyError(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)
	if _, err := api.PaymentIntents.New(piParams("k", 2000)); err != nil {
		t.Fatal(err)
	}
	_, err := api.PaymentIntents.New(piParams("k", 2001))
	stripeErr(t, err, 400, stripego.ErrorTypeIdempotency)
	var ie *stripego.IdempotencyError
	if !errors.As(err, &ie) {
		t.Errorf("stripe-go did not type it as *stripe.IdempotencyError: %T", err)
	}
	// The mismatch stored nothing: the original parameters still replay.
	again, err := api.PaymentIntents.New(piParams("k", 2000))
	if err != nil || !replayed(again.LastResponse) {
		t.Errorf("original parameters after a mismatch: %v, replayed %v", err, err == nil && replayed(again.LastResponse))
	}
	wantCreated(t, srv, "k", 1)
}

func TestSameKeyOtherEndpointIsAnIdempotencyError(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)
	pi, err := api.PaymentIntents.New(charged("k", 2000))
	if err != nil {
		t.Fatal(err)
	}
	rp := &stripego.RefundParams{PaymentIntent: stripego.String(pi.ID)}
	rp.SetIdempotencyKey("k")
	_, err = api.Refunds.New(rp)
	se := stripeErr(t, err, 400, stripego.ErrorTypeIdempotency)
	if !strings.Contains(se.Msg, "same endpoint") {
		t.Errorf("message %q does not name the endpoint", se.Msg)
	}
}

func TestConcurrentSameKeyIsInUse(t *testing.T) {
	srv := stripetest.Start(t, stripetest.WithLatency(300*time.Millisecond))
	api := newClient(t, srv)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ok   []string
		errs []error
	)
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pi, err := api.PaymentIntents.New(piParams("k", 2000))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else {
				ok = append(ok, pi.ID)
			}
		}()
		time.Sleep(50 * time.Millisecond) // the first one is executing
	}
	wg.Wait()
	if len(ok) != 1 || len(errs) != 1 {
		t.Fatalf("%d succeeded, %d failed (%v), want 1 and 1", len(ok), len(errs), errs)
	}
	se := stripeErr(t, errs[0], 409, stripego.ErrorTypeInvalidRequest)
	if se.Code != stripego.ErrorCodeIdempotencyKeyInUse {
		t.Errorf("code %q, want idempotency_key_in_use", se.Code)
	}
	// The 409 stored nothing; once the first finished, the key replays it.
	again, err := api.PaymentIntents.New(piParams("k", 2000))
	if err != nil || again.ID != ok[0] || !replayed(again.LastResponse) {
		t.Errorf("after the 409: %v, id %s, want a replay of %s", err, again.ID, ok[0])
	}
	wantCreated(t, srv, "k", 1)
}

func TestServerErrorIsStoredAndReplayed(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)
	srv.FailNext(1, 500)
	_, err := api.PaymentIntents.New(piParams("k", 2000))
	se := stripeErr(t, err, 500, stripego.ErrorTypeAPI)
	if replayed(se.LastResponse) {
		t.Error("first 500 marked as replayed")
	}
	_, err = api.PaymentIntents.New(piParams("k", 2000))
	se = stripeErr(t, err, 500, stripego.ErrorTypeAPI)
	if !replayed(se.LastResponse) {
		t.Error("the retry's 500 is not marked as replayed")
	}
	wantCreated(t, srv, "k", 0)
	if _, err := api.PaymentIntents.New(piParams("k2", 2000)); err != nil {
		t.Errorf("another key after the injected failure: %v", err)
	}
}

func TestServerErrorAfterCreateIsIndeterminate(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)
	srv.FailNextAfterCreate(1, 500)
	_, err := api.PaymentIntents.New(piParams("k", 2000))
	stripeErr(t, err, 500, stripego.ErrorTypeAPI)
	wantCreated(t, srv, "k", 1) // the client saw a 500, the object exists
	_, err = api.PaymentIntents.New(piParams("k", 2000))
	if se := stripeErr(t, err, 500, stripego.ErrorTypeAPI); !replayed(se.LastResponse) {
		t.Error("the retry's 500 is not marked as replayed")
	}
	wantCreated(t, srv, "k", 1)
}

func TestRateLimitIsNotStored(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)
	srv.FailNext(1, 429)
	_, err := api.PaymentIntents.New(piParams("k", 2000))
	stripeErr(t, err, 429, stripego.ErrorTypeInvalidRequest)
	pi, err := api.PaymentIntents.New(piParams("k", 2000))
	if err != nil || replayed(pi.LastResponse) {
		t.Fatalf("retry after 429: %v, want a fresh success", err)
	}
	wantCreated(t, srv, "k", 1)
}

func TestValidationFailureIsNotStored(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)
	bad := &stripego.PaymentIntentParams{Currency: stripego.String("usd")} // no amount
	bad.SetIdempotencyKey("k")
	_, err := api.PaymentIntents.New(bad)
	if se := stripeErr(t, err, 400, stripego.ErrorTypeInvalidRequest); se.Param != "amount" {
		t.Errorf("param %q, want amount", se.Param)
	}
	pi, err := api.PaymentIntents.New(piParams("k", 2000))
	if err != nil || replayed(pi.LastResponse) {
		t.Fatalf("corrected retry with the same key: %v, want a fresh success", err)
	}
	wantCreated(t, srv, "k", 1)
}

// A failure in front of the API stores nothing and executes nothing; a
// reply lost in front of it leaves the API's stored response, which the
// retry replays; a conflict stores nothing.
func TestFailuresInFrontAndConflictsAreNotStored(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)

	srv.FailNextInFront(1, 503)
	_, err := api.PaymentIntents.New(piParams("front", 2000))
	stripeErr(t, err, 503, stripego.ErrorTypeAPI)
	wantCreated(t, srv, "front", 0)
	if pi, err := api.PaymentIntents.New(piParams("front", 2000)); err != nil || replayed(pi.LastResponse) {
		t.Fatalf("retry after a 503 in front: %v, want a fresh success", err)
	}
	wantCreated(t, srv, "front", 1)

	srv.FailNextReplyInFront(1, 502)
	_, err = api.PaymentIntents.New(piParams("lost", 2000))
	stripeErr(t, err, 502, stripego.ErrorTypeAPI)
	wantCreated(t, srv, "lost", 1)
	if pi, err := api.PaymentIntents.New(piParams("lost", 2000)); err != nil || !replayed(pi.LastResponse) {
		t.Fatalf("retry after a reply lost in front: %v, want the stored response replayed", err)
	}
	wantCreated(t, srv, "lost", 1)

	srv.ConflictNext(1)
	_, err = api.PaymentIntents.New(piParams("busy", 2000))
	if se := stripeErr(t, err, 409, stripego.ErrorTypeInvalidRequest); se.Code != "idempotency_key_in_use" {
		t.Errorf("code %q, want idempotency_key_in_use", se.Code)
	}
	wantCreated(t, srv, "busy", 0)
	if pi, err := api.PaymentIntents.New(piParams("busy", 2000)); err != nil || replayed(pi.LastResponse) {
		t.Fatalf("retry after a conflict: %v, want a fresh success", err)
	}
	wantCreated(t, srv, "busy", 1)
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

func TestKeysExpireAfterTheHorizon(t *testing.T) {
	clk := &clock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	srv := stripetest.Start(t, stripetest.WithClock(clk.Now))
	api := newClient(t, srv)
	first, err := api.PaymentIntents.New(piParams("k", 2000))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(23 * time.Hour)
	within, err := api.PaymentIntents.New(piParams("k", 2000))
	if err != nil || within.ID != first.ID || !replayed(within.LastResponse) {
		t.Fatalf("after 23h: %v, want a replay", err)
	}
	clk.Advance(time.Hour)
	after, err := api.PaymentIntents.New(piParams("k", 2000))
	if err != nil {
		t.Fatal(err)
	}
	if after.ID == first.ID || replayed(after.LastResponse) {
		t.Errorf("after 24h: id %s replayed %v, want a new object", after.ID, replayed(after.LastResponse))
	}
	wantCreated(t, srv, "k", 2)
}

func TestKeyLongerThan255IsRefused(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)
	long := strings.Repeat("k", 256)

	// stripe-go itself refuses it before sending.
	if _, err := api.PaymentIntents.New(piParams(long, 2000)); err == nil || !strings.Contains(err.Error(), "255") {
		t.Errorf("stripe-go sent a 256-character key: %v", err)
	}
	if srv.Requests() != 0 {
		t.Errorf("%d requests reached the server", srv.Requests())
	}

	// Forced through a header, the server refuses it and stores nothing.
	p := piParams("", 2000)
	p.Headers = http.Header{"Idempotency-Key": {long}}
	_, err := api.PaymentIntents.New(p)
	stripeErr(t, err, 400, stripego.ErrorTypeInvalidRequest)
	if srv.Total() != 0 {
		t.Errorf("Total %d after a refused key, want 0", srv.Total())
	}

	if _, err := api.PaymentIntents.New(piParams(long[:255], 2000)); err != nil {
		t.Errorf("255-character key: %v", err)
	}
}

func TestKeysAreScopedToTheAPIKey(t *testing.T) {
	srv := stripetest.Start(t)
	a := clientWithKey(t, srv, "sk_test_a")
	b := clientWithKey(t, srv, "sk_test_b")
	pa, err := a.PaymentIntents.New(piParams("k", 2000))
	if err != nil {
		t.Fatal(err)
	}
	pb, err := b.PaymentIntents.New(piParams("k", 3000)) // other parameters: no conflict across accounts
	if err != nil {
		t.Fatal(err)
	}
	if pa.ID == pb.ID || replayed(pb.LastResponse) {
		t.Errorf("account b got %s (replayed %v), want its own object", pb.ID, replayed(pb.LastResponse))
	}
	if _, err := b.PaymentIntents.Get(pa.ID, nil); err == nil {
		t.Error("account b can read account a's PaymentIntent")
	}
	wantCreated(t, srv, "k", 2)

	none := clientWithKey(t, srv, "")
	_, err = none.PaymentIntents.New(piParams("k", 2000))
	stripeErr(t, err, 401, stripego.ErrorTypeInvalidRequest)
}

func TestCardDeclineIsStored(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)
	p := piParams("k", 2000)
	p.Confirm = stripego.Bool(true)
	p.PaymentMethod = stripego.String("pm_card_chargeDeclined")
	_, err := api.PaymentIntents.New(p)
	se := stripeErr(t, err, 402, stripego.ErrorTypeCard)
	var ce *stripego.CardError
	if se.Code != stripego.ErrorCodeCardDeclined || !errors.As(err, &ce) || se.PaymentIntent == nil {
		t.Errorf("decline: code %q, CardError %v, payment_intent %v", se.Code, ce != nil, se.PaymentIntent)
	}
	_, err = api.PaymentIntents.New(p)
	if se := stripeErr(t, err, 402, stripego.ErrorTypeCard); !replayed(se.LastResponse) {
		t.Error("the decline was not replayed")
	}
	wantCreated(t, srv, "k", 1) // Stripe keeps the declined PaymentIntent
}

func TestRefunds(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)
	pi, err := api.PaymentIntents.New(charged("pay", 1000))
	if err != nil {
		t.Fatal(err)
	}
	refund := func(key string, amount int64) (*stripego.Refund, error) {
		rp := &stripego.RefundParams{PaymentIntent: stripego.String(pi.ID)}
		if amount > 0 {
			rp.Amount = stripego.Int64(amount)
		}
		rp.SetIdempotencyKey(key)
		return api.Refunds.New(rp)
	}
	re, err := refund("r1", 400)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(re.ID, "re_") || re.Amount != 400 || re.PaymentIntent == nil || re.PaymentIntent.ID != pi.ID ||
		re.Status != stripego.RefundStatusSucceeded {
		t.Errorf("unexpected refund %+v", re)
	}
	again, err := refund("r1", 400)
	if err != nil || again.ID != re.ID || !replayed(again.LastResponse) {
		t.Errorf("refund retry: %v, want a replay of %s", err, re.ID)
	}
	_, err = refund("r2", 700) // only 600 left: executed, refused, stored
	if se := stripeErr(t, err, 400, stripego.ErrorTypeInvalidRequest); se.Code != stripego.ErrorCodeAmountTooLarge {
		t.Errorf("code %q, want amount_too_large", se.Code)
	}
	rest, err := refund("r3", 0)
	if err != nil || rest.Amount != 600 {
		t.Fatalf("refund of the rest: %v, amount %d, want 600", err, rest.Amount)
	}
	_, err = refund("r4", 0)
	if se := stripeErr(t, err, 400, stripego.ErrorTypeInvalidRequest); se.Code != stripego.ErrorCodeChargeAlreadyRefunded {
		t.Errorf("code %q, want charge_already_refunded", se.Code)
	}
	if got, err := api.Refunds.Get(re.ID, nil); err != nil || got.Amount != 400 {
		t.Errorf("GET refund: %v", err)
	}

	// An unknown PaymentIntent fails validation: not stored.
	rp := &stripego.RefundParams{PaymentIntent: stripego.String("pi_unknown")}
	rp.SetIdempotencyKey("r5")
	_, err = api.Refunds.New(rp)
	if se := stripeErr(t, err, 400, stripego.ErrorTypeInvalidRequest); se.Code != stripego.ErrorCodeResourceMissing {
		t.Errorf("code %q, want resource_missing", se.Code)
	}
	wantCreated(t, srv, "r1", 1)
	wantCreated(t, srv, "r2", 0)
	wantCreated(t, srv, "r5", 0)
}

func TestRestartKeepsState(t *testing.T) {
	srv := stripetest.Start(t)
	api := newClient(t, srv)
	first, err := api.PaymentIntents.New(piParams("k", 2000))
	if err != nil {
		t.Fatal(err)
	}
	url := srv.URL
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if srv.URL != url {
		t.Errorf("URL changed from %s to %s", url, srv.URL)
	}
	// A pooled connection the restart closed may fail once, as after a
	// real deploy; the retry carries the same key.
	var again *stripego.PaymentIntent
	for i := 0; i < 3; i++ {
		var se *stripego.Error
		if again, err = api.PaymentIntents.New(piParams("k", 2000)); err == nil || errors.As(err, &se) {
			break
		}
	}
	if err != nil || again.ID != first.ID || !replayed(again.LastResponse) {
		t.Errorf("after restart: %v, want a replay of %s", err, first.ID)
	}
}

// A request cut before its body was complete never began executing:
// nothing is stored, and the retry executes.
func TestCutRequestStoresNothing(t *testing.T) {
	srv := stripetest.Start(t)
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := "amount=2000&currency=usd"
	fmt.Fprintf(conn, "POST /v1/payment_intents HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
		"Idempotency-Key: k\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s",
		stripetest.APIKey, len(body), body[:len(body)/2])
	conn.Close()
	deadline := time.Now().Add(5 * time.Second)
	for srv.Requests() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // let the handler finish
	wantCreated(t, srv, "k", 0)
	pi, err := newClient(t, srv).PaymentIntents.New(piParams("k", 2000))
	if err != nil || replayed(pi.LastResponse) {
		t.Fatalf("retry after a cut request: %v, want a fresh success", err)
	}
	wantCreated(t, srv, "k", 1)
}

func TestUnknownRouteIsStripeShaped(t *testing.T) {
	srv := stripetest.Start(t)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest("GET", srv.URL+"/v1/charges", nil)
	req.Header.Set("Authorization", "Bearer "+stripetest.APIKey)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(b), `"type":"invalid_request_error"`) {
		t.Errorf("unknown route: %d %s", resp.StatusCode, b)
	}
}

// GET /v1/balance answers an authenticated client and creates nothing.
func TestBalanceIsAnAuthenticatedRead(t *testing.T) {
	srv := stripetest.Start(t)
	b, err := newClient(t, srv).Balance.Get(nil)
	if err != nil || b.Object != "balance" || len(b.Available) == 0 {
		t.Fatalf("balance: %+v, %v", b, err)
	}
	if srv.Total() != 0 {
		t.Errorf("%d objects after a read", srv.Total())
	}
}

// A revoked key gets 401 on every request, before the idempotency layer:
// nothing is stored, so the same idempotency key with a good key executes.
func TestRevokedKeyIsRefused(t *testing.T) {
	srv := stripetest.Start(t)
	srv.RevokeKey("sk_test_revoked")
	revoked := clientWithKey(t, srv, "sk_test_revoked")
	_, err := revoked.PaymentIntents.New(piParams("k", 100))
	se := stripeErr(t, err, http.StatusUnauthorized, stripego.ErrorTypeInvalidRequest)
	if !strings.Contains(se.Msg, "Invalid API Key provided") || strings.Contains(se.Msg, "sk_test_revoked") {
		t.Errorf("message %q: want Stripe's, with the key masked", se.Msg)
	}
	_, err = revoked.Balance.Get(nil)
	stripeErr(t, err, http.StatusUnauthorized, stripego.ErrorTypeInvalidRequest)
	wantCreated(t, srv, "k", 0)
	if _, err := newClient(t, srv).PaymentIntents.New(piParams("k", 100)); err != nil {
		t.Fatalf("another key, same idempotency key: %v", err)
	}
	wantCreated(t, srv, "k", 1)
}

// A rolled key is revoked, and its successor acts for the same account:
// an idempotency key used with the old key replays with the new one.
func TestRolledKeyKeepsTheAccount(t *testing.T) {
	srv := stripetest.Start(t)
	first, err := newClient(t, srv).PaymentIntents.New(piParams("k", 100))
	if err != nil {
		t.Fatal(err)
	}
	srv.RollKey(stripetest.APIKey, "sk_test_new_key")
	_, err = newClient(t, srv).PaymentIntents.New(piParams("k", 100))
	stripeErr(t, err, http.StatusUnauthorized, stripego.ErrorTypeInvalidRequest)
	again, err := clientWithKey(t, srv, "sk_test_new_key").PaymentIntents.New(piParams("k", 100))
	if err != nil || again.ID != first.ID || !replayed(again.LastResponse) {
		t.Fatalf("new key: %v, %v; want the replay of %s", again, err, first.ID)
	}
	if _, err := clientWithKey(t, srv, "sk_test_new_key").PaymentIntents.Get(first.ID, nil); err != nil {
		t.Errorf("the new key cannot read the old key's object: %v", err)
	}
}

// A restricted key may read but every POST gets 403, and nothing is
// stored.
func TestRestrictedKeyMayNotWrite(t *testing.T) {
	srv := stripetest.Start(t)
	srv.RestrictKey(stripetest.APIKey)
	api := newClient(t, srv)
	_, err := api.PaymentIntents.New(piParams("k", 100))
	stripeErr(t, err, http.StatusForbidden, stripego.ErrorTypeInvalidRequest)
	wantCreated(t, srv, "k", 0)
	if _, err := api.Balance.Get(nil); err != nil {
		t.Errorf("balance with a restricted key: %v", err)
	}
}

// RateLimitNext answers 429 with Retry-After, stores nothing, and the
// retry executes.
func TestRateLimitSaysWhenToRetry(t *testing.T) {
	srv := stripetest.Start(t)
	srv.RateLimitNext(1, 2*time.Second)
	_, err := newClient(t, srv).PaymentIntents.New(piParams("k", 100))
	se := stripeErr(t, err, http.StatusTooManyRequests, stripego.ErrorTypeInvalidRequest)
	if got := se.LastResponse.Header.Get("Retry-After"); got != "2" {
		t.Errorf("Retry-After %q, want 2", got)
	}
	if _, err := newClient(t, srv).PaymentIntents.New(piParams("k", 100)); err != nil {
		t.Fatalf("retry: %v", err)
	}
	wantCreated(t, srv, "k", 1)
}
