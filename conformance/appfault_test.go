package conformance_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"effectively.dev/conformance"
)

// TestAppFaultsRoundTrip: through Faults.RoundTrip, an application error
// before the request runs nothing, one after runs it, both answer an
// *AppError with the code set, and a slow backend runs the request late.
func TestAppFaultsRoundTrip(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		kind    conformance.FaultKind
		code    string
		ran     bool
		applied bool
	}{
		{conformance.AppErrorBefore, conformance.AppDeadlock, false, false},
		{conformance.AppErrorAfter, conformance.AppHTTP500, true, true},
	} {
		f := new(conformance.Faults)
		f.SetAppError(tc.code)
		f.Arm(1, tc.kind, nil)
		ran := false
		err := f.RoundTrip(ctx, func() error { ran = true; return nil })
		var ae *conformance.AppError
		if !errors.As(err, &ae) || ae.Code != tc.code || ae.Applied != tc.applied || !errors.Is(err, conformance.ErrAppFault) {
			t.Errorf("%s: %v, want an AppError %s (applied %v)", tc.kind, err, tc.code, tc.applied)
		}
		if ran != tc.ran || !f.Fired() {
			t.Errorf("%s: ran %v (want %v), fired %v", tc.kind, ran, tc.ran, f.Fired())
		}
		if ae != nil && tc.code == conformance.AppDeadlock && ae.SQLState() != "40P01" {
			t.Errorf("SQLState %q", ae.SQLState())
		}
		if ae != nil && tc.code == conformance.AppHTTP500 && ae.HTTPStatus() != 500 {
			t.Errorf("HTTPStatus %d", ae.HTTPStatus())
		}
	}
	f := new(conformance.Faults)
	f.SetSlowBackend(100 * time.Millisecond)
	f.Arm(1, conformance.SlowBackend, nil)
	start := time.Now()
	if err := f.RoundTrip(ctx, func() error { return nil }); err != nil || time.Since(start) < 100*time.Millisecond {
		t.Errorf("slow backend: %v after %v, want nil after 100ms", err, time.Since(start))
	}
}

// TestAppFaultsOverConn: over a connection, an application error fires
// only through the harness's SetAppFaulter hook, which is called before the armed
// request is sent; without one the fault does not fire.
func TestAppFaultsOverConn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 64)
				for {
					n, err := c.Read(b)
					if err != nil {
						return
					}
					c.Write(b[:n])
				}
			}()
		}
	}()
	for _, withFaulter := range []bool{false, true} {
		f := new(conformance.Faults)
		var got *conformance.AppError
		if withFaulter {
			f.SetAppFaulter(func(e *conformance.AppError) error { got = e; return nil })
		}
		f.SetAppError(conformance.AppHTTP503)
		c, err := f.DialContext(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		f.Arm(1, conformance.AppErrorBefore, nil)
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		c.Close()
		if f.Fired() != withFaulter || (withFaulter && (got == nil || got.Code != "503" || got.Applied)) {
			t.Errorf("faulter %v: fired %v, the faulter got %+v", withFaulter, f.Fired(), got)
		}
	}
}
