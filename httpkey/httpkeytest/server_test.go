package httpkeytest_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"effectively.dev/httpkey/httpkeytest"
)

// clock is a time the test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

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
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	srv := httpkeytest.Start(t, httpkeytest.WithClock(clk.Now), httpkeytest.WithHorizon(time.Hour),
		httpkeytest.WithReplayHeader("Idempotent-Replayed", "true"))
	const h, r = "Idempotency-Key", "Idempotent-Replayed"
	for _, bad := range []string{"", "k", `"unterminated`, `"` + strings.Repeat("k", httpkeytest.DefaultMaxKeyLen+1) + `"`} {
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
	clk.advance(time.Hour)
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
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clk := &clock{now: start}
	const h, r = "X-GCS-Idempotence-Key", "X-GCS-Idempotence-Request-Timestamp"
	srv := httpkeytest.Start(t, httpkeytest.Worldline(), httpkeytest.WithClock(clk.Now))
	if code, _, _ := post(t, srv, h, strings.Repeat("k", 41), `{}`, r); code != http.StatusBadRequest {
		t.Errorf("41-byte key: HTTP %d, want 400", code)
	}
	code, marked, first := post(t, srv, h, "w1", `{"a":1}`, r)
	if code != http.StatusCreated || marked != "" {
		t.Fatalf("first: HTTP %d, replay header %q", code, marked)
	}
	clk.advance(time.Minute)
	code, marked, again := post(t, srv, h, "w1", `{"a":2}`, r)
	if want := strconv.FormatInt(start.UnixMilli(), 10); code != http.StatusCreated || marked != want || again != first {
		t.Errorf("repeat with another payload: HTTP %d, %s %q, body %s; want the stored 201 with %s %s", code, r, marked, again, r, want)
	}

	quiet := httpkeytest.Start(t, httpkeytest.Worldline(), httpkeytest.WithoutReplayHeader())
	post(t, quiet, h, "w1", `{"a":1}`, r)
	if _, marked, _ := post(t, quiet, h, "w1", `{"a":1}`, r); marked != "" {
		t.Errorf("WithoutReplayHeader: repeat marked %q", marked)
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
