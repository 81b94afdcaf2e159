package effects

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
)

// Misconfigured classifies a failure to reach an effect's owner. It returns
// a configuration error when no retry can fix err, and nil otherwise, so an
// adapter reports a wrong endpoint as what it is instead of as an endless
// [ErrTransient]:
//
//   - the host name does not exist (the DNS answered "no such host");
//   - the TLS handshake was refused: the server's certificate is not
//     trusted or not for this host name, the peer does not speak TLS (a
//     TLS client on a plain-text port, also as net/http reports it for an
//     https:// URL), or it ended the handshake with an alert (no common
//     protocol version or cipher, our certificate refused).
//
// A refused or reset connection, a timeout, a DNS server that did not
// answer: those are what a restarting or overloaded server looks like, a
// retry may succeed, and Misconfigured returns nil for them.
//
// The error it returns unwraps both to a *[ConfigError] (Op op, Option
// endpoint, so errors.Is(err, [ErrInvalidConfig])) and to err, whose TLS
// or DNS error errors.As still reaches. Its class is [InvalidConfig]:
// nothing was applied, and the same request cannot succeed until the
// configuration changes.
func Misconfigured(op, endpoint string, err error) error {
	var (
		dns    *net.DNSError
		verify *tls.CertificateVerificationError
		header tls.RecordHeaderError
		alert  tls.AlertError
		remote *net.OpError
		ua     x509.UnknownAuthorityError
		host   x509.HostnameError
		inv    x509.CertificateInvalidError
		reason string
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &dns) && dns.IsNotFound:
		reason = "the host name does not exist; check the address"
	case errors.As(err, &verify), errors.As(err, &ua), errors.As(err, &host), errors.As(err, &inv):
		reason = "the server's TLS certificate was refused; check the host name and the trusted CAs"
	case errors.As(err, &header), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		// net/http replaces the RecordHeaderError of an HTTPS request to a
		// plain HTTP server with an error of its own, by this text.
		reason = "the server does not speak TLS on this port; check the port and the TLS mode"
	case errors.As(err, &alert), errors.As(err, &remote) && remote.Op == "remote error":
		// crypto/tls reports an alert the peer sent as a *net.OpError
		// "remote error" (AlertError only over QUIC).
		reason = "the server refused the TLS handshake with an alert; check the TLS settings"
	default:
		return nil
	}
	return fmt.Errorf("%w (no retry fixes this): %w", &ConfigError{Op: op, Option: endpoint, Reason: reason}, err)
}
