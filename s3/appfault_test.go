package s3_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/s3"
	"effectively.dev/s3/s3test"
)

// front is a proxy in front of the gateway, as S3's own front end is in
// front of its storage: it forwards every request, except that the
// harness can make it answer the next one with an S3 error, before the
// request reaches the gateway (503 SlowDown, 409
// ConditionalRequestConflict: nothing is written) or after the gateway
// answered it (500 InternalError: the write landed, the reply is lost).
// The client signs for the proxy's host, which the proxy keeps in the
// Host header, so the gateway's signature check passes.
type front struct {
	url   string
	proxy *httputil.ReverseProxy
	tr    *http.Transport // the proxy's, to the gateway

	mu   sync.Mutex
	next []*conformance.AppError
}

// startFront starts a front for endpoint, closed when t ends.
func startFront(t testing.TB, endpoint string) *front {
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	f := &front{proxy: httputil.NewSingleHostReverseProxy(u), tr: &http.Transport{MaxIdleConnsPerHost: 64}}
	f.proxy.Transport = f.tr
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	t.Cleanup(f.tr.CloseIdleConnections)
	f.url = srv.URL
	return f
}

// s3Codes are the S3 error codes the front answers with, per status.
var s3Codes = map[int]string{
	http.StatusServiceUnavailable:  "SlowDown",
	http.StatusInternalServerError: "InternalError",
	http.StatusConflict:            "ConditionalRequestConflict",
}

// appFault arms the front to answer the next request with e
// (conformance.Faults.SetAppFaulter): a status S3 answers with, after the gateway
// applied the request only for a 500.
func (f *front) appFault(e *conformance.AppError) error {
	st := e.HTTPStatus()
	if s3Codes[st] == "" || e.Applied && st != http.StatusInternalServerError {
		return fmt.Errorf("S3 answers no %s here", e.Code)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next = append(f.next, e)
	return nil
}

// AppFaultCodes are the statuses the front answers with
// (conformance.AppFaultCodes).
func (h *harness) AppFaultCodes() []string { return conformance.HTTPAppCodes }

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	var e *conformance.AppError
	if len(f.next) > 0 {
		e, f.next = f.next[0], f.next[1:]
	}
	f.mu.Unlock()
	if e == nil {
		f.proxy.ServeHTTP(w, r)
		return
	}
	if e.Applied {
		f.proxy.ServeHTTP(httptest.NewRecorder(), r) // the gateway wrote; its reply is lost
	}
	st := e.HTTPStatus()
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(st)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected in front of the gateway</Message><RequestId>front</RequestId></Error>`, s3Codes[st])
}

// conflictIsAReplay reads S3's 409 ConditionalRequestConflict as "another
// writer put the object first" and reports a replay: but S3 answers it
// while a concurrent conditional write is in progress, before either has
// landed, and this one wrote nothing.
type conflictIsAReplay struct {
	effects.Effect[s3.Object]
}

func (e conflictIsAReplay) Apply(ctx context.Context, key effects.Key, in s3.Object) (effects.Result, error) {
	res, err := e.Effect.Apply(ctx, key, in)
	var status interface{ HTTPStatusCode() int }
	if errors.As(err, &status) && status.HTTPStatusCode() == http.StatusConflict {
		return effects.Result{Status: effects.Replayed}, nil // the bug
	}
	return res, err
}

// app-faults answers a PutObject with 409 ConditionalRequestConflict from
// the front, nothing written: the liar reports a replay of an object that
// does not exist.
func TestCounterexampleConflictIsAReplayFails(t *testing.T) {
	srv := s3test.Start(t)
	rep := conformance.Run(t, "counterexample: 409 read as a replay", maker(srv, func(c *awss3.Client, bucket, prefix string) (effects.Effect[s3.Object], error) {
		e, err := writer()(c, bucket, prefix)
		return conflictIsAReplay{e}, err
	}), conformance.Only(conformance.ScenarioAppFaults), conformance.ReportOnly())
	row, _ := rep.Row(conformance.ScenarioAppFaults)
	if row.Verdict != conformance.Fail {
		t.Fatalf("app-faults: %s, want FAIL (notes %v)", row.Verdict, row.Notes)
	}
	t.Logf("caught: %s", row.Failures[0])
}
