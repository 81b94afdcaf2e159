package effects

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// Fingerprint returns the SHA-256 of fields, each length-prefixed so that
// ("ab", "c") and ("a", "bc") differ. Adapters store it beside a key to
// detect a key reused with a different payload ([ErrKeyReused]).
func Fingerprint(fields ...[]byte) []byte {
	h := sha256.New()
	var n [8]byte
	for _, f := range fields {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write(f)
	}
	return h.Sum(nil)
}

// errInvalidUTF8 is what [FingerprintJSON] returns, with [ErrPoison], for
// a value holding a string that is not valid UTF-8.
var errInvalidUTF8 = errors.New("a string holds invalid UTF-8, which JSON cannot represent: " +
	"carry binary data in []byte fields (encoded as base64) or supply your own fingerprint")

// FingerprintJSON returns the [Fingerprint] of v's JSON encoding. It is
// deterministic for structs, maps (encoding/json sorts map keys), slices and
// scalars; types with custom MarshalJSON must be deterministic themselves.
//
// encoding/json replaces invalid UTF-8 in strings with U+FFFD, which would
// give "\xff" and "\xfe" one fingerprint and hide a key reused with another
// payload, so such a value is refused instead, with an error wrapping
// [ErrPoison]: the same input fails the same way on every retry.
func FingerprintJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("effects: fingerprint: %w", err)
	}
	if replacedInvalidUTF8(b) {
		return nil, fmt.Errorf("effects: fingerprint: %w: %w", ErrPoison, errInvalidUTF8)
	}
	return Fingerprint(b), nil
}

// replacedInvalidUTF8 reports whether encoding/json replaced invalid UTF-8
// while encoding b: it writes a replaced byte as the escape \ufffd, whereas
// a real U+FFFD in the input is written as its UTF-8 bytes, and a backslash
// in the input as \\ (so an escape is one preceded by an even number of
// backslashes).
func replacedInvalidUTF8(b []byte) bool {
	const esc = `\ufffd`
	for i := 0; ; {
		j := bytes.Index(b[i:], []byte(esc))
		if j < 0 {
			return false
		}
		j += i
		n := 0
		for k := j - 1; k >= 0 && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return true
		}
		i = j + len(esc)
	}
}
