package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// jsServer is nats-server with JetStream, embedded in the test process from
// the Go module (github.com/nats-io/nats-server/v2), on a free 127.0.0.1
// port, storing its streams in a temporary directory, so that it can be
// restarted with its data.
type jsServer struct {
	opts *server.Options
	srv  *server.Server
}

// startServer starts a server for t and shuts it down when t ends.
func startServer(t testing.TB) *jsServer {
	t.Helper()
	s, err := newServer(t.TempDir())
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	t.Cleanup(s.stop)
	return s
}

// newServer starts a server that stores its streams in dir; the caller
// stops it.
func newServer(dir string) (*jsServer, error) {
	s := &jsServer{opts: &server.Options{
		Host:                   "127.0.0.1",
		Port:                   server.RANDOM_PORT,
		JetStream:              true,
		StoreDir:               dir,
		NoLog:                  true,
		NoSigs:                 true,
		DisableJetStreamBanner: true,
	}}
	return s, s.start()
}

// URL returns the client URL, e.g. nats://127.0.0.1:4222.
func (s *jsServer) URL() string {
	return "nats://" + net.JoinHostPort(s.opts.Host, strconv.Itoa(s.opts.Port))
}

func (s *jsServer) start() error {
	srv, err := server.NewServer(s.opts)
	if err != nil {
		return err
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return errors.New("not ready for connections after 10s")
	}
	if s.opts.Port == server.RANDOM_PORT {
		s.opts.Port = srv.Addr().(*net.TCPAddr).Port // a restart comes back on the same port
	}
	s.srv = srv
	return nil
}

func (s *jsServer) stop() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}

// Restart shuts the server down and starts it again on the same port with
// the same store: its streams, messages and duplicate windows survive.
func (s *jsServer) Restart(ctx context.Context) error {
	s.stop()
	var err error
	for ctx.Err() == nil {
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond) // the port may take a moment to free
	}
	return fmt.Errorf("restarting nats-server: %v: %w", err, ctx.Err())
}
