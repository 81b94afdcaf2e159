// Package s3mem runs an S3 endpoint in process, on a loopback port, for the
// chargehook demo and for tests that must not wait for a gateway build.
//
// It is gofakes3 (github.com/johannesboyne/gofakes3) with its in-memory
// backend behind a real net/http server on 127.0.0.1. gofakes3 checks
// If-None-Match: * under the backend's lock, so of any number of concurrent
// conditional PUTs of one key exactly one writes (see this package's test,
// which proves it through package s3). It does not enforce conditions on
// CompleteMultipartUpload: tests of multipart bodies need versitygw
// (s3/s3test).
//
// The server counts what a user would see: every PutObject that it answered
// with 200 is a write of that object ([Server.Writes]); a conditional PUT
// refused with 412 is not. An object written twice was overwritten, which is
// what a plain PUT retried after an unknown outcome does.
//
// Not for production: everything lives in memory, and requests are not
// authenticated.
package s3mem

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// Region, AccessKey and SecretKey are what clients from [Server.Client]
// sign with; the server accepts any signature.
const (
	Region    = "us-east-1"
	AccessKey = "s3mem"
	SecretKey = "s3mem-secret"
)

// Server is an in-process S3 endpoint. Its methods are safe for concurrent
// use.
type Server struct {
	// URL is the endpoint, "http://127.0.0.1:port", for path-style clients.
	URL string

	hs *http.Server
	ln net.Listener
	tr *http.Transport

	mu     sync.Mutex
	writes map[string]int // "bucket/key" -> PutObject answered 200
}

// Start starts a server on a free port of 127.0.0.1. Close it when done.
func Start() (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("s3mem: listen: %w", err)
	}
	fake := gofakes3.New(s3mem.New(), gofakes3.WithLogger(gofakes3.DiscardLog()))
	s := &Server{
		URL:    "http://" + ln.Addr().String(),
		ln:     ln,
		writes: map[string]int{},
		tr: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     30 * time.Second,
		},
	}
	s.hs = &http.Server{Handler: s.count(fake.Server()), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.hs.Serve(ln) }()
	return s, nil
}

// Close stops the server and closes the idle connections of its clients.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.tr.CloseIdleConnections()
	err := s.hs.Shutdown(ctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// Client returns a path-style client for the server. optFns adjust its
// options before it is built. Clients share one HTTP transport, whose idle
// connections Close closes.
func (s *Server) Client(optFns ...func(*awss3.Options)) *awss3.Client {
	o := awss3.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.URL),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
		HTTPClient:   &http.Client{Transport: s.tr},
	}
	for _, fn := range optFns {
		fn(&o)
	}
	return awss3.New(o)
}

// CreateBucket creates a bucket (names need at least 3 characters).
func (s *Server) CreateBucket(ctx context.Context, name string) error {
	_, err := s.Client().CreateBucket(ctx, &awss3.CreateBucketInput{Bucket: aws.String(name)})
	if err != nil {
		return fmt.Errorf("s3mem: create bucket %s: %w", name, err)
	}
	return nil
}

// Writes returns how many times the object key in bucket was written: PUTs
// the server answered with 200.
func (s *Server) Writes(bucket, key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes[bucket+"/"+key]
}

// WritesIn returns the number of writes of every object ever written in
// bucket, by object key.
func (s *Server) WritesIn(bucket string) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for k, n := range s.writes {
		if key, ok := strings.CutPrefix(k, bucket+"/"); ok {
			out[key] = n
		}
	}
	return out
}

// count wraps the S3 handler and counts successful object PUTs: a PUT of
// "/bucket/key" whose query names no sub-resource (not a part upload, an
// ACL or tagging; aws-sdk-go-v2 adds only x-id=PutObject) and without a
// copy source.
func (s *Server) count(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := strings.TrimPrefix(r.URL.Path, "/")
		q := r.URL.Query()
		q.Del("x-id")
		isPut := r.Method == http.MethodPut && len(q) == 0 && strings.Contains(path, "/") &&
			r.Header.Get("X-Amz-Copy-Source") == ""
		if !isPut {
			next.ServeHTTP(w, r)
			return
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		if sw.status == http.StatusOK {
			s.mu.Lock()
			s.writes[path]++
			s.mu.Unlock()
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
