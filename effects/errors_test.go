package effects_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"effectively.dev/effects"
)

func TestClassOfRetryable(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{io.EOF, false},
		{effects.Ambiguous("op", "k", io.ErrUnexpectedEOF), true},
		{effects.Transient("op", "k", io.EOF), true},
		{&effects.Error{Kind: effects.ErrInFlight}, true},
		{&effects.Error{Kind: effects.ErrKeyReused}, false},
		{&effects.Error{Kind: effects.ErrInvalidKey}, false},
		{fmt.Errorf("wrapped: %w", effects.Ambiguous("op", "k", nil)), true},
		{context.Canceled, true},
		{fmt.Errorf("apply: %w", context.DeadlineExceeded), true},
		// A permanent kind wins over a retryable cause underneath.
		{&effects.Error{Kind: effects.ErrKeyReused, Err: context.Canceled}, false},
	}
	for _, c := range cases {
		if got := effects.ClassOf(c.err) == effects.Retryable; got != c.want {
			t.Errorf("ClassOf(%v) == Retryable is %v, want %v", c.err, got, c.want)
		}
	}
}

func TestErrorKeepsCause(t *testing.T) {
	cause := &causeErr{"vendor said no"}
	err := fmt.Errorf("handler: %w", effects.Ambiguous("postgres.Apply", "evt_1", cause))
	if !errors.Is(err, effects.ErrAmbiguous) {
		t.Fatal("errors.Is(ErrAmbiguous) = false")
	}
	if errors.Is(err, effects.ErrTransient) {
		t.Fatal("ambiguous error matches ErrTransient")
	}
	var c *causeErr
	if !errors.As(err, &c) || c != cause {
		t.Fatal("errors.As does not reach the vendor error")
	}
	for _, want := range []string{"postgres.Apply", `"evt_1"`, "outcome unknown", "vendor said no", "retry with the same key"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err.Error(), want)
		}
	}
}

type causeErr struct{ s string }

func (e *causeErr) Error() string { return e.s }
