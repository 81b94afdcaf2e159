package ratelog

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"

	"effectively.dev/effects"
)

// MaxIDBytes is the most bytes of a delivery id or key that this module
// writes into a log line, a span attribute, a metric-free event log or an
// error text: a longer one (an id header of hundreds of kilobytes) is
// shown by [Bound].
const MaxIDBytes = 256

// Bound returns s when it is at most [MaxIDBytes] long. A longer s becomes
// its first bytes, "…", and "sha256:" with the first 16 hex digits of its
// SHA-256, MaxIDBytes in all, so that a log line or span stays small and
// the full id can still be matched.
func Bound(s string) string {
	if len(s) <= MaxIDBytes {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	tail := "…sha256:" + hex.EncodeToString(sum[:8])
	return strings.ToValidUTF8(s[:MaxIDBytes-len(tail)], "") + tail
}

// Class names err's class in the one vocabulary this module's logs, span
// attributes and dead-letter headers share: "poison" when err matches
// [effects.ErrPoison] (a permanent error of the delivery itself), otherwise
// [effects.ClassOf]'s name: "permanent", "retryable", "configuration" or
// "unclassified".
func Class(err error) string {
	if errors.Is(err, effects.ErrPoison) {
		return "poison"
	}
	return effects.ClassOf(err).String()
}
