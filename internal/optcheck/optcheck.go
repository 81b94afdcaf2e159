// Package optcheck builds the *effects.ConfigError that every constructor
// in the module returns for a missing argument or an option it cannot use.
package optcheck

import (
	"fmt"

	"effectively.dev/effects"
)

// Bad returns the *effects.ConfigError of constructor op for option (an
// option's name, such as "WithLease", or an argument's, such as "pool"),
// its reason formatted from format and args.
func Bad(op, option, format string, args ...any) error {
	return &effects.ConfigError{Op: op, Option: option, Reason: fmt.Sprintf(format, args...)}
}
