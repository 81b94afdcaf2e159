package httpkeytest_test

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/httpkey"
	"effectively.dev/httpkey/httpkeytest"
)

// post sends body to srv with the header name: value (none when value is
// "") and returns the status, the replay header's value and the body.
func post(t *testing.T, srv *httpkeytest.Server, name, value, body, replay string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/objects", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if value != "" {
		req.Header.Set(name, value)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get(replay), string(b)
}

// The draft's semantics over plain HTTP: a missing or malformed key is
// 400 and stores nothing; the first request creates; a repeat gets the
// stored response, marked when configured; another payload is 422; past
// the horizon, by the server's clock, the key executes again.
func TestDraftSemantics(t *testing.T) {
	srv := httpkeytest.Start(t, httpkeytest.WithHorizon(time.Hour),
		httpkeytest.WithReplayHeader("Idempotent-Replayed", "true"))
	const h, r = "Idempotency-Key", "Idempotent-Replayed"
	for _, bad := range []string{"", "k", `"unterminated`, `"` + strings.Repeat("k", 255+1) + `"`} {
		if code, _, _ := post(t, srv, h, bad, `{"a":1}`, r); code != http.StatusBadRequest {
			t.Errorf("key %q: HTTP %d, want 400", bad, code)
		}
	}
	if n := srv.Total(); n != 0 {
		t.Fatalf("%d objects after bad keys, want 0", n)
	}
	code, marked, first := post(t, srv, h, `"k1"`, `{"a":1}`, r)
	if code != http.StatusCreated || marked != "" {
		t.Fatalf("first: HTTP %d, replay header %q", code, marked)
	}
	code, marked, again := post(t, srv, h, `"k1"`, `{"a":1}`, r)
	if code != http.StatusCreated || marked != "true" || again != first {
		t.Errorf("repeat: HTTP %d, replay header %q, body %s; want the stored 201 %s, marked", code, marked, again, first)
	}
	if code, _, _ := post(t, srv, h, `"k1"`, `{"a":2}`, r); code != http.StatusUnprocessableEntity {
		t.Errorf("another payload: HTTP %d, want 422", code)
	}
	if n := srv.Count("k1"); n != 1 {
		t.Errorf("%d objects for k1 within the horizon, want 1", n)
	}
	if err := srv.Age(t.Context(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if code, marked, _ := post(t, srv, h, `"k1"`, `{"a":2}`, r); code != http.StatusCreated || marked != "" {
		t.Errorf("past the horizon: HTTP %d, replay header %q; want a new 201", code, marked)
	}
	if n := srv.Count("k1"); n != 2 {
		t.Errorf("%d objects for k1 past the horizon, want 2", n)
	}
}

// The Worldline preset: the key as it is in X-GCS-Idempotence-Key, at
// most 40 bytes; a repeat, even with another payload, gets the stored
// response with the first request's time in milliseconds; without the
// marker (the misbehaviour) nothing tells the repeat.
func TestWorldline(t *testing.T) {
	const h, r = "X-GCS-Idempotence-Key", "X-GCS-Idempotence-Request-Timestamp"
	srv := httpkeytest.Start(t, httpkeytest.As(httpkey.Worldline))
	if code, _, _ := post(t, srv, h, strings.Repeat("k", 41), `{}`, r); code != http.StatusBadRequest {
		t.Errorf("41-byte key: HTTP %d, want 400", code)
	}
	before := time.Now().UnixMilli()
	code, marked, first := post(t, srv, h, "w1", `{"a":1}`, r)
	after := time.Now().UnixMilli()
	if code != http.StatusCreated || marked != "" {
		t.Fatalf("first: HTTP %d, replay header %q", code, marked)
	}
	if err := srv.Age(t.Context(), time.Minute); err != nil {
		t.Fatal(err)
	}
	code, marked, again := post(t, srv, h, "w1", `{"a":2}`, r)
	stamp, err := strconv.ParseInt(marked, 10, 64)
	if code != http.StatusCreated || err != nil || stamp < before || stamp > after || again != first {
		t.Errorf("repeat with another payload: HTTP %d, %s %q, body %s; want the stored 201 with %s the first request's time in ms, in [%d, %d]",
			code, r, marked, again, r, before, after)
	}

	quiet := httpkeytest.Start(t, httpkeytest.As(httpkey.Worldline), httpkeytest.WithReplayHeader("", ""))
	post(t, quiet, h, "w1", `{"a":1}`, r)
	if _, marked, _ := post(t, quiet, h, "w1", `{"a":1}`, r); marked != "" {
		t.Errorf("WithReplayHeader(\"\", \"\"): repeat marked %q", marked)
	}
}

// Hold keeps a first request in flight: a repeat meanwhile gets 409 and
// creates nothing; after release the first completes.
func TestHoldAnswersInFlight(t *testing.T) {
	srv := httpkeytest.Start(t)
	held, release := srv.Hold()
	defer release()
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/objects", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", `"busy"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	<-held
	if code, _, _ := post(t, srv, "Idempotency-Key", `"busy"`, `{}`, ""); code != http.StatusConflict {
		t.Errorf("while the first executes: HTTP %d, want 409", code)
	}
	release()
	if code := <-done; code != http.StatusCreated {
		t.Errorf("first after release: HTTP %d, want 201", code)
	}
	if n := srv.Count("busy"); n != 1 {
		t.Errorf("%d objects, want 1", n)
	}
}

// send posts body to srv with headers and returns the status, the
// response's headers and its body.
func send(t *testing.T, srv *httpkeytest.Server, headers map[string]string, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/objects", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// A request holding DeclineMarker is declined, creates nothing, and its
// refusal is replayed for the key.
func TestDeclineMarker(t *testing.T) {
	srv := httpkeytest.Start(t)
	body := `{"card":"` + httpkeytest.DeclineMarker + `"}`
	for range 2 {
		if status, _, _ := send(t, srv, map[string]string{"Idempotency-Key": `"d1"`}, body); status != http.StatusPaymentRequired {
			t.Errorf("declined request: %d, want 402", status)
		}
	}
	if srv.Total() != 0 {
		t.Errorf("%d objects created by a declined request", srv.Total())
	}
}

// Each vendor mode answers as its provider documents.
func TestVendorModes(t *testing.T) {
	hold := func(srv *httpkeytest.Server, hdr map[string]string, body string) (int, http.Header, string) {
		held, release := srv.Hold()
		done := make(chan struct{})
		go func() { defer close(done); send(t, srv, hdr, body) }()
		<-held
		status, h, b := send(t, srv, hdr, body)
		release()
		<-done
		return status, h, b
	}
	t.Run("Adyen in progress", func(t *testing.T) {
		srv := httpkeytest.Start(t, httpkeytest.As(httpkey.Adyen))
		status, h, b := hold(srv, map[string]string{"Idempotency-Key": "a1"}, `{}`)
		if status != 422 || h.Get("Transient-Error") != "true" || !strings.Contains(b, `"errorCode":"704"`) {
			t.Errorf("%d %v %s, want 422 with errorCode 704 and transient-error: true", status, h, b)
		}
	})
	t.Run("GoCardless conflict", func(t *testing.T) {
		srv := httpkeytest.Start(t, httpkeytest.As(httpkey.GoCardless))
		hdr := map[string]string{"Idempotency-Key": "g1"}
		_, _, first := send(t, srv, hdr, `{}`)
		status, _, b := send(t, srv, hdr, `{"other":1}`)
		if status != 409 || !strings.Contains(b, "idempotent_creation_conflict") || !strings.Contains(b, `"conflicting_resource_id":"obj_1"`) || !strings.Contains(first, "obj_1") {
			t.Errorf("%d %s, want 409 idempotent_creation_conflict naming obj_1", status, b)
		}
	})
	t.Run("Mollie", func(t *testing.T) {
		srv := httpkeytest.Start(t, httpkeytest.As(httpkey.Mollie))
		hdr := map[string]string{"Idempotency-Key": "m1"}
		send(t, srv, hdr, `{}`)
		if _, h, _ := send(t, srv, hdr, `{}`); h.Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay not marked: %v", h)
		}
		if status, _, _ := send(t, srv, hdr, `{"x":1}`); status != 400 {
			t.Errorf("another payload: %d, want 400", status)
		}
	})
	t.Run("Checkout stores only successes", func(t *testing.T) {
		srv := httpkeytest.Start(t, httpkeytest.As(httpkey.Checkout))
		hdr := map[string]string{"Cko-Idempotency-Key": "c1"}
		srv.FailNextAfterCreate(1, 500)
		if status, _, _ := send(t, srv, hdr, `{}`); status != 500 {
			t.Fatalf("injected failure: %d", status)
		}
		if status, _, _ := send(t, srv, hdr, `{}`); status != 201 || srv.Count("c1") != 2 {
			t.Errorf("a retry after a 5xx: %d and %d objects, want it executed again (2)", status, srv.Count("c1"))
		}
	})
	t.Run("Square", func(t *testing.T) {
		srv := httpkeytest.Start(t, httpkeytest.As(httpkey.Square))
		send(t, srv, nil, `{"idempotency_key":"s1","amount":1}`)
		status, _, b := send(t, srv, nil, `{"idempotency_key":"s1","amount":2}`)
		if status != 400 || !strings.Contains(b, "IDEMPOTENCY_KEY_REUSED") {
			t.Errorf("another payload: %d %s", status, b)
		}
		if status, _, _ := send(t, srv, nil, `{"idempotency_key":"`+strings.Repeat("k", 46)+`"}`); status != 400 {
			t.Errorf("a 46-character key: %d, want 400", status)
		}
	})
	t.Run("RazorpayX key format", func(t *testing.T) {
		srv := httpkeytest.Start(t, httpkeytest.As(httpkey.RazorpayX))
		for key, want := range map[string]int{"abc": 400, "abcd": 201, "a:bcd": 400, strings.Repeat("k", 37): 400, "ab c_d-E": 201} {
			if status, _, _ := send(t, srv, map[string]string{"X-Payout-Idempotency": key}, `{}`); status != want {
				t.Errorf("key %q: %d, want %d", key, status, want)
			}
		}
	})
	t.Run("PayPal key length", func(t *testing.T) {
		srv := httpkeytest.Start(t, httpkeytest.As(httpkey.PayPal))
		for n, want := range map[int]int{108: 201, 109: 400} {
			if status, _, _ := send(t, srv, map[string]string{"PayPal-Request-Id": strings.Repeat("p", n)}, `{}`); status != want {
				t.Errorf("a %d-character key: %d, want %d", n, status, want)
			}
		}
	})
	t.Run("Braintree", func(t *testing.T) {
		srv := httpkeytest.Start(t, httpkeytest.As(httpkey.Braintree))
		body := func(amount int) string {
			return `{"query":"mutation","variables":{"input":{"apiRequestKey":"b1","amount":` + strconv.Itoa(amount) + `}}}`
		}
		if status, _, b := send(t, srv, nil, body(1)); status != 200 || !strings.Contains(b, `"data"`) {
			t.Errorf("first: %d %s", status, b)
		}
		if status, _, b := send(t, srv, nil, body(2)); status != 200 || !strings.Contains(b, "VALIDATION") {
			t.Errorf("another payload: %d %s, want a VALIDATION error in a 200", status, b)
		}
	})
	t.Run("Age reaches the key store", func(t *testing.T) {
		srv := httpkeytest.Start(t)
		hdr := map[string]string{"Idempotency-Key": `"age"`}
		send(t, srv, hdr, `{}`)
		if err := srv.Age(t.Context(), 24*time.Hour); err != nil {
			t.Fatal(err)
		}
		send(t, srv, hdr, `{}`)
		if n := srv.Count("age"); n != 2 {
			t.Errorf("%d objects after aging past the horizon, want 2", n)
		}
	})
}

// TestFailuresNotStored: a failure in front of the server executes
// nothing and stores nothing; one on the way back stores the server's
// answer, which the retry replays; a conflict stores nothing.
func TestFailuresNotStored(t *testing.T) {
	srv := httpkeytest.Start(t)
	hdr := func(k string) map[string]string { return map[string]string{"Idempotency-Key": `"` + k + `"`} }

	srv.FailNextInFront(1, 503)
	if status, _, _ := send(t, srv, hdr("f1"), `{}`); status != 503 || srv.Count("f1") != 0 {
		t.Fatalf("in front: %d and %d objects, want 503 and none", status, srv.Count("f1"))
	}
	if status, _, _ := send(t, srv, hdr("f1"), `{}`); status != 201 || srv.Count("f1") != 1 {
		t.Errorf("the retry: %d and %d objects, want it executed (201, 1)", status, srv.Count("f1"))
	}

	srv.FailNextReplyInFront(1, 502)
	if status, _, _ := send(t, srv, hdr("f2"), `{}`); status != 502 || srv.Count("f2") != 1 {
		t.Fatalf("reply lost in front: %d and %d objects, want 502 and one", status, srv.Count("f2"))
	}
	if status, _, _ := send(t, srv, hdr("f2"), `{}`); status != 201 || srv.Count("f2") != 1 {
		t.Errorf("the retry: %d and %d objects, want the stored 201 replayed (1)", status, srv.Count("f2"))
	}

	srv.ConflictNext(1)
	if status, _, _ := send(t, srv, hdr("f3"), `{}`); status != 409 || srv.Count("f3") != 0 {
		t.Fatalf("a conflict: %d and %d objects, want 409 and none", status, srv.Count("f3"))
	}
	if status, _, _ := send(t, srv, hdr("f3"), `{}`); status != 201 || srv.Count("f3") != 1 {
		t.Errorf("the retry: %d and %d objects, want it executed (201, 1)", status, srv.Count("f3"))
	}
}

// As refuses a Provider it cannot play, naming the option, before the
// server listens; every value httpkey exports has a server.
func TestAsRefusesAnUnknownProvider(t *testing.T) {
	_, err := httpkeytest.New(httpkeytest.As(httpkey.Provider{}))
	var ce *effects.ConfigError
	if !errors.As(err, &ce) || ce.Option != "As" {
		t.Fatalf("New(As(zero Provider)) = %v, want a ConfigError naming As", err)
	}
	for _, p := range []httpkey.Provider{httpkey.IETF, httpkey.Neutral, httpkey.Adyen, httpkey.PayPal, httpkey.Worldline,
		httpkey.Checkout, httpkey.GoCardless, httpkey.Mollie, httpkey.Square, httpkey.RazorpayX, httpkey.Braintree} {
		srv, err := httpkeytest.New(httpkeytest.As(p))
		if err != nil {
			t.Errorf("New(As(%v)): %v", p, err)
			continue
		}
		srv.Close()
	}
}
