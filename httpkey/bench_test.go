package httpkey_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/httpkey"
)

// benchServer is a minimal 127.0.0.1 API that answers every keyed POST
// with 201 and an id, so that a benchmark measures the client's work, not
// the server's.
func benchServer() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("Idempotency-Key") == "" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ch_1","amount":2000,"currency":"EUR"}`))
	}))
}

// rawCall sends the request build makes for key by hand, as a caller
// without the adapter would: set the Idempotency-Key header, Do, read the
// body, decode the id, close.
func rawCall(ctx context.Context, client *http.Client, build func(context.Context, Payment) (*http.Request, error), key string) error {
	req, err := build(ctx, Payment{Amount: 2000, Currency: "EUR", Reference: key})
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("HTTP %d, %v", resp.StatusCode, err)
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &out); err != nil || out.ID == "" {
		return fmt.Errorf("body %q: %v", body, err)
	}
	return nil
}

// newBenchEffect is the effect the benchmarks measure: the IETF preset
// with a ref reader, on a client of its own.
func newBenchEffect(b *testing.B, url string) *httpkey.Effect[Payment] {
	e, err := httpkey.New(newClient(b), buildPayment(url), httpkey.IETF, httpkey.WithHorizon(24*time.Hour),
		httpkey.WithRef(httpkey.JSONField("id")))
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// BenchmarkApply measures one Apply (a new key each time, so every call
// executes) and the same request sent by hand ([rawCall]), as two
// sub-benchmarks, for their allocations and times on a quiet machine.
func BenchmarkApply(b *testing.B) {
	srv := benchServer()
	defer srv.Close()
	ctx := context.Background()
	b.Run("raw", func(b *testing.B) {
		client, build := newClient(b), buildPayment(srv.URL)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if err := rawCall(ctx, client, build, "bench:"+strconv.Itoa(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("httpkey", func(b *testing.B) {
		e := newBenchEffect(b, srv.URL)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			key := effects.Key("bench:" + strconv.Itoa(i))
			if res, err := e.Apply(ctx, key, Payment{Amount: 2000, Currency: "EUR", Reference: string(key)}); err != nil || res.Ref == "" {
				b.Fatalf("%v, %v", res, err)
			}
		}
	})
}

// BenchmarkApplySideBySide runs a raw call ([rawCall]) and an Apply, each
// with a new key, in every iteration, alternating which goes first, on two
// clients against one server, and reports the median time of each side
// (raw-ns/call, httpkey-ns/call) and their ratio (httpkey/raw): on a
// shared, noisy machine the two sides see the same noise, which separate
// benchmarks run seconds apart do not.
func BenchmarkApplySideBySide(b *testing.B) {
	srv := benchServer()
	defer srv.Close()
	ctx := context.Background()
	client, build := newClient(b), buildPayment(srv.URL)
	e := newBenchEffect(b, srv.URL)
	var raw, adapter []time.Duration
	i := 0
	for b.Loop() {
		i++
		rawKey, key := "raw:"+strconv.Itoa(i), effects.Key("bench:"+strconv.Itoa(i))
		doRaw := func() {
			start := time.Now()
			if err := rawCall(ctx, client, build, rawKey); err != nil {
				b.Fatal(err)
			}
			raw = append(raw, time.Since(start))
		}
		doApply := func() {
			start := time.Now()
			if res, err := e.Apply(ctx, key, Payment{Amount: 2000, Currency: "EUR", Reference: string(key)}); err != nil || res.Ref == "" {
				b.Fatalf("%v, %v", res, err)
			}
			adapter = append(adapter, time.Since(start))
		}
		if i%2 == 0 {
			doRaw()
			doApply()
		} else {
			doApply()
			doRaw()
		}
	}
	r, a := median(raw), median(adapter)
	b.ReportMetric(float64(r.Nanoseconds()), "raw-ns/call")
	b.ReportMetric(float64(a.Nanoseconds()), "httpkey-ns/call")
	b.ReportMetric(float64(a)/float64(r), "httpkey/raw")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// The benchmark's two sides send the same request: the raw side's header
// is what the effect sets for a plain key.
func TestBenchmarkSidesSendTheSameKey(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Idempotency-Key")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ch_1"}`))
	}))
	defer srv.Close()
	e, err := httpkey.New(newClient(t), buildPayment(srv.URL), httpkey.IETF, httpkey.WithHorizon(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Apply(context.Background(), "bench:1", Payment{}); err != nil {
		t.Fatal(err)
	}
	if h, want := <-got, fmt.Sprintf("%q", "bench:1"); h != want {
		t.Errorf("the effect sent Idempotency-Key %s, the raw side sends %s", h, want)
	}
}
