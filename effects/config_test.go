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

func TestConfigErrorf(t *testing.T) {
	err := effects.ConfigErrorf("kafka.NewSource", "WithMaxPoll", "%d records; need at least 1", 0)
	var ce *effects.ConfigError
	if !errors.As(err, &ce) || !errors.Is(err, effects.ErrInvalidConfig) {
		t.Fatalf("ConfigErrorf = %#v, want a *effects.ConfigError unwrapping to ErrInvalidConfig", err)
	}
	if got, want := err.Error(), "kafka.NewSource: WithMaxPoll: 0 records; need at least 1"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}
