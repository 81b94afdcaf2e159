package postgres

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"effectively.dev/effects"
)

// notSent is an error that pgconn reports as raised before anything was
// sent, like its own connection-lock and context-already-done errors.
type notSent struct{}

func (notSent) Error() string     { return "conn closed before sending" }
func (notSent) SafeToRetry() bool { return true }

func TestClassify(t *testing.T) {
	pgErr := func(sev, code string) error {
		return &pgconn.PgError{Severity: sev, SeverityUnlocalized: sev, Code: code, Message: "m"}
	}
	errCaller := errors.New("card declined")
	netErr := &net.OpError{Op: "read", Net: "tcp", Err: io.ErrUnexpectedEOF}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	live := context.Background()

	type want struct {
		retry     bool
		kind      error // effects sentinel expected by errors.Is, or nil for none
		is        error // another error errors.Is must find
		retryable bool
	}
	for _, tc := range []struct {
		name       string
		ctx        context.Context
		err        error
		committing bool
		broken     bool
		want       want
	}{
		{"40001 before commit is retried", live, pgErr("ERROR", "40001"), false, false, want{true, effects.ErrTransient, nil, true}},
		{"40P01 before commit is retried", live, pgErr("ERROR", "40P01"), false, false, want{true, effects.ErrTransient, nil, true}},
		{"40001 at commit is retried", live, pgErr("ERROR", "40001"), true, false, want{true, effects.ErrTransient, nil, true}},
		{"55P03 (lock_timeout, NOWAIT) before commit is retried", live, pgErr("ERROR", "55P03"), false, false, want{true, effects.ErrTransient, nil, true}},
		{"55P03 at commit is retried", live, pgErr("ERROR", "55P03"), true, false, want{true, effects.ErrTransient, nil, true}},
		{"terminated backend before commit is transient", live, pgErr("FATAL", "57P01"), false, false, want{false, effects.ErrTransient, nil, true}},
		{"terminated backend at commit is ambiguous", live, pgErr("FATAL", "57P01"), true, false, want{false, effects.ErrAmbiguous, nil, true}},
		{"network error before commit is transient", live, netErr, false, false, want{false, effects.ErrTransient, nil, true}},
		{"network error at commit is ambiguous", live, netErr, true, false, want{false, effects.ErrAmbiguous, nil, true}},
		{"COMMIT never sent is transient", live, notSent{}, true, false, want{false, effects.ErrTransient, nil, true}},
		{"ERROR at commit means rolled back", live, pgErr("ERROR", "23503"), true, false, want{false, nil, nil, false}},
		{"commit that rolled back is permanent", live, pgx.ErrTxCommitRollback, true, false, want{false, nil, pgx.ErrTxCommitRollback, false}},
		{"ctx done before commit returns the ctx error", done, netErr, false, false, want{false, nil, context.Canceled, true}},
		{"ctx done while committing is ambiguous", done, netErr, true, false, want{false, effects.ErrAmbiguous, context.Canceled, true}},
		{"ctx done, COMMIT never sent", done, notSent{}, true, false, want{false, nil, context.Canceled, true}},
		{"caller error passes through", live, errCaller, false, false, want{false, nil, errCaller, false}},
		{"caller error on a closed connection is transient", live, errCaller, false, true, want{false, effects.ErrTransient, errCaller, true}},
		{"caller's constraint violation passes through", live, pgErr("ERROR", "23505"), false, false, want{false, nil, nil, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := classify(tc.ctx, "op", "k", tc.err, tc.committing, tc.broken)
			if c.retry != tc.want.retry {
				t.Errorf("retry = %t, want %t", c.retry, tc.want.retry)
			}
			for _, kind := range []error{effects.ErrTransient, effects.ErrAmbiguous} {
				if errors.Is(c.err, kind) != (kind == tc.want.kind) {
					t.Errorf("errors.Is(%v, %v) = %t", c.err, kind, !(kind == tc.want.kind))
				}
			}
			if tc.want.is != nil && !errors.Is(c.err, tc.want.is) {
				t.Errorf("%v does not wrap %v", c.err, tc.want.is)
			}
			if !errors.Is(c.err, tc.err) {
				t.Errorf("%v does not wrap the cause %v", c.err, tc.err)
			}
			if got := effects.ClassOf(c.err) == effects.Retryable; got != tc.want.retryable {
				t.Errorf("ClassOf(%v) == Retryable is %t, want %t", c.err, got, tc.want.retryable)
			}
		})
	}
}
