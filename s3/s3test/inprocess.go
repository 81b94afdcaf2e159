package s3test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// Credentials and region of an in-process server. It accepts any
// signature; clients from [Server.Client] sign with these.
const (
	inProcessAccessKey = "s3test"
	inProcessSecretKey = "s3test-secret-key"
)

// restartAttempts bounds how long Restart waits for the old port to free.
const restartAttempts = 50

// inProcess is the state of a server started by [NewInProcess]: gofakes3's
// in-memory backend behind a net/http server that counts writes.
type inProcess struct {
	handler http.Handler // gofakes3 wrapped by the counter; survives Restart

	mu     sync.Mutex
	hs     *http.Server // nil while stopped
	writes map[string]int
}

// StartInProcess returns an S3 endpoint that runs inside the test process:
// gofakes3 (github.com/johannesboyne/gofakes3, MIT) with its in-memory
// backend, behind a real HTTP server on a free 127.0.0.1 port, with one
// fresh unversioned bucket. It starts in about a millisecond and needs no
// binary. The server is closed when t ends.
//
// It counts, per object key, every write the server answered with 200
// ([Server.Writes]): a PutObject, a CopyObject to the key, or a
// CompleteMultipartUpload. A conditional PutObject refused with 412 is not a
// write. That is what a test of an unversioned bucket needs: a second
// unconditional PUT of a key overwrites it, and a listing still shows one
// object, so only the server can tell an overwrite happened.
//
// gofakes3 checks If-None-Match: * on PutObject under its backend's lock, so
// of any number of concurrent conditional PUTs of one key exactly one
// writes; it does not enforce the condition on CompleteMultipartUpload, so
// tests of conditional multipart uploads need [Start] (versitygw). It
// accepts any credentials, and only path-style requests. Unlike [Start], it
// ignores S3TEST_ENDPOINT: it is the choice for tests that count writes in
// an unversioned bucket, or must not wait for a gateway build.
func StartInProcess(t testing.TB) *Server {
	t.Helper()
	return forTest(t, NewInProcess)
}

// NewInProcess is [StartInProcess] for code that has no testing.TB
// (TestMain, examples, a demo): the caller must call [Server.Close].
func NewInProcess() (*Server, error) {
	m := &inProcess{writes: map[string]int{}}
	fake := gofakes3.New(s3mem.New(), gofakes3.WithLogger(gofakes3.DiscardLog()))
	m.handler = m.count(fake.Server())
	s := &Server{
		Region:    defaultRegion,
		AccessKey: inProcessAccessKey,
		SecretKey: inProcessSecretKey,
		Bucket:    defaultBucket,
		mem:       m,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening on 127.0.0.1: %w", err)
	}
	s.addr, s.Endpoint = ln.Addr().String(), "http://"+ln.Addr().String()
	s.serve(ln)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := s.setupBucket(ctx, true, false); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// serve serves the in-process handler on ln.
func (s *Server) serve(ln net.Listener) {
	hs := &http.Server{Handler: s.mem.handler, ReadHeaderTimeout: 10 * time.Second}
	s.mu.Lock()
	s.mem.hs = hs
	s.mu.Unlock()
	go func() { _ = hs.Serve(ln) }()
}

// stopInProcess closes the HTTP server and every connection to it; the
// backend keeps its objects and counts.
func (s *Server) stopInProcess() error {
	s.mu.Lock()
	hs := s.mem.hs
	s.mem.hs = nil
	s.mu.Unlock()
	if hs == nil {
		return nil
	}
	if err := hs.Close(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("stopping the in-process server: %w", err)
	}
	return nil
}

// restartInProcess serves the same backend on the same address again.
func (s *Server) restartInProcess(ctx context.Context) error {
	if err := s.stopInProcess(); err != nil {
		return err
	}
	var lastErr error
	for range restartAttempts {
		ln, err := net.Listen("tcp", s.addr)
		if err == nil {
			s.serve(ln)
			return nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("restarting the in-process server on %s: %w", s.addr, ctx.Err())
		case <-time.After(20 * time.Millisecond): // the port may take a moment to free
		}
	}
	return fmt.Errorf("restarting the in-process server on %s: %w", s.addr, lastErr)
}

// writesOf returns the count of writes of key in bucket, or of every key
// under prefix (when byPrefix).
func (m *inProcess) writesOf(bucket, key string, byPrefix bool) map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for k, n := range m.writes {
		name, ok := strings.CutPrefix(k, bucket+"/")
		if ok && (name == key || byPrefix && strings.HasPrefix(name, key)) {
			out[name] = n
		}
	}
	return out
}

// count wraps the S3 handler and counts successful writes by "bucket/key":
// a PUT of an object (no sub-resource in the query but x-id, which
// aws-sdk-go-v2 adds; a copy source is fine: CopyObject writes the key), or
// a POST with uploadId (CompleteMultipartUpload).
func (m *inProcess) count(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := strings.TrimPrefix(r.URL.Path, "/")
		q := r.URL.Query()
		q.Del("x-id")
		write := strings.Contains(path, "/") &&
			(r.Method == http.MethodPut && len(q) == 0 ||
				r.Method == http.MethodPost && len(q) == 1 && q.Has("uploadId"))
		if !write {
			next.ServeHTTP(w, r)
			return
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		if sw.status == http.StatusOK {
			m.mu.Lock()
			m.writes[path]++
			m.mu.Unlock()
		}
	})
}

// statusWriter remembers the status a handler answered with.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}
