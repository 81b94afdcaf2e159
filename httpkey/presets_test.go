package httpkey_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/httpkey"
	"effectively.dev/httpkey/httpkeytest"
)

// Each preset declares what its provider's documents say (issue's table):
// the guarantee without a journal, whether the horizon is published,
// whether reuse is detected.
func TestPresetContracts(t *testing.T) {
	h := httpkey.WithHorizon(48 * time.Hour)
	for _, tc := range []struct {
		name      string
		opts      []httpkey.Option
		guarantee effects.Guarantee
		horizon   time.Duration
		assumed   bool
		detects   bool
	}{
		{"IETF", []httpkey.Option{httpkey.IETF, h}, effects.AtLeastOnce, 48 * time.Hour, false, true},
		{"Neutral", []httpkey.Option{httpkey.Neutral, h}, effects.AtLeastOnce, 48 * time.Hour, false, false},
		{"Neutral, assumed", []httpkey.Option{httpkey.Neutral, httpkey.WithAssumedHorizon(time.Hour)}, effects.AtLeastOnce, time.Hour, true, false},
		{"IETF, assumed", []httpkey.Option{httpkey.IETF, httpkey.WithAssumedHorizon(time.Hour)}, effects.AtLeastOnce, time.Hour, true, true},
		{"Adyen", []httpkey.Option{httpkey.Adyen}, effects.AtLeastOnce, 7 * 24 * time.Hour, false, false},
		{"PayPal", []httpkey.Option{httpkey.PayPal, h}, effects.AtLeastOnce, 48 * time.Hour, false, false},
		{"Worldline", []httpkey.Option{httpkey.Worldline}, effects.EffectivelyOnce, 24 * time.Hour, false, false},
		{"Checkout", []httpkey.Option{httpkey.Checkout}, effects.AtLeastOnce, 24 * time.Hour, false, false},
		{"GoCardless", []httpkey.Option{httpkey.GoCardless, h}, effects.EffectivelyOnce, 48 * time.Hour, true, false},
		{"Mollie", []httpkey.Option{httpkey.Mollie}, effects.EffectivelyOnce, 24 * time.Hour, false, true},
		{"Square", []httpkey.Option{httpkey.Square, h}, effects.AtLeastOnce, 48 * time.Hour, true, true},
		{"RazorpayX", []httpkey.Option{httpkey.RazorpayX, h}, effects.AtLeastOnce, 48 * time.Hour, true, true},
		{"Braintree", []httpkey.Option{httpkey.Braintree}, effects.AtLeastOnce, 30 * 24 * time.Hour, false, false},
	} {
		e, err := httpkey.New(http.DefaultClient, buildGraphQL("http://127.0.0.1:1"), tc.opts...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		c := e.Contract()
		if c.Guarantee != tc.guarantee || c.Horizon != tc.horizon || c.HorizonAssumed != tc.assumed || c.DetectsKeyReuse != tc.detects {
			t.Errorf("%s: %v (assumed %v), want %v for %v (assumed %v), reuse %v", tc.name, c, c.HorizonAssumed, tc.guarantee, tc.horizon, tc.assumed, tc.detects)
		}
		if tc.assumed != strings.Contains(c.String(), "assumed") {
			t.Errorf("%s: %q does not say whether the horizon is assumed", tc.name, c)
		}
	}
	for _, p := range []httpkey.Option{httpkey.Neutral, httpkey.GoCardless, httpkey.Square, httpkey.RazorpayX, httpkey.PayPal} {
		var ce *effects.ConfigError
		if _, err := httpkey.New(http.DefaultClient, buildPayment("http://127.0.0.1:1"), p); !errors.As(err, &ce) || ce.Option != "WithHorizon" {
			t.Errorf("a preset without a published horizon and none given: %v, want a ConfigError naming WithHorizon", err)
		}
	}
}

// Adyen: a request while the key's first one is in progress gets 422 (or
// 409) with errorCode 704 and transient-error: true, and waits; a 422
// with another code (a refusal) is refused.
func TestAdyenInProgressWaits(t *testing.T) {
	for _, status := range []int{http.StatusUnprocessableEntity, http.StatusConflict} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			srv := httpkeytest.Start(t, httpkeytest.As(httpkey.Adyen), httpkeytest.WithInFlightStatus(status))
			e := newEffect(t, srv, httpkey.Adyen)
			held, release := srv.Hold()
			defer release()
			first := make(chan error, 1)
			go func() {
				_, err := e.Apply(ctx, "adyen-busy", pay("adyen-busy"))
				first <- err
			}()
			<-held
			_, err := e.Apply(ctx, "adyen-busy", pay("adyen-busy"))
			var re *httpkey.ResponseError
			if !errors.Is(err, effects.ErrInFlight) || !errors.As(err, &re) || re.Code != "704" || re.StatusCode != status {
				t.Errorf("a repeat while the first is in progress: %v, want ErrInFlight with code 704", err)
			}
			release()
			if err := <-first; err != nil {
				t.Fatal(err)
			}
		})
	}
	srv := httpkeytest.Start(t, httpkeytest.As(httpkey.Adyen))
	e := newEffect(t, srv, httpkey.Adyen)
	declined := pay("adyen-declined")
	declined.Reference = httpkeytest.DeclineMarker
	_, err := e.Apply(ctx, "adyen-declined", declined)
	var re *httpkey.ResponseError
	if !errors.Is(err, effects.ErrRefused) || !errors.As(err, &re) || re.StatusCode != 422 || re.Code != "010" {
		t.Errorf("a 422 with errorCode 010: %v, want ErrRefused with the code", err)
	}
	if srv.Total() != 0 {
		t.Errorf("a declined request created %d objects", srv.Total())
	}
	// The header alone also says in progress, whatever the code.
	hdr := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("transient-error", "true")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"status":422,"errorCode":"999"}`)
	}))
	defer hdr.Close()
	e2, _ := httpkey.New(newClient(t), buildPayment(hdr.URL), httpkey.Adyen)
	if _, err := e2.Apply(ctx, "adyen-hdr", pay("adyen-hdr")); !errors.Is(err, effects.ErrInFlight) {
		t.Errorf("422 with transient-error: true: %v, want ErrInFlight", err)
	}
}

// GoCardless: a repeat of a finished creation is its 409
// idempotent_creation_conflict, which Apply reports as a replay with the
// conflicting resource's id.
func TestGoCardlessConflictIsReplay(t *testing.T) {
	srv := httpkeytest.Start(t, httpkeytest.As(httpkey.GoCardless))
	e := newEffect(t, srv, httpkey.GoCardless, httpkey.WithHorizon(time.Hour), httpkey.WithRef(httpkey.JSONField("id")))
	first, err := e.Apply(ctx, "gc-1", pay("gc-1"))
	if err != nil || first.Status != effects.Applied || first.Ref == "" {
		t.Fatalf("first: %+v, %v", first, err)
	}
	again, err := e.Apply(ctx, "gc-1", pay("gc-1"))
	if err != nil || again.Status != effects.Replayed || again.Ref != first.Ref {
		t.Errorf("repeat: %+v, %v; want replayed %s", again, err, first.Ref)
	}
	if n := srv.Count("gc-1"); n != 1 {
		t.Errorf("%d objects for the key", n)
	}
}

// RazorpayX and PayPal accept every wire key: any key NewKey makes, in
// any script and length, is written within the provider's format, and
// distinct keys stay distinct.
func TestProviderKeyFormats(t *testing.T) {
	razor := regexp.MustCompile(`^[A-Za-z0-9 _-]{4,36}$`)
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	h := httpkey.WithHorizon(time.Hour)
	formats := []struct {
		name string
		opts []httpkey.Option
		ok   func(string) bool
	}{
		{"RazorpayX", []httpkey.Option{httpkey.RazorpayX, h}, razor.MatchString},
		{"PayPal", []httpkey.Option{httpkey.PayPal, h}, func(s string) bool { return len(s) >= 1 && len(s) <= 108 }},
		{"Square", []httpkey.Option{httpkey.Square, h}, func(s string) bool { return len(s) >= 1 && len(s) <= 45 }},
		{"UUID", []httpkey.Option{h, httpkey.WithKeyUUID()}, uuid.MatchString},
		{"digits", []httpkey.Option{h, httpkey.WithKeyAlphabet("0123456789", 30, 60)},
			regexp.MustCompile(`^[0-9]{30,60}$`).MatchString},
	}
	keys := []effects.Key{"a", "ab", "k-1", "k 1", "k_1", "K-1", effects.MustKey("billing", "evt:1", "charge"),
		effects.MustKey("billing", "evt:2", "charge"), "caf\u00e9", "cafe\u0301", "日本語のキー", effects.Key(strings.Repeat("x", 255)),
		effects.Key(strings.Repeat("x", 254) + "y"), "%~", "-", "--", "a-b", "a_b", "a b", "a:b"}
	for i := range 200 {
		keys = append(keys, effects.MustKey("svc", fmt.Sprintf("event-%d", i), "step"))
	}
	for _, f := range formats {
		e, err := httpkey.New(http.DefaultClient, buildPayment("http://127.0.0.1:1"), f.opts...)
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		seen := map[string]effects.Key{}
		for _, k := range keys {
			w, err := e.WireKey(k)
			if err != nil {
				t.Fatalf("%s %q: %v", f.name, k, err)
			}
			if !f.ok(w) {
				t.Errorf("%s: key %q is sent as %q, which the provider refuses", f.name, k, w)
			}
			if other, dup := seen[w]; dup {
				t.Errorf("%s: %q and %q share the wire key %q", f.name, k, other, w)
			}
			seen[w] = k
			if again, _ := e.WireKey(k); again != w {
				t.Errorf("%s: %q is sent as %q, then %q", f.name, k, w, again)
			}
		}
	}
	// And the kit playing RazorpayX, which checks the format, takes them.
	srv := httpkeytest.Start(t, httpkeytest.As(httpkey.RazorpayX))
	e := newEffect(t, srv, httpkey.RazorpayX, h)
	for _, k := range keys[:20] {
		if _, err := e.Apply(ctx, k, pay(k)); err != nil {
			t.Errorf("RazorpayX kit, key %q: %v", k, err)
		}
	}
}

// Braintree: an error returned with HTTP 200 is never Applied: a
// VALIDATION error (a request in progress) waits, any other is refused;
// the key goes in the mutation's input.
func TestBraintreeErrorsIn200(t *testing.T) {
	srv := httpkeytest.Start(t, httpkeytest.As(httpkey.Braintree))
	e, err := httpkey.New(newClient(t), buildGraphQL(srv.URL), httpkey.Braintree, httpkey.WithRef(httpkey.JSONField("data", "id")))
	if err != nil {
		t.Fatal(err)
	}
	declined := pay("bt-declined")
	declined.Reference = httpkeytest.DeclineMarker
	res, err := e.Apply(ctx, "bt-declined", declined)
	var re *httpkey.ResponseError
	if !errors.Is(err, effects.ErrRefused) || !errors.As(err, &re) || re.StatusCode != 200 || re.Code != "UNPROCESSABLE" {
		t.Errorf("an error in a 200: (%+v, %v), want ErrRefused, never Applied", res, err)
	}
	held, release := srv.Hold()
	defer release()
	first := make(chan error, 1)
	go func() {
		_, err := e.Apply(ctx, "bt-busy", pay("bt-busy"))
		first <- err
	}()
	<-held
	if _, err := e.Apply(ctx, "bt-busy", pay("bt-busy")); !errors.Is(err, effects.ErrInFlight) {
		t.Errorf("a VALIDATION error while the first is in progress: %v, want ErrInFlight", err)
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if n := srv.Count("bt-busy"); n != 1 {
		t.Errorf("%d objects for bt-busy, want 1 (the key reached the input)", n)
	}
}

// A rule's match on the body of a 2xx response and its validation.
func TestRules(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"data":null,"errors":[{"message":"no","code":"X1"}]}`)
	}))
	defer srv.Close()
	e, err := httpkey.New(newClient(t), buildPayment(srv.URL), httpkey.Neutral, httpkey.WithHorizon(time.Hour),
		httpkey.WithRule(httpkey.Rule{Outcome: httpkey.Refused, Status: []int{200}, Field: []string{"errors"}}),
		httpkey.WithErrorCode("errors", "*", "code"))
	if err != nil {
		t.Fatal(err)
	}
	var re *httpkey.ResponseError
	if _, err := e.Apply(ctx, "r", pay("r")); !errors.Is(err, effects.ErrRefused) || !errors.As(err, &re) || re.Code != "X1" {
		t.Errorf("errors in a 200: %v, want ErrRefused with code X1", err)
	}
	build := buildPayment("http://127.0.0.1:1")
	for _, r := range []httpkey.Rule{
		{Outcome: httpkey.InFlight},
		{Outcome: httpkey.Done, Status: []int{409}},
		{Outcome: httpkey.Refused, Status: []int{302}},
		{Outcome: httpkey.Refused, Value: "x"},
		{Outcome: httpkey.Outcome(42), Status: []int{400}},
		{Outcome: httpkey.Refused, Header: "bad header"},
	} {
		var ce *effects.ConfigError
		if _, err := httpkey.New(http.DefaultClient, build, httpkey.WithHorizon(time.Hour), httpkey.WithRule(r)); !errors.As(err, &ce) || ce.Option != "WithRule" {
			t.Errorf("rule %+v: %v, want a ConfigError naming WithRule", r, err)
		}
	}
	for _, o := range []httpkey.Option{httpkey.WithKeyAlphabet(" ", 1, 40), httpkey.WithKeyAlphabet("01", 1, 64), httpkey.WithKeyAlphabet("ab\x00", 1, 200)} {
		var ce *effects.ConfigError
		if _, err := httpkey.New(http.DefaultClient, build, httpkey.WithHorizon(time.Hour), o); !errors.As(err, &ce) || ce.Option != "WithKeyAlphabet" {
			t.Errorf("%v, want a ConfigError naming WithKeyAlphabet", err)
		}
	}
}

// The vendor's body never enters an error's text, whatever it holds; the
// status, the vendor's code and the request id do. WithErrorBody keeps the
// body for code that reads it, still out of the text.
func TestVendorBodyNeverInErrors(t *testing.T) {
	const secret = "4242424242424242 jane@example.com +44 20 7946 0958"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "req_123")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = fmt.Fprintf(w, `{"code":"card_invalid","message":%q,"email":"jane@example.com"}`, secret)
	}))
	defer srv.Close()
	for _, keep := range []bool{false, true} {
		opts := []httpkey.Option{httpkey.Neutral, httpkey.WithHorizon(time.Hour), httpkey.WithErrorCode("code")}
		if keep {
			opts = append(opts, httpkey.WithErrorBody())
		}
		e, err := httpkey.New(newClient(t), buildPayment(srv.URL), opts...)
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.Apply(ctx, "pii", pay("pii"))
		text := err.Error()
		for _, s := range []string{"4242", "jane", "7946"} {
			if strings.Contains(text, s) {
				t.Errorf("error text holds %q: %s", s, text)
			}
		}
		var re *httpkey.ResponseError
		if !errors.As(err, &re) || !strings.Contains(text, "card_invalid") || !strings.Contains(text, "req_123") || !strings.Contains(text, "400") {
			t.Errorf("error text %q lacks the status, the code or the request id", text)
		}
		if keep != strings.Contains(string(re.Body), "4242") {
			t.Errorf("WithErrorBody %v: Body %q", keep, re.Body)
		}
	}
	// A code that is not an identifier (text that may carry data) is left out.
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"code":"card 4242424242424242 invalid"}`)
	}))
	defer srv2.Close()
	e, _ := httpkey.New(newClient(t), buildPayment(srv2.URL), httpkey.Neutral, httpkey.WithHorizon(time.Hour), httpkey.WithErrorCode("code"))
	if _, err := e.Apply(ctx, "pii2", pay("pii2")); strings.Contains(err.Error(), "4242") {
		t.Errorf("a code with data in it reached the error: %v", err)
	}
}

// A 300 MB success body streamed by the server: Apply reads no more than
// WithMaxBody (+1 byte) of it when it needs the body, and none when it
// does not; either way it allocates a bounded amount.
func TestHugeSuccessBodyIsBounded(t *testing.T) {
	const huge = 300 << 20
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		chunk := []byte(`{"id":"obj_1","pad":"` + strings.Repeat("x", 64<<10))
		for sent := 0; sent < huge; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return // the client closed the connection
			}
		}
	}))
	defer srv.Close()
	for _, withRef := range []bool{true, false} {
		opts := []httpkey.Option{httpkey.Neutral, httpkey.WithHorizon(time.Hour)}
		if withRef {
			opts = append(opts, httpkey.WithRef(httpkey.JSONField("id")))
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		e, err := httpkey.New(&http.Client{Transport: tr}, buildPayment(srv.URL), opts...)
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err = e.Apply(ctx, "huge", pay("huge"))
		runtime.ReadMemStats(&after)
		tr.CloseIdleConnections()
		var ce *effects.ConfigError
		switch {
		case withRef && (!errors.As(err, &ce) || ce.Option != "WithMaxBody" || !errors.Is(err, effects.ErrAmbiguous)):
			t.Errorf("with a ref: %v, want a ConfigError naming WithMaxBody over ErrAmbiguous", err)
		case !withRef && err != nil:
			t.Errorf("without a ref: %v, want Applied: the body is not read", err)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
			t.Errorf("with a ref %v: a 300 MB body allocated %d MB, want at most 16", withRef, alloc>>20)
		}
	}
}

// URLs in errors lose their user information and query.
func TestURLsInErrorsRedacted(t *testing.T) {
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "https://user:hunter2@elsewhere.example/pay?api_key=sk_live_secret", http.StatusFound)
	}))
	defer redirect.Close()
	for _, base := range []string{
		"http://user:hunter2@127.0.0.1:1", // nothing listens: a transport error
		strings.Replace(redirect.URL, "http://", "http://user:hunter2@", 1),
		"ftp://user:hunter2@127.0.0.1:1",
	} {
		build := func(ctx context.Context, p Payment) (*http.Request, error) {
			body, _ := json.Marshal(p)
			return http.NewRequestWithContext(ctx, http.MethodPost, base+"/objects?api_key=sk_live_secret", strings.NewReader(string(body)))
		}
		e, err := httpkey.New(newClient(t), build, httpkey.Neutral, httpkey.WithHorizon(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.Apply(ctx, "redact", pay("redact"))
		if err == nil {
			t.Fatalf("%s: no error", base)
		}
		for _, s := range []string{"hunter2", "sk_live_secret"} {
			if strings.Contains(err.Error(), s) {
				t.Errorf("%s: the error shows %q: %v", base, s, err)
			}
		}
	}
}

// Without a journal each call ends after WithTimeout: a server that never
// answers is ErrAmbiguous after it, not a hang.
func TestCallTimeoutWithoutJournal(t *testing.T) {
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-stop:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(stop)
	e, err := httpkey.New(newClient(t), buildPayment(srv.URL), httpkey.Neutral, httpkey.WithHorizon(time.Hour), httpkey.WithTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = e.Apply(ctx, "slow", pay("slow"))
	if took := time.Since(start); !errors.Is(err, effects.ErrAmbiguous) || took > 10*time.Second {
		t.Errorf("a server that never answers: %v after %v, want ErrAmbiguous after about 200ms", err, took)
	}
}

// With a journal, a redelivery whose request goes to the next API version
// (/v70/ → /v71/) is the same payload: it replays, it is not key reuse.
// Another body is.
func TestFingerprintIgnoresTheAPIVersion(t *testing.T) {
	srv := httpkeytest.Start(t, httpkeytest.As(httpkey.IETF))
	j := memjournal.New(nil)
	mk := func(version string) *httpkey.Effect[Payment] {
		e, err := httpkey.New(newClient(t), func(ctx context.Context, p Payment) (*http.Request, error) {
			req, err := buildPayment(srv.URL+"/"+version)(ctx, p)
			return req, err
		}, httpkey.IETF, httpkey.WithHorizon(time.Hour), httpkey.WithJournal(j))
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	if _, err := mk("v70").Apply(ctx, "versioned", pay("versioned")); err != nil {
		t.Fatal(err)
	}
	res, err := mk("v71").Apply(ctx, "versioned", pay("versioned"))
	if err != nil || res.Status != effects.Replayed {
		t.Errorf("the redelivery on v71: (%+v, %v), want a replay", res, err)
	}
	other := pay("versioned")
	other.Amount++
	if _, err := mk("v71").Apply(ctx, "versioned", other); !errors.Is(err, effects.ErrKeyReused) {
		t.Errorf("another body: %v, want ErrKeyReused", err)
	}
}

// A preset whose rules read only error bodies (Adyen's) does not read a
// 2xx body without WithRef: a body past WithMaxBody is no error then.
func TestSuccessBodyReadOnlyWhenNeeded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"pspReference":"`+strings.Repeat("x", 4096)+`"}`)
	}))
	defer srv.Close()
	e, err := httpkey.New(newClient(t), buildPayment(srv.URL), httpkey.Adyen, httpkey.WithMaxBody(1024))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := e.Apply(ctx, "adyen-big", pay("adyen-big")); err != nil || res.Status != effects.Applied {
		t.Errorf("(%+v, %v), want Applied: nothing reads the body", res, err)
	}
}
