// Package s3test gives tests a real S3 endpoint, started on 127.0.0.1 and
// stopped when the test ends, in one of two kinds:
//
//   - [Start]: a versitygw gateway (github.com/versity/versitygw,
//     Apache-2.0) over a POSIX directory, with one fresh versioned bucket.
//     versitygw is a real S3 implementation: it enforces If-None-Match: * on
//     PutObject and on CompleteMultipartUpload under a per-object lock
//     (v1.8.0 lets exactly one of 16 concurrent conditional PUTs win), stores
//     user metadata, tags and checksums, and keeps object versions, so every
//     write of a key, overwrites included, can be counted. S3TEST_ENDPOINT
//     points it at an existing S3 service instead.
//   - [StartInProcess]: gofakes3's in-memory backend inside the test
//     process, with one fresh unversioned bucket, starting in about a
//     millisecond with no binary to build; it counts every write of every
//     key itself.
//
// Both return a [*Server]; [Server.Writes] counts the writes of a key on
// either kind, which is what a conformance harness's Count needs:
//
//	srv := s3test.Start(t)                       // or s3test.StartInProcess(t)
//	client := srv.Client(t)                      // path-style, static credentials
//	prefix := srv.Prefix(t.Name())               // a key prefix no other test uses
//	n, err := srv.Writes(ctx, prefix+"receipt")  // 1 if written once, 2 after an overwrite
//
// Counting matters because a listing cannot show an overwrite: in an
// unversioned bucket a second unconditional PUT replaces the object and the
// bucket still holds one, so a test that counts objects cannot tell an
// effectively-once writer from a plain PUT.
//
// # The versitygw binary
//
// The binary is built once from the Go module proxy with
//
//	GOBIN=<cache> go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
//
// into os.UserCacheDir()/effectively/versitygw-v1.8.0 and reused by every
// later run; concurrent test binaries serialize the build on a lock file.
// The first build compiles a large module and takes minutes (5.5 minutes on
// two busy cores); set S3TEST_VERSITYGW to the path of a prebuilt versitygw
// v1.8.0 binary to skip it. If the build fails (no Go toolchain, no module
// proxy), the error says what to install or set. Starting a gateway takes
// well under a second.
//
// # A real S3 service
//
// To run the tests that use [Start] against another S3 endpoint instead,
// set S3TEST_ENDPOINT (e.g. http://127.0.0.1:9000), S3TEST_ACCESS_KEY,
// S3TEST_SECRET_KEY and S3TEST_BUCKET, and optionally S3TEST_REGION
// (default us-east-1). The bucket must exist; [Start] turns versioning on
// and fails if the endpoint refuses, since counting writes needs versions.
// Every test then writes under its own [Server.Prefix] and nothing is
// deleted, so use a scratch bucket. [Server.Restart] fails against an
// external endpoint.
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// The versitygw release the tests run against, and the environment
// variables that point the tests at another endpoint or binary (see the
// package doc).
const (
	// versitygwVersion is the versitygw release the tests run against.
	versitygwVersion = "v1.8.0"
	// versitygwModule is the package path of the versitygw command.
	versitygwModule = "github.com/versity/versitygw/cmd/versitygw"
	// Environment variables: an endpoint, its credentials, bucket and
	// region to test against instead of a new gateway, and a versitygw
	// binary to run instead of building one.
	envEndpoint  = "S3TEST_ENDPOINT"
	envAccessKey = "S3TEST_ACCESS_KEY"
	envSecretKey = "S3TEST_SECRET_KEY"
	envBucket    = "S3TEST_BUCKET"
	envRegion    = "S3TEST_REGION"
	envBinary    = "S3TEST_VERSITYGW"
)

const (
	accessKey      = "effectively"
	secretKey      = "effectively-secret-key"
	defaultRegion  = "us-east-1"
	installTimeout = 20 * time.Minute
	startTimeout   = 30 * time.Second
	stopTimeout    = 10 * time.Second
	portAttempts   = 5
	logTailBytes   = 4000
	defaultBucket  = "effectively-test"
)

// Server is a running S3 endpoint with one bucket: a versitygw gateway
// ([Start]), an external endpoint (S3TEST_ENDPOINT), or an in-process
// server ([StartInProcess]). Its methods are safe for concurrent use.
type Server struct {
	// Endpoint is the base URL, e.g. "http://127.0.0.1:41234". It stays the
	// same across [Server.Restart].
	Endpoint string
	// Region, AccessKey and SecretKey are what clients sign requests with.
	Region, AccessKey, SecretKey string
	// Bucket exists; it has versioning enabled, except on an in-process
	// server, which counts writes itself.
	Bucket string

	mem      *inProcess // non-nil for StartInProcess
	external bool
	bin      string
	dir      string // everything below is inside it
	root     string // versitygw's data directory: buckets below it
	versions string // versitygw's versioning directory
	logPath  string
	addr     string // 127.0.0.1:PORT

	mu   sync.Mutex
	proc *process
}

// Start returns an S3 endpoint for t: a new versitygw gateway with a new
// versioned bucket, or the endpoint named by S3TEST_ENDPOINT. The gateway is
// stopped, and its directory removed, when t ends. Start fails t with what
// is missing when the gateway cannot be built or started.
func Start(t testing.TB) *Server {
	t.Helper()
	return forTest(t, New)
}

// forTest starts a server with start, failing t if it cannot, and closes it
// when t ends.
func forTest(t testing.TB, start func() (*Server, error)) *Server {
	t.Helper()
	s, err := start()
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("s3test: %v", err)
		}
	})
	return s
}

// New is [Start] for code that has no testing.TB (TestMain, examples): the
// caller must call [Server.Close].
func New() (*Server, error) {
	if os.Getenv(envEndpoint) != "" {
		return external()
	}
	bin, err := binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "s3test-")
	if err != nil {
		return nil, err
	}
	s := &Server{
		Region:    defaultRegion,
		AccessKey: accessKey,
		SecretKey: secretKey,
		Bucket:    defaultBucket,
		bin:       bin,
		dir:       dir,
		root:      filepath.Join(dir, "data"),
		versions:  filepath.Join(dir, "versions"),
		logPath:   filepath.Join(dir, "versitygw.log"),
	}
	if err := s.init(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Server) init() error {
	for _, d := range []string{s.root, s.versions} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := s.launch(ctx, ""); err != nil {
		return err
	}
	if err := s.setupBucket(ctx, true, true); err != nil {
		return fmt.Errorf("%w%s", err, s.logTail())
	}
	return nil
}

func external() (*Server, error) {
	s := &Server{
		Endpoint:  strings.TrimRight(os.Getenv(envEndpoint), "/"),
		Region:    os.Getenv(envRegion),
		AccessKey: os.Getenv(envAccessKey),
		SecretKey: os.Getenv(envSecretKey),
		Bucket:    os.Getenv(envBucket),
		external:  true,
	}
	if s.Region == "" {
		s.Region = defaultRegion
	}
	if s.AccessKey == "" || s.SecretKey == "" || s.Bucket == "" {
		return nil, fmt.Errorf("%s is set, so %s, %s and %s must be too", envEndpoint, envAccessKey, envSecretKey, envBucket)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := s.setupBucket(ctx, false, true); err != nil {
		return nil, err
	}
	return s, nil
}

// setupBucket creates the bucket (unless it is external) and enables
// versioning on it (if versioned).
func (s *Server) setupBucket(ctx context.Context, create, versioned bool) error {
	c, closeFn := s.NewClient()
	defer closeFn()
	if create {
		if _, err := c.CreateBucket(ctx, &awss3.CreateBucketInput{Bucket: &s.Bucket}); err != nil {
			return fmt.Errorf("creating bucket %s: %w", s.Bucket, err)
		}
	}
	if !versioned {
		return nil
	}
	_, err := c.PutBucketVersioning(ctx, &awss3.PutBucketVersioningInput{
		Bucket:                  &s.Bucket,
		VersioningConfiguration: &types.VersioningConfiguration{Status: types.BucketVersioningStatusEnabled},
	})
	if err != nil {
		return fmt.Errorf("enabling versioning on bucket %s at %s: %w (the tests count object versions to see overwrites; use an endpoint and bucket that support versioning)",
			s.Bucket, s.Endpoint, err)
	}
	return nil
}

// External reports whether the server is an endpoint named by
// S3TEST_ENDPOINT rather than a gateway this package started.
func (s *Server) External() bool { return s.external }

// Prefix returns a key prefix, ending in "/", that starts with name (a
// test's name, say) and that no other caller in this or any other run gets:
// tests that share a bucket (an external endpoint, or a gateway shared
// between subtests) count their objects under it.
func (s *Server) Prefix(name string) string {
	name = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '-'
	}, name)
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return name + "-" + hex.EncodeToString(b[:]) + "/"
}

// Options returns client options for the server: its endpoint, path-style
// addressing, its region and static credentials. HTTPClient is left nil;
// set one, and close its idle connections when done.
func (s *Server) Options() awss3.Options {
	return awss3.Options{
		Region:       s.Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
	}
}

// Client returns a new client for the server with its own HTTP transport,
// whose idle connections are closed when t ends. optFns adjust the options
// (retries, checksums) before the client is built.
func (s *Server) Client(t testing.TB, optFns ...func(*awss3.Options)) *awss3.Client {
	c, closeFn := s.NewClient(optFns...)
	t.Cleanup(closeFn)
	return c
}

// NewClient is [Server.Client] without a testing.TB: the caller calls the
// returned function to close the client's idle connections.
func (s *Server) NewClient(optFns ...func(*awss3.Options)) (*awss3.Client, func()) {
	tr := newTransport()
	o := s.Options()
	o.HTTPClient = &http.Client{Transport: tr}
	for _, fn := range optFns {
		fn(&o)
	}
	return awss3.New(o), tr.CloseIdleConnections
}

func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:               nil, // the endpoint is local or named explicitly
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
	}
}

// InProcess reports whether the server is an in-process one from
// [StartInProcess].
func (s *Server) InProcess() bool { return s.mem != nil }

// Restart stops the server and starts it again on the same address with
// the same data (and, in process, the same write counts), as a crashed and
// restarted S3 service would come back. Clients keep working: their pooled
// connections fail once and are re-dialed. It returns an error for an
// external endpoint.
func (s *Server) Restart(ctx context.Context) error {
	switch {
	case s.external:
		return errors.New("s3test: cannot restart an external endpoint (" + envEndpoint + ")")
	case s.mem != nil:
		return s.restartInProcess(ctx)
	}
	if err := s.Stop(); err != nil {
		return err
	}
	return s.launch(ctx, s.addr)
}

// Age makes every object and version the gateway stores d older, as if d
// had passed since it was written: versitygw reports a file's modification
// time as the object's Last-Modified, so Age moves every file's times in
// its directories back by d. Nothing is deleted. It returns an error for
// an external endpoint. A conformance harness uses it as its
// conformance.Ager.
func (s *Server) Age(d time.Duration) error {
	if s.external {
		return errors.New("s3test: cannot age an external endpoint (" + envEndpoint + ")")
	}
	for _, dir := range []string{s.root, s.versions} {
		err := filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := os.Stat(path)
			if err != nil {
				return err
			}
			return os.Chtimes(path, fi.ModTime().Add(-d), fi.ModTime().Add(-d))
		})
		if err != nil {
			return fmt.Errorf("s3test: aging %s: %w", dir, err)
		}
	}
	return nil
}

// Close stops the server and removes its directory; the cleanup of
// [Start] and [StartInProcess] calls it. For an external endpoint it does
// nothing.
func (s *Server) Close() error {
	err := s.Stop()
	if s.dir != "" {
		if rerr := os.RemoveAll(s.dir); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

// Stop stops the server, keeping its data for [Server.Restart]: requests
// fail with a refused connection until then. Stopping a stopped server
// does nothing.
func (s *Server) Stop() error {
	if s.mem != nil {
		return s.stopInProcess()
	}
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.stop()
}

// launch starts versitygw on addr, or on a free port if addr is empty, and
// waits until it answers HTTP.
func (s *Server) launch(ctx context.Context, addr string) error {
	var lastErr error
	for attempt := 0; attempt < portAttempts; attempt++ {
		a := addr
		if a == "" {
			var err error
			if a, err = freeAddr(); err != nil {
				return err
			}
		}
		p, err := startProcess(s.bin, s.logPath,
			"--access", s.AccessKey, "--secret", s.SecretKey, "--region", s.Region,
			"--port", a, "--keep-alive", "--quiet",
			"posix", "--versioning-dir", s.versions, s.root)
		if err != nil {
			return err
		}
		err = waitReady(ctx, "http://"+a, p)
		if err == nil {
			s.mu.Lock()
			s.proc = p
			if addr == "" { // the first start; a restart keeps the address (and Endpoint, which clients read)
				s.addr, s.Endpoint = a, "http://"+a
			}
			s.mu.Unlock()
			return nil
		}
		_ = p.stop()
		lastErr = fmt.Errorf("starting versitygw on %s: %w%s", a, err, s.logTail())
		if addr != "" || ctx.Err() != nil || !strings.Contains(s.logTail(), "address already in use") {
			break // a fixed address, or a failure a fresh port won't fix
		}
	}
	return lastErr
}

// logTail returns the end of the gateway's log, for error messages.
func (s *Server) logTail() string {
	if s.logPath == "" {
		return ""
	}
	b, err := os.ReadFile(s.logPath)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
	}
	return "\nversitygw log (" + s.logPath + "):\n" + string(b)
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// waitReady polls url until it answers any HTTP response, p exits, or ctx
// ends.
func waitReady(ctx context.Context, url string, p *process) error {
	tr := newTransport()
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("versitygw exited: %v", p.err)
		case <-ctx.Done():
			return fmt.Errorf("no answer after %v: %w", startTimeout, err)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// process is one running gateway.
type process struct {
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, valid after done
}

func startProcess(bin, logPath string, args ...string) (*process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	// An *os.File as stdout and stderr: the child writes to it directly and
	// exec starts no copying goroutines.
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("running %s: %w", bin, err)
	}
	p := &process{cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// stop asks the gateway to exit, kills it if it does not, and waits.
func (p *process) stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("stopping versitygw: pid %d ignored SIGINT for %v and was killed", p.cmd.Process.Pid, stopTimeout)
}

// binary returns the path of the versitygw binary: $S3TEST_VERSITYGW, or
// the cached build, building it first if there is none.
func binary() (string, error) {
	if p := os.Getenv(envBinary); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", envBinary, p, err)
		}
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for the versitygw build (%v); set %s to a versitygw %s binary", err, envBinary, versitygwVersion)
	}
	dir := filepath.Join(cache, "effectively", "versitygw-"+versitygwVersion)
	name := "versitygw"
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	bin := filepath.Join(dir, name)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	unlock, err := lockFile(filepath.Join(dir, "install.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil // another test binary built it while we waited
	}
	if err := install(dir, name); err != nil {
		return "", err
	}
	return bin, nil
}

// install builds versitygw into a temporary GOBIN inside dir, then renames
// it into place, so a half-written binary is never found.
func install(dir, name string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, serr := os.Stat(goBin); serr != nil {
			return fmt.Errorf("building versitygw %s needs the Go toolchain, and `go` is not on PATH (%v): install Go (https://go.dev/dl), "+
				"or set %s to a prebuilt versitygw %s binary, or %s (with %s, %s, %s) to an existing S3 endpoint",
				versitygwVersion, err, envBinary, versitygwVersion, envEndpoint, envAccessKey, envSecretKey, envBucket)
		}
	}
	tmp, err := os.MkdirTemp(dir, "install-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "install", versitygwModule+"@"+versitygwVersion)
	cmd.Dir = tmp // outside any module, so this repository's go.mod plays no part
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOWORK=off", "GOFLAGS=-buildvcs=false", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("building versitygw %s failed: `GOBIN=%s go install %s@%s`: %v\n%s\n"+
			"The S3 tests need versitygw: this needs the Go module proxy (GOPROXY) to be reachable and a few minutes of compiling on the first run. "+
			"Alternatively set %s to a prebuilt versitygw %s binary, or %s (with %s, %s, %s) to an existing S3 endpoint.",
			versitygwVersion, tmp, versitygwModule, versitygwVersion, err, out, envBinary, versitygwVersion, envEndpoint, envAccessKey, envSecretKey, envBucket)
	}
	return os.Rename(filepath.Join(tmp, name), filepath.Join(dir, name))
}
