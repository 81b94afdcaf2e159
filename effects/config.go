package effects

import (
	"errors"
	"fmt"
)

// ErrInvalidConfig is what every *[ConfigError] unwraps to: a constructor
// was given a missing argument or an option with a value it cannot use.
var ErrInvalidConfig = errors.New("invalid configuration")

// ConfigError is the error every constructor in this module returns for a
// missing argument or an invalid option (consume.New,
// kafka.NewSource, postgres.New, stripe.New, ...). Constructors record their
// options first and validate them once, so an error names the first problem
// and nothing was started. It unwraps to [ErrInvalidConfig].
//
// The module's convention for options, which adapters written outside it
// are encouraged to follow: each constructor takes its required arguments
// and then options, small interfaces with an unexported method (kgo.Opt's
// shape), scoped so that an option given to the wrong constructor does not
// compile; a nil option is ignored; an option only records its value; the
// constructor validates every value once and returns a *ConfigError,
// never clamping a bad value silently; each option's doc states its
// default.
type ConfigError struct {
	// Op names the constructor, e.g. "consume.New".
	Op string
	// Option names what is wrong: an option ("WithConcurrency") or an
	// argument ("source", "pool").
	Option string
	// Reason says why, in words.
	Reason string
}

// Error describes the problem.
func (e *ConfigError) Error() string {
	return e.Op + ": " + e.Option + ": " + e.Reason
}

// Unwrap returns [ErrInvalidConfig].
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// ConfigErrorf returns the *[ConfigError] of constructor op for option (an
// option's name, such as "WithLease", or an argument's, such as "pool"),
// its reason formatted from format and args.
func ConfigErrorf(op, option, format string, args ...any) error {
	return &ConfigError{Op: op, Option: option, Reason: fmt.Sprintf(format, args...)}
}
