package conformance

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// defaultSlowBackend is how long a [SlowBackend] fault makes the backend
// work when [Faults.SetSlowBackend] was not called.
const defaultSlowBackend = 2 * time.Second

// AppError is the application error a backend answers under an
// [AppErrorBefore] or [AppErrorAfter] fault. Through [Faults.RoundTrip]
// and [Faults.SQLConnector] the adapter receives it as the call's error
// (SQLConnector then closes the driver connection, so that the
// transaction it held rolls back as the server's would); a
// harness whose backend is a server makes the server answer with it (see
// [Faults.SetAppFaulter]).
type AppError struct {
	// Code is what the backend answers: a SQLSTATE ("40001", "40P01",
	// "55P03"), "busy" (SQLite's SQLITE_BUSY, a driver's "database is
	// locked"), or an HTTP status ("500", "503", "409").
	Code string
	// Applied says whether the backend applied the request before it
	// answered with the error.
	Applied bool
}

// Error describes the fault.
func (e *AppError) Error() string {
	how := "before applying the request"
	if e.Applied {
		how = "after applying the request"
	}
	return fmt.Sprintf("conformance: injected application error %s (%s), %s", e.Code, appCodeMeaning(e.Code), how)
}

// Is reports whether target is [ErrAppFault].
func (e *AppError) Is(target error) bool { return target == ErrAppFault }

// SQLState returns Code when it is a SQLSTATE (five characters), else "":
// the method database/sql drivers' errors (pgconn.PgError) have, which
// adapters use to classify.
func (e *AppError) SQLState() string {
	if len(e.Code) == 5 {
		return e.Code
	}
	return ""
}

// HTTPStatus returns Code as an HTTP status, or 0 when it is none.
func (e *AppError) HTTPStatus() int {
	if n, err := strconv.Atoi(e.Code); err == nil && n >= 100 && n < 600 {
		return n
	}
	return 0
}

// Busy reports whether the fault is a busy database ("busy").
func (e *AppError) Busy() bool { return e.Code == AppBusy }

// Codes of application errors the suite injects.
const (
	AppSerialization = "40001" // serialization_failure
	AppDeadlock      = "40P01" // deadlock_detected
	AppLockTimeout   = "55P03" // lock_not_available
	AppBusy          = "busy"  // SQLITE_BUSY, "database is locked"
	AppHTTP500       = "500"
	AppHTTP503       = "503"
	AppHTTP409       = "409" // a concurrent request with the same key is in progress
)

// appCodeMeaning names an application error code.
func appCodeMeaning(code string) string {
	switch code {
	case AppSerialization:
		return "serialization failure"
	case AppDeadlock:
		return "deadlock detected"
	case AppLockTimeout:
		return "lock not available"
	case AppBusy:
		return "database busy"
	case AppHTTP500:
		return "internal server error"
	case AppHTTP503:
		return "service unavailable"
	case AppHTTP409:
		return "conflict"
	}
	return "application error"
}

// afterApply reports whether code can answer a request that was applied:
// a server error (5xx) other than 503, which a server or its proxy sends
// when it will not take the request. A database refuses (40001, 40P01,
// 55P03, busy) before anything is applied, and a 409 or another 4xx
// refuses the request.
func afterApply(code string) bool {
	s := (&AppError{Code: code}).HTTPStatus()
	return s >= 500 && s != 503
}

// SQLAppCodes and HTTPAppCodes are the application errors the suite
// injects into a database/sql backend and an HTTP backend.
var (
	SQLAppCodes  = []string{AppSerialization, AppDeadlock, AppLockTimeout, AppBusy}
	HTTPAppCodes = []string{AppHTTP500, AppHTTP503, AppHTTP409}
)

// appState is the part of a Faults that application faults use.
type appState struct {
	mu      sync.Mutex
	code    string
	slow    time.Duration
	faulter func(e *AppError) error
}

func (f *Faults) app() *appState { return &f.appf }

// SetAppError sets the code an [AppErrorBefore] or [AppErrorAfter] fault
// answers with (default [AppSerialization]).
func (f *Faults) SetAppError(code string) {
	s := f.app()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.code = code
}

// SetSlowBackend sets how long a [SlowBackend] fault makes the backend
// work (default 2s).
func (f *Faults) SetSlowBackend(d time.Duration) {
	s := f.app()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slow = d
}

// SetAppFaulter registers fn, the harness's hook that makes its backend
// answer its next request with e (applying it first when e.Applied), the
// connection up. A harness whose adapter reaches a server over a
// connection (an HTTP kit with switches such as httpkeytest's FailNext and
// FailNextAfterCreate) registers one; the Faults calls it when the armed
// round trip starts, before its request is sent. fn returns an error when
// the backend cannot fail that way (the code is not one it knows): the
// fault then does not fire. Without a hook, application faults fire only
// on round trips made through [Faults.RoundTrip] and [Faults.SQLConnector].
func (f *Faults) SetAppFaulter(fn func(e *AppError) error) {
	s := f.app()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faulter = fn
}

func (f *Faults) appSettings() (code string, slow time.Duration, faulter func(e *AppError) error) {
	s := f.app()
	s.mu.Lock()
	defer s.mu.Unlock()
	code, slow, faulter = s.code, s.slow, s.faulter
	if code == "" {
		code = AppSerialization
	}
	if slow <= 0 {
		slow = defaultSlowBackend
	}
	return code, slow, faulter
}

// isApp reports whether k is an application-level fault.
func (k FaultKind) isApp() bool { return k >= AppErrorBefore && k <= SlowBackend }

func (k FaultKind) appString() string {
	switch k {
	case AppErrorBefore:
		return "application error before apply"
	case AppErrorAfter:
		return "application error after apply"
	case SlowBackend:
		return "slow backend"
	}
	return ""
}

// appRoundTrip runs fn as a round trip armed with the application fault
// kind: the backend is in process, so the Faults itself answers with the
// error, or works slowly.
func (f *Faults) appRoundTrip(ctx context.Context, kind FaultKind, fn func() error) error {
	code, slow, _ := f.appSettings()
	switch kind {
	case AppErrorBefore:
		return &AppError{Code: code}
	case AppErrorAfter:
		_ = fn()
		return &AppError{Code: code, Applied: true}
	case SlowBackend:
		end := time.Now().Add(slow)
		t := time.NewTimer(slow)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			// The caller gave up; the backend still does the work when the
			// time is up, as a server does once a request reached it. The
			// work runs before this returns: fn writes the caller's
			// variables (a driver connection, rows), so it must not run
			// after the caller has moved on.
			time.Sleep(time.Until(end))
			_ = fn()
			return ctx.Err()
		}
	}
	return fn()
}

// appOverConn fires the application fault kind on a round trip over a
// connection, through the harness's hook ([Faults.SetAppFaulter]) (a server it controls),
// and returns how long to hold the request before it is sent (a slow
// backend, seen from the client). A fault the backend cannot do is
// marked not fired.
func (f *Faults) appOverConn(kind FaultKind) (hold time.Duration) {
	code, slow, faulter := f.appSettings()
	switch kind {
	case SlowBackend:
		return slow
	case AppErrorBefore, AppErrorAfter:
		if faulter != nil && faulter(&AppError{Code: code, Applied: kind == AppErrorAfter}) == nil {
			return 0
		}
	}
	f.mu.Lock()
	f.fired = false
	f.mu.Unlock()
	return 0
}
