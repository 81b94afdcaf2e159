package httpkey_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/httpkey"
	"effectively.dev/httpkey/httpkeytest"
)

var ctx = context.Background()

// newEffect is httpkey.New on the kit at srv for tests.
func newEffect(t testing.TB, srv *httpkeytest.Server, opts ...httpkey.Option) *httpkey.Effect[Payment] {
	t.Helper()
	e, err := httpkey.New(newClient(t), buildPayment(srv.URL), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func pay(key effects.Key) Payment {
	return Payment{Amount: 2000, Currency: "EUR", Reference: string(key)}
}

// object reads the kit's object id back.
func object(t testing.TB, srv *httpkeytest.Server, id string) map[string]json.RawMessage {
	t.Helper()
	resp, err := newClient(t).Get(srv.URL + "/objects/" + id)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var o map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET object %s: %d %v", id, resp.StatusCode, err)
	}
	return o
}

// The key reaches the server where each placement puts it, in the form
// WireKey tells, for plain keys, keys NewKey escaped, non-ASCII keys and
// keys longer than the server's limit; each creates one object, and a
// repeat creates none.
func TestKeyPlacement(t *testing.T) {
	long := effects.Key("k:" + strings.Repeat("é", 100))
	keys := []effects.Key{"plain-key-1", effects.MustKey("billing", "evt:1", "charge"), "caf\u00e9 \"quoted\" \\ back", long}
	for _, tc := range []struct {
		name   string
		server []httpkeytest.Option
		effect []httpkey.Option
	}{
		{"IETF structured header", []httpkeytest.Option{httpkeytest.As(httpkey.IETF)}, []httpkey.Option{httpkey.IETF, httpkey.WithHorizon(time.Hour)}},
		{"Adyen raw header, 64 bytes", []httpkeytest.Option{httpkeytest.As(httpkey.Adyen)}, []httpkey.Option{httpkey.Adyen}},
		{"PayPal-Request-Id", []httpkeytest.Option{httpkeytest.As(httpkey.PayPal)}, []httpkey.Option{httpkey.PayPal, httpkey.WithHorizon(time.Hour)}},
		{"Worldline raw header, 40 bytes", []httpkeytest.Option{httpkeytest.As(httpkey.Worldline)}, []httpkey.Option{httpkey.Worldline}},
		{"Square JSON body member, 45 bytes", []httpkeytest.Option{httpkeytest.As(httpkey.Square)}, []httpkey.Option{httpkey.Square, httpkey.WithHorizon(time.Hour)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httpkeytest.Start(t, tc.server...)
			e := newEffect(t, srv, append(tc.effect, httpkey.WithRef(httpkey.JSONField("id")))...)
			for _, key := range keys {
				wire, err := e.WireKey(key)
				if err != nil {
					t.Fatal(err)
				}
				res, err := e.Apply(ctx, key, pay(key))
				if err != nil {
					t.Fatalf("key %q: %v", key, err)
				}
				if again, err := e.Apply(ctx, key, pay(key)); err != nil || again.Ref != res.Ref {
					t.Fatalf("key %q repeated: %+v, %v; want the first ref %q", key, again, err, res.Ref)
				}
				if n := srv.Count(wire); n != 1 {
					t.Errorf("key %q (wire %q): %d objects, want 1", key, wire, n)
				}
				o := object(t, srv, res.Ref)
				var req map[string]any
				if err := json.Unmarshal(o["request"], &req); err != nil {
					t.Fatal(err)
				}
				if req["reference"] != string(key) || req["amount"] != float64(2000) {
					t.Errorf("key %q: the server got the body %s, want the payment as built", key, o["request"])
				}
				if tc.name == "JSON body member" && req["idempotency_key"] != wire {
					t.Errorf("key %q: body member %v, want %q", key, req["idempotency_key"], wire)
				}
			}
			if got := srv.Total(); got != len(keys) {
				t.Errorf("%d objects for %d keys", got, len(keys))
			}
		})
	}
}

// The server's form of a key: the key itself when it is printable ASCII
// without '%', '"' and '\' and fits; escaped otherwise; shortened with a
// digest past the limit; never anything a header or a JSON string must
// quote.
func TestWireKey(t *testing.T) {
	srv := httpkeytest.Start(t)
	e := newEffect(t, srv, httpkey.WithHorizon(time.Hour))
	short := newEffect(t, srv, httpkey.WithHorizon(time.Hour), httpkey.WithMaxKeyLen(64))
	for _, tc := range []struct {
		key  effects.Key
		want string
	}{
		{"billing:evt_1:charge", "billing:evt_1:charge"},
		{effects.MustKey("billing", "evt:1", "charge"), "billing:evt%253A1:charge"},
		{"caf\u00e9", "caf%C3%A9"},
		{"cafe\u0301", "cafe%CC%81"},
		{`a b"c\d%e`, "a%20b%22c%5Cd%25e"},
	} {
		if got, err := e.WireKey(tc.key); err != nil || got != tc.want {
			t.Errorf("WireKey(%q) = %q, %v; want %q", tc.key, got, err, tc.want)
		}
	}
	long := effects.Key("order-" + strings.Repeat("x", 200))
	w, _ := short.WireKey(long)
	w2, _ := short.WireKey(long + "y")
	if len(w) != 64 || !strings.HasPrefix(w, "order-xxx") || !strings.Contains(w, "%~") || w == w2 {
		t.Errorf("shortened keys %q and %q: want 64 bytes each, a readable prefix, the marker, and distinct", w, w2)
	}
	if _, err := e.WireKey("bad\nkey"); !errors.Is(err, effects.ErrInvalidKey) {
		t.Errorf("WireKey of an invalid key: %v, want ErrInvalidKey", err)
	}
}

// FuzzWireKey: distinct valid keys have distinct wire forms, each within
// the limit and made of characters no header or JSON string quotes.
func FuzzWireKey(f *testing.F) {
	f.Add("a", "b")
	f.Add("caf\u00e9", "cafe\u0301")
	f.Add("%41", "A")
	f.Add("caf%C3%A9", "caf\u00e9")
	f.Add(strings.Repeat("x", 250)+"a", strings.Repeat("x", 250)+"b")
	f.Add("k%~", "k")
	effs := map[int]*httpkey.Effect[Payment]{}
	for _, max := range []int{24, 64, 255} {
		e, err := httpkey.New(http.DefaultClient, buildPayment("http://127.0.0.1:1"), httpkey.WithHorizon(time.Hour), httpkey.WithMaxKeyLen(max))
		if err != nil {
			f.Fatal(err)
		}
		effs[max] = e
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ka, kb := effects.Key(a), effects.Key(b)
		if ka.Validate() != nil || kb.Validate() != nil {
			return
		}
		for max, e := range effs {
			wa, _ := e.WireKey(ka)
			wb, _ := e.WireKey(kb)
			if a != b && wa == wb {
				t.Fatalf("max %d: %q and %q share the wire key %q", max, a, b, wa)
			}
			if len(wa) > max {
				t.Fatalf("max %d: wire key %q is %d bytes", max, wa, len(wa))
			}
			for i := 0; i < len(wa); i++ {
				if c := wa[i]; c <= ' ' || c >= 0x7F || c == '"' || c == '\\' {
					t.Fatalf("wire key %q holds %q", wa, c)
				}
			}
		}
	})
}

// class names an error's class and sentinel, for the tables below.
func class(err error) string {
	c := effects.ClassOf(err).String()
	for _, s := range []error{effects.ErrInFlight, effects.ErrKeyReused, effects.ErrRefused, effects.ErrTransient,
		effects.ErrAmbiguous, effects.ErrInvalidConfig, effects.ErrPoison, effects.ErrInvalidKey} {
		if errors.Is(err, s) && !(s == effects.ErrAmbiguous && effects.ClassOf(err) == effects.InvalidConfig) {
			return c + "/" + s.Error()
		}
	}
	return c
}

// Each status lands in its class, with the response reachable and the
// server's Retry-After where it gives one: the draft's defaults, and a
// preset's and an option's changes to them.
func TestStatusClasses(t *testing.T) {
	for _, tc := range []struct {
		status int
		opts   []httpkey.Option
		want   error
		wait   time.Duration
	}{
		{http.StatusBadRequest, nil, effects.ErrRefused, 0},
		{http.StatusPaymentRequired, nil, effects.ErrRefused, 0},
		{http.StatusNotFound, nil, effects.ErrRefused, 0},
		{http.StatusRequestTimeout, nil, effects.ErrTransient, 0},
		{http.StatusTooManyRequests, nil, effects.ErrTransient, time.Second},
		{http.StatusUnauthorized, nil, effects.ErrInvalidConfig, 0},
		{http.StatusForbidden, nil, effects.ErrInvalidConfig, 0},
		{http.StatusInternalServerError, nil, effects.ErrAmbiguous, 0},
		{http.StatusServiceUnavailable, nil, effects.ErrAmbiguous, 0},
		{http.StatusUnprocessableEntity, nil, effects.ErrKeyReused, 0},
		{http.StatusUnprocessableEntity, []httpkey.Option{httpkey.Adyen}, effects.ErrRefused, 0},
		{http.StatusUnprocessableEntity, []httpkey.Option{httpkey.PayPal}, effects.ErrRefused, 0},
		{http.StatusUnprocessableEntity, []httpkey.Option{httpkey.Worldline}, effects.ErrRefused, 0},
		{http.StatusTooEarly, []httpkey.Option{httpkey.WithStatus(httpkey.InFlight, http.StatusTooEarly)}, effects.ErrInFlight, 0},
		{http.StatusNotFound, []httpkey.Option{httpkey.WithStatus(httpkey.Misconfigured, http.StatusNotFound)}, effects.ErrInvalidConfig, 0},
		{http.StatusBadGateway, []httpkey.Option{httpkey.WithStatus(httpkey.Transient, http.StatusBadGateway)}, effects.ErrTransient, 0},
	} {
		t.Run(fmt.Sprintf("%d%s", tc.status, optsName(tc.opts)), func(t *testing.T) {
			srv := httpkeytest.Start(t, httpkeytest.As(httpkey.Neutral))
			opts := append(append([]httpkey.Option{}, tc.opts...), httpkey.WithKeyHeader("Idempotency-Key"), httpkey.WithHorizon(time.Hour))
			e := newEffect(t, srv, opts...)
			srv.FailNext(1, tc.status)
			_, err := e.Apply(ctx, "status-key", pay("status-key"))
			if !errors.Is(err, tc.want) || effects.ClassOf(err) == effects.Unclassified {
				t.Fatalf("HTTP %d: %v (%s), want %v", tc.status, err, class(err), tc.want)
			}
			var re *httpkey.ResponseError
			if !errors.As(err, &re) || re.StatusCode != tc.status || re.Body != nil {
				t.Errorf("HTTP %d: the response is not reachable, or its body was kept without WithErrorBody: %#v", tc.status, re)
			}
			if wait, _ := effects.RetryAfter(err); wait != tc.wait {
				t.Errorf("HTTP %d: RetryAfter %v, want %v", tc.status, wait, tc.wait)
			}
			var ce *effects.ConfigError
			if errors.Is(tc.want, effects.ErrInvalidConfig) && (!errors.As(err, &ce) || !strings.Contains(ce.Option, srv.URL)) {
				t.Errorf("HTTP %d: %v, want a *ConfigError naming %s", tc.status, err, srv.URL)
			}
		})
	}
}

func optsName(opts []httpkey.Option) string {
	if len(opts) == 0 {
		return ""
	}
	return "/changed"
}

// The kit's own 409 and 422: a request while the key's first one executes
// is in flight (retryable, with Retry-After), the key with another
// payload is key reuse (permanent).
func TestInFlightAndKeyReused(t *testing.T) {
	srv := httpkeytest.Start(t)
	e := newEffect(t, srv, httpkey.WithHorizon(time.Hour))
	held, release := srv.Hold()
	defer release()
	first := make(chan error, 1)
	go func() {
		_, err := e.Apply(ctx, "busy", pay("busy"))
		first <- err
	}()
	<-held // the first request is executing
	_, err := e.Apply(ctx, "busy", pay("busy"))
	if wait, _ := effects.RetryAfter(err); !errors.Is(err, effects.ErrInFlight) || effects.ClassOf(err) != effects.Retryable || wait != time.Second {
		t.Errorf("a second request while the first executes: %v (RetryAfter %v), want ErrInFlight after 1s", err, wait)
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	other := pay("busy")
	other.Amount++
	if _, err := e.Apply(ctx, "busy", other); !errors.Is(err, effects.ErrKeyReused) || effects.ClassOf(err) != effects.Permanent {
		t.Errorf("the key with another payload: %v, want permanent ErrKeyReused", err)
	}
}

// A 5xx the server stored after creating the object: ambiguous, and a
// retry gets the same stored 5xx. With a replay signal the replay says so,
// and Apply gives up for good (ErrReplayedServerError, permanent) instead
// of retrying a key that cannot resolve; without one it stays ambiguous.
func TestStoredServerError(t *testing.T) {
	for _, signal := range []bool{true, false} {
		t.Run(fmt.Sprintf("replay signal %v", signal), func(t *testing.T) {
			server := []httpkeytest.Option{}
			opts := []httpkey.Option{httpkey.WithHorizon(time.Hour)}
			if signal {
				server = append(server, httpkeytest.WithReplayHeader("Idempotent-Replayed", "true"))
				opts = append(opts, httpkey.WithReplayHeader("Idempotent-Replayed", "true"))
			}
			srv := httpkeytest.Start(t, server...)
			e := newEffect(t, srv, opts...)
			srv.FailNextAfterCreate(1, http.StatusInternalServerError)
			if _, err := e.Apply(ctx, "k500", pay("k500")); !errors.Is(err, effects.ErrAmbiguous) {
				t.Fatalf("first 500: %v, want ErrAmbiguous", err)
			}
			_, err := e.Apply(ctx, "k500", pay("k500"))
			switch {
			case signal && (!errors.Is(err, httpkey.ErrReplayedServerError) || effects.ClassOf(err) != effects.Permanent):
				t.Errorf("replayed 500: %v (%s), want permanent ErrReplayedServerError", err, class(err))
			case !signal && !errors.Is(err, effects.ErrAmbiguous):
				t.Errorf("500 again without a replay signal: %v, want ErrAmbiguous", err)
			}
			if n := srv.Count("k500"); n != 1 {
				t.Errorf("%d objects, want the one the first request created", n)
			}
		})
	}
}

// The replay signal makes a repeat Replayed; without one every success is
// Applied (the contract says at-least-once); a journal makes the repeat
// Replayed without a request.
func TestReplayedStatus(t *testing.T) {
	for _, tc := range []struct {
		name     string
		signal   bool
		journal  bool
		want     effects.Status
		requests int
	}{
		{"no signal", false, false, effects.Applied, 2},
		{"replay header", true, false, effects.Replayed, 2},
		{"replay header present", true, false, effects.Replayed, 2},
		{"journal", false, true, effects.Replayed, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var server []httpkeytest.Option
			opts := []httpkey.Option{httpkey.WithHorizon(time.Hour), httpkey.WithRef(httpkey.JSONField("id"))}
			switch {
			case tc.signal && tc.name == "replay header present":
				// Any value marks a replay: the server sends one the
				// effect was not told.
				server = append(server, httpkeytest.WithReplayHeader("X-Replayed-At", "2026-12-07T19:00:00Z"))
				opts = append(opts, httpkey.WithReplayHeader("x-replayed-at", ""))
			case tc.signal:
				server = append(server, httpkeytest.WithReplayHeader("Idempotent-Replayed", "true"))
				opts = append(opts, httpkey.WithReplayHeader("idempotent-replayed", "TRUE"))
			}
			if tc.journal {
				opts = append(opts, httpkey.WithJournal(memjournal.New(nil)))
			}
			srv := httpkeytest.Start(t, server...)
			e := newEffect(t, srv, opts...)
			first, err := e.Apply(ctx, "rep", pay("rep"))
			if err != nil || first.Status != effects.Applied || first.Ref != "obj_1" {
				t.Fatalf("first: %+v, %v", first, err)
			}
			again, err := e.Apply(ctx, "rep", pay("rep"))
			if err != nil || again.Status != tc.want || again.Ref != first.Ref {
				t.Errorf("repeat: %+v, %v; want %v with ref %q", again, err, tc.want, first.Ref)
			}
			if n := srv.Requests(); n != tc.requests {
				t.Errorf("%d requests reached the server, want %d", n, tc.requests)
			}
		})
	}
}

// Worldline's replay signal is a header's presence, whatever its value
// (the first request's time): a repeat is Replayed, also with another
// payload, which Worldline answers with the first response; the same
// effect against a server that sends no such header reports Applied, so
// the signal is what is read.
func TestWorldlineReplaySignal(t *testing.T) {
	srv := httpkeytest.Start(t, httpkeytest.As(httpkey.Worldline))
	e := newEffect(t, srv, httpkey.Worldline, httpkey.WithRef(httpkey.JSONField("id")))
	first, err := e.Apply(ctx, "wl-1", pay("wl-1"))
	if err != nil || first.Status != effects.Applied {
		t.Fatalf("first: %+v, %v", first, err)
	}
	other := pay("wl-1")
	other.Amount = 999
	for _, in := range []Payment{pay("wl-1"), other} {
		again, err := e.Apply(ctx, "wl-1", in)
		if err != nil || again.Status != effects.Replayed || again.Ref != first.Ref {
			t.Errorf("repeat with amount %d: %+v, %v; want Replayed with ref %q", in.Amount, again, err, first.Ref)
		}
	}
	if n := srv.Count("wl-1"); n != 1 {
		t.Errorf("%d objects, want 1", n)
	}

	quiet := httpkeytest.Start(t, httpkeytest.As(httpkey.Worldline), httpkeytest.WithReplayHeader("", ""))
	e = newEffect(t, quiet, httpkey.Worldline, httpkey.WithRef(httpkey.JSONField("id")))
	for i := range 2 {
		if res, err := e.Apply(ctx, "wl-2", pay("wl-2")); err != nil || res.Status != effects.Applied {
			t.Errorf("call %d without the header: %+v, %v; want Applied", i, res, err)
		}
	}
}

// Requests the effect cannot send correctly are refused before any I/O:
// a request function's error (poison unless it classified it), a nil
// request, a relative URL, a key header already set, a body that cannot
// take the key member.
func TestBadRequestsMakeNoRequest(t *testing.T) {
	srv := httpkeytest.Start(t)
	build := func(f func(*http.Request) *http.Request) func(context.Context, Payment) (*http.Request, error) {
		return func(ctx context.Context, p Payment) (*http.Request, error) {
			req, err := buildPayment(srv.URL)(ctx, p)
			return f(req), err
		}
	}
	raw := func(body string) func(context.Context, Payment) (*http.Request, error) {
		return func(ctx context.Context, _ Payment) (*http.Request, error) {
			return http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/objects", strings.NewReader(body))
		}
	}
	for _, tc := range []struct {
		name  string
		build func(context.Context, Payment) (*http.Request, error)
		opts  []httpkey.Option
		want  error
	}{
		{"build error", func(context.Context, Payment) (*http.Request, error) { return nil, errors.New("no such currency") }, nil, effects.ErrPoison},
		{"classified build error", func(context.Context, Payment) (*http.Request, error) {
			return nil, effects.Transient("rates", "", errors.New("rates unavailable"))
		}, nil, effects.ErrTransient},
		{"nil request", func(context.Context, Payment) (*http.Request, error) { return nil, nil }, nil, effects.ErrInvalidConfig},
		{"relative URL", build(func(r *http.Request) *http.Request { r.URL.Scheme, r.URL.Host = "", ""; return r }), nil, effects.ErrInvalidConfig},
		{"ftp URL", build(func(r *http.Request) *http.Request { r.URL.Scheme = "ftp"; return r }), nil, effects.ErrInvalidConfig},
		{"key header set", build(func(r *http.Request) *http.Request { r.Header.Set("Idempotency-Key", `"mine"`); return r }), nil, effects.ErrInvalidConfig},
		{"body not an object", raw(`[1,2]`), []httpkey.Option{httpkey.WithKeyField("idempotency_key")}, effects.ErrInvalidConfig},
		{"body not JSON", raw(`amount=1`), []httpkey.Option{httpkey.WithKeyField("idempotency_key")}, effects.ErrInvalidConfig},
		{"body has the member", raw(`{"idempotency_key":"x"}`), []httpkey.Option{httpkey.WithKeyField("idempotency_key")}, effects.ErrInvalidConfig},
		{"body has the member escaped", raw(`{"idempotency\u005fkey":"x"}`), []httpkey.Option{httpkey.WithKeyField("idempotency_key")}, effects.ErrInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := httpkey.New(newClient(t), tc.build, append(tc.opts, httpkey.WithHorizon(time.Hour))...)
			if err != nil {
				t.Fatal(err)
			}
			_, err = e.Apply(ctx, "bad-request", pay("bad-request"))
			if !errors.Is(err, tc.want) || effects.ClassOf(err) == effects.Unclassified {
				t.Errorf("%v (%s), want %v", err, class(err), tc.want)
			}
		})
	}
	if n := srv.Requests(); n != 0 {
		t.Errorf("%d requests reached the server, want none", n)
	}
}

// An empty body takes the key member as the only one, and a body with
// white space and members keeps them byte for byte after it.
func TestKeyFieldKeepsTheBody(t *testing.T) {
	srv := httpkeytest.Start(t, httpkeytest.As(httpkey.Square)) // the key in the body's idempotency_key
	for _, body := range []string{`{}`, " {\n \"amount\": 1.50, \"meta\": {\"a\": [1, 2]}\n}"} {
		e, err := httpkey.New(newClient(t), func(ctx context.Context, _ Payment) (*http.Request, error) {
			return http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/objects", strings.NewReader(body))
		}, httpkey.WithKeyField("idempotency_key"), httpkey.WithHorizon(time.Hour), httpkey.WithRef(httpkey.JSONField("id")))
		if err != nil {
			t.Fatal(err)
		}
		key := effects.Key(fmt.Sprintf("field-%d", len(body)))
		res, err := e.Apply(ctx, key, Payment{})
		if err != nil {
			t.Fatal(err)
		}
		var got, want map[string]any
		_ = json.Unmarshal(object(t, srv, res.Ref)["request"], &got)
		_ = json.Unmarshal([]byte(body), &want)
		want["idempotency_key"] = string(key)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("the server got %v, want %v", got, want)
		}
	}
}

// A ref that cannot be read is a configuration error, yet the request was
// applied: the error keeps ErrAmbiguous underneath, and the fixed effect
// gets the stored response and its ref.
func TestRefThatCannotBeRead(t *testing.T) {
	srv := httpkeytest.Start(t)
	wrong := newEffect(t, srv, httpkey.WithHorizon(time.Hour), httpkey.WithRef(httpkey.JSONField("payment", "id")))
	_, err := wrong.Apply(ctx, "ref-key", pay("ref-key"))
	var ce *effects.ConfigError
	if effects.ClassOf(err) != effects.InvalidConfig || !errors.Is(err, effects.ErrAmbiguous) || !errors.As(err, &ce) || ce.Option != "WithRef" {
		t.Fatalf("%v, want a configuration error naming WithRef with ErrAmbiguous underneath", err)
	}
	fixed := newEffect(t, srv, httpkey.WithHorizon(time.Hour), httpkey.WithRef(httpkey.JSONField("id")))
	res, err := fixed.Apply(ctx, "ref-key", pay("ref-key"))
	if err != nil || res.Ref != "obj_1" || srv.Count("ref-key") != 1 {
		t.Errorf("after the fix: %+v, %v, %d objects; want obj_1 and one object", res, err, srv.Count("ref-key"))
	}
}

func TestJSONField(t *testing.T) {
	for _, tc := range []struct {
		body string
		path []string
		want string
	}{
		{`{"id":"obj_1"}`, []string{"id"}, "obj_1"},
		{`{"id":12345678901234567890}`, []string{"id"}, "12345678901234567890"},
		{`{"payment":{"id":"p_1","x":2}}`, []string{"payment", "id"}, "p_1"},
		{`{"id":""}`, []string{"id"}, ""},
		{`{"id":null}`, []string{"id"}, ""},
		{`{"id":{"a":1}}`, []string{"id"}, ""},
		{`{"other":"x"}`, []string{"id"}, ""},
		{`["id"]`, []string{"id"}, ""},
		{`{"id":"x"}`, nil, ""},
	} {
		got, err := httpkey.JSONField(tc.path...)(nil, []byte(tc.body))
		if got != tc.want || (tc.want == "") != (err != nil) {
			t.Errorf("JSONField(%v) of %s = %q, %v; want %q", tc.path, tc.body, got, err, tc.want)
		}
	}
}

// Apply never follows a redirect: a 3xx is a configuration error, and the
// request never reaches where it points.
func TestRedirectIsConfig(t *testing.T) {
	srv := httpkeytest.Start(t)
	moved := httptest.NewServer(http.RedirectHandler(srv.URL+"/objects", http.StatusTemporaryRedirect))
	t.Cleanup(moved.Close)
	e, err := httpkey.New(newClient(t), buildPayment(moved.URL), httpkey.WithHorizon(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Apply(ctx, "moved", pay("moved"))
	if effects.ClassOf(err) != effects.InvalidConfig || !strings.Contains(err.Error(), "redirect") {
		t.Errorf("%v, want a configuration error about the redirect", err)
	}
	if n := srv.Requests(); n != 0 {
		t.Errorf("the redirect was followed: %d requests at its target", n)
	}
}

// A token the server refuses stops the worker: a *ConfigError, not a
// dead letter.
func TestCredentialsRefused(t *testing.T) {
	srv := httpkeytest.Start(t, httpkeytest.WithToken("secret"))
	bearer := func(token string) func(context.Context, Payment) (*http.Request, error) {
		return func(ctx context.Context, p Payment) (*http.Request, error) {
			req, err := buildPayment(srv.URL)(ctx, p)
			if err == nil {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			return req, err
		}
	}
	for token, want := range map[string]effects.Class{"rotated": effects.InvalidConfig, "secret": effects.Unclassified} {
		e, err := httpkey.New(newClient(t), bearer(token), httpkey.WithHorizon(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Apply(ctx, effects.Key("cred-"+token), pay("x")); effects.ClassOf(err) != want {
			t.Errorf("token %q: %v, want class %v", token, err, want)
		}
	}
}

// Without a response: a connection refused sent nothing (ErrTransient); a
// TLS client on a plain-text port is a configuration error.
func TestTransportErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	srv := httpkeytest.Start(t)
	for _, tc := range []struct {
		base string
		want error
	}{
		{closed, effects.ErrTransient},
		{strings.Replace(srv.URL, "http://", "https://", 1), effects.ErrInvalidConfig},
	} {
		e, err := httpkey.New(newClient(t), buildPayment(tc.base), httpkey.WithHorizon(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Apply(ctx, "transport", pay("transport")); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.base, err, tc.want)
		}
	}
}

// A reply cut after the server applied the request is ambiguous; the
// retry with the same key gets the stored response, and nothing is
// created twice.
func TestCutReplyIsAmbiguous(t *testing.T) {
	srv := httpkeytest.Start(t)
	var once sync.Once
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxy, _ := http.NewRequestWithContext(r.Context(), r.Method, srv.URL+r.URL.Path, r.Body)
		proxy.Header = r.Header.Clone()
		resp, err := http.DefaultTransport.RoundTrip(proxy)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		cutNow := false
		once.Do(func() { cutNow = true })
		if cutNow {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
	}))
	t.Cleanup(cut.Close)
	e, err := httpkey.New(newClient(t), buildPayment(cut.URL), httpkey.WithHorizon(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Apply(ctx, "cut", pay("cut")); !errors.Is(err, effects.ErrAmbiguous) {
		t.Fatalf("cut reply: %v, want ErrAmbiguous", err)
	}
	if _, err := e.Apply(ctx, "cut", pay("cut")); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if n := srv.Count("cut"); n != 1 {
		t.Errorf("%d objects, want 1", n)
	}
}

// The contract follows the configuration.
func TestContract(t *testing.T) {
	j := memjournal.New(nil)
	for _, tc := range []struct {
		name        string
		opts        []httpkey.Option
		guarantee   effects.Guarantee
		horizon     time.Duration
		detects     bool
		enforcerHas string
	}{
		{"IETF", []httpkey.Option{httpkey.IETF, httpkey.WithHorizon(24 * time.Hour)}, effects.AtLeastOnce, 24 * time.Hour, true, "Idempotency-Key header (a structured string)"},
		{"IETF with replay header", []httpkey.Option{httpkey.WithHorizon(24 * time.Hour), httpkey.WithReplayHeader("idempotent-replayed", "true")},
			effects.EffectivelyOnce, 24 * time.Hour, true, "replays marked idempotent-replayed: true"},
		{"Adyen", []httpkey.Option{httpkey.Adyen}, effects.AtLeastOnce, httpkey.Adyen.Horizon(), false, "no replay signal"},
		{"Worldline", []httpkey.Option{httpkey.Worldline}, effects.EffectivelyOnce, httpkey.Worldline.Horizon(), false,
			"X-GCS-Idempotence-Key header, kept by the server for 24h0m0s, replays marked by a X-GCS-Idempotence-Request-Timestamp header"},
		{"PayPal with journal", []httpkey.Option{httpkey.PayPal, httpkey.WithHorizon(72 * time.Hour), httpkey.WithJournal(j)},
			effects.EffectivelyOnce, 0, true, "PayPal-Request-Id header, kept by the server for 72h0m0s, no replay signal, then the journal"},
		{"body member", []httpkey.Option{httpkey.WithKeyField("idempotency_key"), httpkey.WithHorizon(time.Hour),
			httpkey.WithStatus(httpkey.Refused, 422)}, effects.AtLeastOnce, time.Hour, false, `JSON body's "idempotency_key"`},
	} {
		e, err := httpkey.New(http.DefaultClient, buildPayment("http://127.0.0.1:1"), tc.opts...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		c := e.Contract()
		if c.Guarantee != tc.guarantee || c.Horizon != tc.horizon || c.DetectsKeyReuse != tc.detects ||
			!strings.Contains(c.Enforcer, tc.enforcerHas) || c.Validate() != nil {
			t.Errorf("%s: %v (enforcer %q); want %v, horizon %v, key reuse %v, enforcer naming %q", tc.name, c, c.Enforcer, tc.guarantee, tc.horizon, tc.detects, tc.enforcerHas)
		}
		if c.Guarantee == effects.AtLeastOnce && c.DuplicateWindow.Trigger != effects.AnyRedelivery {
			t.Errorf("%s: window %v, want any redelivery", tc.name, c.DuplicateWindow)
		}
	}
}

// New refuses what it cannot use, naming the option.
func TestNewRefusesBadConfiguration(t *testing.T) {
	build := buildPayment("http://127.0.0.1:1")
	h := httpkey.WithHorizon(time.Hour)
	for _, tc := range []struct {
		option string
		client *http.Client
		build  func(context.Context, Payment) (*http.Request, error)
		opts   []httpkey.Option
	}{
		{"client", nil, build, []httpkey.Option{h}},
		{"build", http.DefaultClient, nil, []httpkey.Option{h}},
		{"WithHorizon", http.DefaultClient, build, nil},
		{"WithHorizon", http.DefaultClient, build, []httpkey.Option{httpkey.PayPal}},
		{"WithHorizon", http.DefaultClient, build, []httpkey.Option{httpkey.WithHorizon(-time.Second)}},
		{"WithKeyHeader", http.DefaultClient, build, []httpkey.Option{h, httpkey.WithKeyHeader("Bad Header")}},
		{"WithKeyField", http.DefaultClient, build, []httpkey.Option{h, httpkey.WithKeyField("")}},
		{"WithMaxKeyLen", http.DefaultClient, build, []httpkey.Option{h, httpkey.WithMaxKeyLen(23)}},
		{"WithReplayHeader", http.DefaultClient, build, []httpkey.Option{h, httpkey.WithReplayHeader("X:Y", "true")}},
		{"WithReplayHeader", http.DefaultClient, build, []httpkey.Option{h, httpkey.WithReplayHeader("Replayed", " ")}},
		{"WithStatus", http.DefaultClient, build, []httpkey.Option{h, httpkey.WithStatus(httpkey.InFlight, 200)}},
		{"WithStatus", http.DefaultClient, build, []httpkey.Option{h, httpkey.WithStatus(httpkey.Outcome(99), 409)}},
		{"WithStatus", http.DefaultClient, build, []httpkey.Option{h, httpkey.WithStatus(httpkey.Refused)}},
		{"WithRef", http.DefaultClient, build, []httpkey.Option{h, httpkey.WithRef(nil)}},
		{"WithLease", http.DefaultClient, build, []httpkey.Option{h, httpkey.WithJournal(memjournal.New(nil), journal.WithLease(0))}},
		{"WithLogger", http.DefaultClient, build, []httpkey.Option{h, httpkey.WithJournal(memjournal.New(nil), journal.WithLogger(nil))}},
	} {
		_, err := httpkey.New(tc.client, tc.build, tc.opts...)
		var ce *effects.ConfigError
		if !errors.As(err, &ce) || ce.Option != tc.option {
			t.Errorf("%s: %v, want a *ConfigError naming it", tc.option, err)
		}
	}
	if _, err := httpkey.New(http.DefaultClient, build, nil, h); err != nil {
		t.Errorf("a nil option: %v, want it ignored", err)
	}
}

// Invalid keys are refused before the request function runs.
func TestInvalidKeyBuildsNothing(t *testing.T) {
	built := 0
	e, err := httpkey.New(http.DefaultClient, func(ctx context.Context, p Payment) (*http.Request, error) {
		built++
		return buildPayment("http://127.0.0.1:1")(ctx, p)
	}, httpkey.WithHorizon(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []effects.Key{"", " lead", "tab\there", effects.Key(strings.Repeat("k", effects.MaxKeyLen+1))} {
		if _, err := e.Apply(ctx, k, pay(k)); !errors.Is(err, effects.ErrInvalidKey) || effects.ClassOf(err) != effects.Permanent {
			t.Errorf("key %q: %v, want permanent ErrInvalidKey", k, err)
		}
	}
	if built != 0 {
		t.Errorf("the request function ran %d times for invalid keys", built)
	}
}
