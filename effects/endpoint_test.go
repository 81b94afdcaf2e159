package effects_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"effectively.dev/effects"
)

// nxdomainServer answers every DNS query on 127.0.0.1 with "no such
// name", so a test can resolve a name that does not exist without asking
// a DNS server outside this machine. It returns a dialer that resolves
// through it.
func nxdomainServer(t *testing.T) *net.Dialer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { pc.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n < 12 {
				continue
			}
			// The question: QNAME labels up to the root, then QTYPE and
			// QCLASS.
			end := 12
			for end < n && buf[end] != 0 {
				end += int(buf[end]) + 1
			}
			end += 5
			if end > n {
				continue
			}
			resp := append([]byte(nil), buf[:end]...)
			resp[2] = 0x80 | 0x04 | (buf[2] & 0x79) // QR, AA, the query's opcode and RD
			resp[3] = 0x80 | 0x03                   // RA, RCODE NXDOMAIN
			resp[4], resp[5] = 0, 1                 // one question
			for i := 6; i < 12; i++ {               // no answers, authority or additional records
				resp[i] = 0
			}
			_, _ = pc.WriteTo(resp, from)
		}
	}()
	addr := pc.LocalAddr().String()
	return &net.Dialer{Resolver: &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "udp", addr)
		},
	}}
}

func TestMisconfiguredNamesWhatNoRetryFixes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	tlsSrv := httptest.NewTLSServer(http.NotFoundHandler())
	defer tlsSrv.Close()
	tls13 := httptest.NewUnstartedServer(http.NotFoundHandler())
	tls13.TLS = &tls.Config{MinVersion: tls.VersionTLS13}
	tls13.StartTLS()
	defer tls13.Close()
	plain := httptest.NewServer(http.NotFoundHandler())
	defer plain.Close()
	trusted := x509.NewCertPool()
	trusted.AddCert(tlsSrv.Certificate())
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusing := closed.Addr().String()
	closed.Close()

	tlsDial := func(addr string, cfg *tls.Config) error {
		d := &tls.Dialer{Config: cfg}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	}
	for _, tc := range []struct {
		name   string
		err    error
		config bool
	}{
		{"host does not exist", func() error {
			_, err := nxdomainServer(t).DialContext(ctx, "tcp", "smtp.nonexistent.invalid:587")
			return err
		}(), true},
		{"certificate not trusted", tlsDial(tlsSrv.Listener.Addr().String(), &tls.Config{}), true},
		{"certificate for another host", tlsDial(tlsSrv.Listener.Addr().String(), &tls.Config{RootCAs: trusted, ServerName: "other.example"}), true},
		{"plain-text port", tlsDial(plain.Listener.Addr().String(), &tls.Config{InsecureSkipVerify: true}), true},
		{"https:// URL on a plain-text port", func() error {
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr}).Get("https://" + plain.Listener.Addr().String())
			if err == nil {
				resp.Body.Close()
			}
			return err
		}(), true},
		{"handshake refused with an alert", tlsDial(tls13.Listener.Addr().String(), &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12}), true},
		{"connection refused", func() error {
			var d net.Dialer
			_, err := d.DialContext(ctx, "tcp", refusing)
			return err
		}(), false},
		{"timeout", context.DeadlineExceeded, false},
		{"trusted certificate", tlsDial(tlsSrv.Listener.Addr().String(), &tls.Config{RootCAs: trusted, ServerName: "example.com"}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := effects.Misconfigured("test.Apply", "https://endpoint", tc.err)
			if !tc.config {
				if got != nil {
					t.Fatalf("Misconfigured(%v) = %v, want nil: a retry may fix it", tc.err, got)
				}
				return
			}
			if tc.err == nil {
				t.Fatal("the fault did not happen")
			}
			var ce *effects.ConfigError
			if !errors.Is(got, effects.ErrInvalidConfig) || !errors.As(got, &ce) || ce.Option != "https://endpoint" || ce.Op != "test.Apply" {
				t.Fatalf("Misconfigured(%v) = %v, want a *ConfigError for the endpoint", tc.err, got)
			}
			if !errors.Is(got, tc.err) || effects.ClassOf(got) == effects.Retryable {
				t.Errorf("%v: the cause is not reachable, or it is retryable", got)
			}
		})
	}
}
