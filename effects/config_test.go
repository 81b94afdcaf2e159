package effects_test

import (
	"errors"
	"testing"

	"effectively.dev/effects"
)

func TestConfigErrorUnwrapsToErrInvalidConfig(t *testing.T) {
	err := error(&effects.ConfigError{Op: "pkg.New", Option: "WithSize", Reason: "size -1; need at least 1"})
	if !errors.Is(err, effects.ErrInvalidConfig) {
		t.Fatalf("errors.Is(%v, ErrInvalidConfig) = false", err)
	}
	if got, want := err.Error(), "pkg.New: WithSize: size -1; need at least 1"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
