package testserver

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Stopper is a server a Registry shares.
type Stopper interface{ Stop() error }

// Registry holds a test binary's shared servers, each started on first
// use under its key.
type Registry[S Stopper] struct {
	Kit string // "pgtest", for errors

	mu      sync.Mutex
	servers map[string]*entry[S]
}

type entry[S Stopper] struct {
	once sync.Once
	s    S
	err  error
}

// Get returns the server registered under key, starting it with start on
// first use. Concurrent first callers wait for one start; a failed start
// is remembered.
func (r *Registry[S]) Get(key string, start func() (S, error)) (S, error) {
	r.mu.Lock()
	if r.servers == nil {
		r.servers = map[string]*entry[S]{}
	}
	e := r.servers[key]
	if e == nil {
		e = &entry[S]{}
		r.servers[key] = e
	}
	r.mu.Unlock()
	e.once.Do(func() { e.s, e.err = start() })
	return e.s, e.err
}

// StopAll stops every server, waiting for any that are still starting,
// and forgets them: a later Get starts a new one. Stop errors are printed
// to stderr.
func (r *Registry[S]) StopAll() {
	r.mu.Lock()
	all := r.servers
	r.servers = nil
	r.mu.Unlock()
	for _, e := range all {
		e.once.Do(func() { e.err = errors.New(r.Kit + ": shared server used during shutdown") })
		if e.err == nil {
			if err := e.s.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
	}
}

// Main runs the tests, then shutdown, and then, if the tests passed,
// checks with goleak that no goroutine outlived them. It returns the exit
// code for os.Exit.
func Main(m *testing.M, kit string, shutdown func(), leakOpts ...goleak.Option) int {
	code := m.Run()
	shutdown()
	if code == 0 {
		if err := goleak.Find(leakOpts...); err != nil {
			fmt.Fprintln(os.Stderr, kit+": goroutines leaked:", err)
			code = 1
		}
	}
	return code
}

// DedicatedKey is the Registry key of the server of t's top-level test.
func DedicatedKey(t testing.TB) string {
	top, _, _ := strings.Cut(t.Name(), "/")
	return "dedicated " + top
}

var (
	// dbTag tells apart databases of test binaries that run at the same
	// time against one server (go test runs packages in parallel).
	dbTag = fmt.Sprintf("%06x", rand.Uint32()&0xffffff)
	dbSeq atomic.Int64
)

// DBName makes a database name of at most max bytes from a test name,
// unique in the test binary and among test binaries that run at once.
func DBName(testName string, max int) string {
	suffix := fmt.Sprintf("_%s_%d", dbTag, dbSeq.Add(1))
	var b strings.Builder
	for _, r := range strings.ToLower(testName) {
		if 'a' <= r && r <= 'z' || '0' <= r && r <= '9' {
			b.WriteRune(r)
		} else if s := b.String(); s != "" && !strings.HasSuffix(s, "_") {
			b.WriteByte('_')
		}
	}
	base := b.String()
	base = strings.TrimRight(base[:min(len(base), max-len(suffix))], "_")
	if base == "" {
		base = "db"
	}
	return base + suffix
}

// CreateDB runs create and, when t ends, drop, each with a minute to do
// it; it fails t (or reports the drop's error) on failure.
func CreateDB(t testing.TB, create, drop func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := create(ctx); err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := drop(ctx); err != nil {
			t.Errorf("%v", err)
		}
	})
}

// Bound returns f as a restart function that first returns ctx's error if
// ctx is done.
func Bound(f func() error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return f()
	}
}
