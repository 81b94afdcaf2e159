package s3_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/goleak"

	"effectively.dev/s3/s3test"
)

// examples holds what the examples started; TestMain releases it. Examples
// cannot call t.Cleanup.
var examples struct {
	mu      sync.Mutex
	closers []func() error
}

func atExit(fn func() error) {
	examples.mu.Lock()
	defer examples.mu.Unlock()
	examples.closers = append(examples.closers, fn)
}

// exampleServer gives an example an S3 endpoint whose bucket holds nothing
// under prefixes: a new gateway, or, with S3TEST_ENDPOINT, the external
// bucket with every version under prefixes deleted first.
func exampleServer(prefixes ...string) *s3test.Server {
	srv, err := s3test.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, "s3 examples:", err)
		os.Exit(1)
	}
	atExit(srv.Close)
	if srv.External() {
		c, closeFn := srv.NewClient()
		defer closeFn()
		for _, p := range prefixes {
			if err := purge(context.Background(), c, srv.Bucket, p); err != nil {
				fmt.Fprintln(os.Stderr, "s3 examples:", err)
				os.Exit(1)
			}
		}
	}
	return srv
}

// exampleClient returns a client for srv, closed when the tests end.
func exampleClient(srv *s3test.Server) *awss3.Client {
	c, closeFn := srv.NewClient()
	atExit(func() error { closeFn(); return nil })
	return c
}

// purge deletes every version and delete marker under prefix.
func purge(ctx context.Context, c *awss3.Client, bucket, prefix string) error {
	p := awss3.NewListObjectVersionsPaginator(c, &awss3.ListObjectVersionsInput{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, v := range page.Versions {
			if _, err := c.DeleteObject(ctx, &awss3.DeleteObjectInput{Bucket: aws.String(bucket), Key: v.Key, VersionId: v.VersionId}); err != nil {
				return err
			}
		}
		for _, m := range page.DeleteMarkers {
			if _, err := c.DeleteObject(ctx, &awss3.DeleteObjectInput{Bucket: aws.String(bucket), Key: m.Key, VersionId: m.VersionId}); err != nil {
				return err
			}
		}
	}
	return nil
}

func TestMain(m *testing.M) {
	code := m.Run()
	for i := len(examples.closers) - 1; i >= 0; i-- {
		if err := examples.closers[i](); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// env is one test's view of a gateway: a client and a prefix of its own.
type env struct {
	t      testing.TB
	srv    *s3test.Server
	client *awss3.Client
	prefix string
}

func newEnv(t testing.TB, optFns ...func(*awss3.Options)) *env {
	t.Helper()
	srv := s3test.Start(t)
	return &env{t: t, srv: srv, client: srv.Client(t, optFns...), prefix: srv.Prefix(t.Name())}
}

// versions counts the versions of the object named name (delete markers
// excluded): every successful write of it, overwrites included.
func (e *env) versions(name string) int {
	e.t.Helper()
	n, err := countVersions(context.Background(), e.srv, name, true)
	if err != nil {
		e.t.Fatalf("counting versions of %s: %v", name, err)
	}
	return n
}

// total counts all versions under the env's prefix.
func (e *env) total() int {
	e.t.Helper()
	n, err := countVersions(context.Background(), e.srv, e.prefix, false)
	if err != nil {
		e.t.Fatalf("counting versions under %s: %v", e.prefix, err)
	}
	return n
}

// countVersions counts object versions whose key is name (exact) or starts
// with it (!exact): every write, overwrites included.
func countVersions(ctx context.Context, srv *s3test.Server, name string, exact bool) (int, error) {
	if exact {
		return srv.Writes(ctx, name)
	}
	byKey, err := srv.WritesUnder(ctx, name)
	total := 0
	for _, n := range byKey {
		total += n
	}
	return total, err
}

// nothingSent fails the test if a request reached S3 through rt or an
// object exists under the env's prefix.
func (e *env) nothingSent(rt *roundTripCounter) {
	e.t.Helper()
	if n := rt.count(); n != 0 {
		e.t.Errorf("%d requests reached S3, want 0", n)
	}
	if n := e.total(); n != 0 {
		e.t.Errorf("%d objects written, want 0", n)
	}
}

// roundTripCounter counts requests; tests use it to prove no I/O happened.
type roundTripCounter struct {
	mu    sync.Mutex
	n     int
	base  http.RoundTripper
	hooks func(*http.Request)
}

func (c *roundTripCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.n++
	hook := c.hooks
	c.mu.Unlock()
	if hook != nil {
		hook(r)
	}
	return c.base.RoundTrip(r)
}

func (c *roundTripCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}
