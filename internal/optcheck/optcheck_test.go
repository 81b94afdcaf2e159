package optcheck

import (
	"errors"
	"testing"

	"effectively.dev/effects"
)

func TestBad(t *testing.T) {
	err := Bad("kafka.NewSource", "WithMaxPoll", "%d records; need at least 1", 0)
	var ce *effects.ConfigError
	if !errors.As(err, &ce) || !errors.Is(err, effects.ErrInvalidConfig) {
		t.Fatalf("Bad = %#v, want a *effects.ConfigError unwrapping to ErrInvalidConfig", err)
	}
	if got, want := err.Error(), "kafka.NewSource: WithMaxPoll: 0 records; need at least 1"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}
