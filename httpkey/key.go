package httpkey

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"

	"effectively.dev/effects"
)

// hashMarker separates a shortened wire key's readable prefix from its
// digest. It never occurs in a wire key that was not shortened, because
// the encoding writes every '%' as "%25" and '~' is not a hex digit.
const hashMarker = "%~"

// MinKeyLen is the smallest limit [WithMaxKeyLen] accepts: room for the
// marker and 22 characters (132 bits) of digest, so that two keys
// shortened to it still differ.
const MinKeyLen = 24

// wireKey returns the form of key the server receives: key itself when it
// holds only printable ASCII other than '%', '"' and '\' and fits in max
// bytes; otherwise every other byte (spaces, non-ASCII UTF-8, those three)
// escaped as %XX, upper-case hex, which keeps distinct keys distinct and
// leaves nothing a header, a structured-field string or a JSON string
// would need to quote. An escaped form longer than max is shortened to a
// readable prefix, [hashMarker] and the base64url SHA-256 of key (cut to
// fit): deterministic, and distinct from every form that was not
// shortened.
func wireKey(key effects.Key, max int) string {
	enc := escapeKey(string(key))
	if len(enc) <= max {
		return enc
	}
	sum := sha256.Sum256([]byte(key))
	digest := base64.RawURLEncoding.EncodeToString(sum[:])
	digest = digest[:min(len(digest), max-len(hashMarker))]
	prefix := enc[:max-len(hashMarker)-len(digest)]
	// Do not cut an escape in half: "%4" would read as another key's.
	if i := strings.LastIndexByte(prefix, '%'); i >= 0 && i >= len(prefix)-2 {
		prefix = prefix[:i]
	}
	return prefix + hashMarker + digest
}

// escapeKey escapes every byte of s that is not printable ASCII, and '%',
// '"' and '\', as %XX.
func escapeKey(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if !plain(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hexdigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plain(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexdigits[c>>4])
		b.WriteByte(hexdigits[c&0xF])
	}
	return b.String()
}

// plain reports whether c is sent as it is: visible ASCII except '%',
// '"' and '\'.
func plain(c byte) bool {
	return c > ' ' && c < 0x7F && c != '%' && c != '"' && c != '\\'
}
