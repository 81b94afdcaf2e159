package s3_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"effectively.dev/effects"
	"effectively.dev/s3"
)

// The classification tests run against a scripted S3: each S3 call answers
// what the test says, which versitygw cannot be made to do on demand.

// answer is a scripted reply: an HTTP status with an S3 error code, or
// hangUp to close the connection after reading the request.
type answer struct {
	status int
	code   string
	hangUp bool
}

var ok = answer{status: http.StatusOK}

// fakeS3 answers each S3 call by the name of the call.
type fakeS3 struct {
	mu sync.Mutex
	// answers by call: "put", "head", "create", "part", "complete",
	// "abort"; "head#2" answers the second HEAD. Unscripted calls succeed.
	answers map[string]answer
	calls   []string
	seen    map[string]int
	block   chan struct{} // if set, requests wait on it (to cancel them)
}

func (f *fakeS3) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	call := "put"
	switch {
	case r.Method == http.MethodHead:
		call = "head"
	case r.Method == http.MethodPost && q.Has("uploads"):
		call = "create"
	case r.Method == http.MethodPut && q.Has("partNumber"):
		call = "part"
	case r.Method == http.MethodPost && q.Has("uploadId"):
		call = "complete"
	case r.Method == http.MethodDelete:
		call = "abort"
	}
	f.mu.Lock()
	f.calls = append(f.calls, call)
	if f.seen == nil {
		f.seen = map[string]int{}
	}
	f.seen[call]++
	a, found := f.answers[fmt.Sprintf("%s#%d", call, f.seen[call])]
	if !found {
		a, found = f.answers[call]
	}
	block := f.block
	f.mu.Unlock()
	if !found {
		a = ok
	}
	if block != nil {
		<-block
	}
	if a.hangUp {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	if a.status != http.StatusOK {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(a.status)
		if r.Method != http.MethodHead {
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>scripted</Message></Error>`, a.code)
		}
		return
	}
	switch call {
	case "create":
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>u1</UploadId></InitiateMultipartUploadResult>`)
	case "complete":
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><ETag>"e-1"</ETag></CompleteMultipartUploadResult>`)
	case "abort":
		w.WriteHeader(http.StatusNoContent)
	default:
		w.Header().Set("ETag", `"etag"`)
	}
}

func (f *fakeS3) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// scripted starts a fake S3 and returns a Writer on it with the SDK's
// retries off, so each scripted answer reaches the adapter.
func scripted(t *testing.T, f *fakeS3, opts ...s3.Option) *s3.Writer {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return writerAt(t, srv.URL, opts...)
}

func writerAt(t *testing.T, endpoint string, opts ...s3.Option) *s3.Writer {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := awss3.New(awss3.Options{
		Region:           "us-east-1",
		BaseEndpoint:     aws.String(endpoint),
		UsePathStyle:     true,
		Credentials:      credentials.NewStaticCredentialsProvider("k", "s", ""),
		HTTPClient:       &http.Client{Transport: tr},
		RetryMaxAttempts: 1,
	})
	w, err := s3.New(client, "b", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestErrorsAreClassified(t *testing.T) {
	type want int
	const (
		success want = iota
		transient
		ambiguous
		permanent
		keyReused
		config
	)
	for _, tc := range []struct {
		name      string
		multipart bool
		answers   map[string]answer
		want      want
		calls     []string
	}{
		{"409 ConditionalRequestConflict on PUT", false, map[string]answer{"put": {status: 409, code: "ConditionalRequestConflict"}}, transient, []string{"put"}},
		{"409 OperationAborted", false, map[string]answer{"put": {status: 409, code: "OperationAborted"}}, transient, []string{"put"}},
		{"409 with another code", false, map[string]answer{"put": {status: 409, code: "InvalidBucketState"}}, permanent, []string{"put"}},
		{"400 InvalidArgument", false, map[string]answer{"put": {status: 400, code: "InvalidArgument"}}, permanent, []string{"put"}},
		{"503 SlowDown", false, map[string]answer{"put": {status: 503, code: "SlowDown"}}, transient, []string{"put"}},
		{"500 InternalError may have written", false, map[string]answer{"put": {status: 500, code: "InternalError"}}, ambiguous, []string{"put"}},
		{"403 AccessDenied", false, map[string]answer{"put": {status: 403, code: "AccessDenied"}}, config, []string{"put"}},
		{"403 InvalidAccessKeyId", false, map[string]answer{"put": {status: 403, code: "InvalidAccessKeyId"}}, config, []string{"put"}},
		{"403 SignatureDoesNotMatch", false, map[string]answer{"put": {status: 403, code: "SignatureDoesNotMatch"}}, config, []string{"put"}},
		{"404 NoSuchBucket", false, map[string]answer{"put": {status: 404, code: "NoSuchBucket"}}, config, []string{"put"}},
		{"301 PermanentRedirect", false, map[string]answer{"put": {status: 301, code: "PermanentRedirect"}}, config, []string{"put"}},
		{"connection lost after the PUT was sent", false, map[string]answer{"put": {hangUp: true}}, ambiguous, []string{"put"}},
		{"412 then the object is gone", false, map[string]answer{"put": {status: 412, code: "PreconditionFailed"}, "head": {status: 404}}, transient, []string{"put", "head"}},
		{"412 then HEAD fails with 500", false, map[string]answer{"put": {status: 412, code: "PreconditionFailed"}, "head": {status: 500}}, transient, []string{"put", "head"}},
		{"412 then HEAD is forbidden", false, map[string]answer{"put": {status: 412, code: "PreconditionFailed"}, "head": {status: 403}}, config, []string{"put", "head"}},
		{"412 then a foreign object", false, map[string]answer{"put": {status: 412, code: "PreconditionFailed"}}, keyReused, []string{"put", "head"}},
		{"multipart: 409 on complete, upload aborted", true, map[string]answer{"head": {status: 404}, "complete": {status: 409, code: "ConditionalRequestConflict"}}, transient, []string{"head", "create", "part", "complete", "abort"}},
		{"multipart: 500 on a part, nothing visible, upload aborted", true, map[string]answer{"head": {status: 404}, "part": {status: 500, code: "InternalError"}}, transient, []string{"head", "create", "part", "abort"}},
		{"multipart: reply to complete lost, upload aborted", true, map[string]answer{"head": {status: 404}, "complete": {hangUp: true}}, ambiguous, []string{"head", "create", "part", "complete", "abort"}},
		{"multipart: HEAD forbidden without ListBucket, upload goes on", true, map[string]answer{"head": {status: 403}}, success, []string{"head", "create", "part", "complete"}},
		{"multipart: 412 on complete, upload aborted, foreign object", true, map[string]answer{"head#1": {status: 404}, "complete": {status: 412, code: "PreconditionFailed"}}, keyReused, []string{"head", "create", "part", "complete", "abort", "head"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeS3{answers: tc.answers}
			opts := []s3.Option{}
			if tc.multipart {
				opts = append(opts, s3.WithMultipartThreshold(1))
			}
			w := scripted(t, f, opts...)
			_, err := w.Apply(context.Background(), "key", s3.Object{Body: []byte("body")})
			if err != nil && effects.ClassOf(err) == effects.Unclassified {
				t.Errorf("%v is unclassified", err)
			}
			switch tc.want {
			case transient:
				if !errors.Is(err, effects.ErrTransient) || effects.ClassOf(err) != effects.Retryable {
					t.Errorf("got %v, want retryable ErrTransient", err)
				}
			case ambiguous:
				if !errors.Is(err, effects.ErrAmbiguous) || effects.ClassOf(err) != effects.Retryable {
					t.Errorf("got %v, want retryable ErrAmbiguous", err)
				}
			case permanent:
				var api smithy.APIError
				if effects.ClassOf(err) != effects.Permanent || !errors.Is(err, effects.ErrRefused) || !errors.As(err, &api) {
					t.Errorf("got %v, want a permanent ErrRefused wrapping the SDK's API error", err)
				}
			case config:
				var api smithy.APIError
				var ce *effects.ConfigError
				if effects.ClassOf(err) != effects.InvalidConfig || !errors.As(err, &ce) || !errors.As(err, &api) || errors.Is(err, effects.ErrRefused) {
					t.Errorf("got %v, want only a configuration error wrapping the SDK's API error", err)
				}
			case keyReused:
				if !errors.Is(err, effects.ErrKeyReused) {
					t.Errorf("got %v, want ErrKeyReused", err)
				}
			case success:
				if err != nil {
					t.Errorf("got %v, want success", err)
				}
			}
			if got := f.called(); fmt.Sprint(got) != fmt.Sprint(tc.calls) {
				t.Errorf("calls %v, want %v", got, tc.calls)
			}
		})
	}
}

func TestRefusedConnectionIsTransient(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: the dial is refused, nothing was sent
	w := writerAt(t, "http://"+addr)
	_, err = w.Apply(context.Background(), "key", s3.Object{Body: []byte("body")})
	if !errors.Is(err, effects.ErrTransient) || effects.ClassOf(err) != effects.Retryable {
		t.Fatalf("got %v, want retryable ErrTransient", err)
	}
}

func TestCancelledContextIsAmbiguous(t *testing.T) {
	block := make(chan struct{})
	f := &fakeS3{block: block}
	w := scripted(t, f)
	defer close(block)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for len(f.called()) == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel() // the PUT has reached the server: its outcome is unknown
	}()
	_, err := w.Apply(ctx, "key", s3.Object{Body: []byte("body")})
	if !errors.Is(err, effects.ErrAmbiguous) || !errors.Is(err, context.Canceled) || effects.ClassOf(err) != effects.Retryable {
		t.Fatalf("got %v, want retryable ErrAmbiguous wrapping context.Canceled", err)
	}
}

// An endpoint no retry can reach (an untrusted certificate, TLS to a plain
// port) is a configuration error, not an ambiguous or transient failure:
// nothing reached S3.
func TestRefusedTLSIsAConfigurationError(t *testing.T) {
	untrusted := httptest.NewUnstartedServer(http.NotFoundHandler())
	untrusted.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	untrusted.StartTLS()
	defer untrusted.Close()
	plain := httptest.NewServer(http.NotFoundHandler())
	defer plain.Close()
	for name, endpoint := range map[string]string{
		"certificate not trusted": untrusted.URL,
		"TLS to a plain port":     strings.Replace(plain.URL, "http://", "https://", 1),
	} {
		t.Run(name, func(t *testing.T) {
			w := writerAt(t, endpoint)
			_, err := w.Apply(context.Background(), "receipt-1", s3.Object{Body: []byte("paid")})
			var ce *effects.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, effects.ErrInvalidConfig) || effects.ClassOf(err) == effects.Retryable ||
				errors.Is(err, effects.ErrAmbiguous) || errors.Is(err, effects.ErrTransient) {
				t.Fatalf("Apply = %v; want a configuration error that is not retryable", err)
			}
			if !strings.Contains(err.Error(), "PutObject") {
				t.Errorf("error %q does not name the call", err)
			}
		})
	}
}
