package s3

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"unicode/utf8"

	"effectively.dev/effects"
)

// maxEscapedKeyLen bounds the length of [EscapeKey]'s result. It keeps the
// last path component of an object key under the 255-byte file-name limit of
// POSIX file systems, which S3 gateways such as versitygw store objects in.
const maxEscapedKeyLen = 200

// hashedKeyPrefixLen is how much of a long key's escaped form EscapeKey
// keeps in front of its digest.
const hashedKeyPrefixLen = 128

// maxObjectKeyLen is S3's limit on an object key, in bytes of UTF-8.
const maxObjectKeyLen = 1024

// EscapeKey returns the default object-key form of an idempotency key: a
// single path component that any S3 service stores as it is.
//
// Every byte outside A-Z, a-z, 0-9, '-', '_', '.' and ':' is percent-encoded
// as %XX (upper-case hex), and so is a leading '.'. So '/' never splits the
// key into "directories", "." and ".." never appear as components, '%' and
// '~' are always escaped, spaces and non-ASCII letters are encoded, and two
// different keys never escape to the same string. Keys built by
// [effects.NewKey] mostly stay readable: "billing:evt_1:receipt" maps to
// itself, and NewKey's own escapes gain a "25" ("a%3Ab" becomes "a%253Ab").
//
// An escaped form longer than 200 bytes is shortened to its first 128 bytes,
// '~' and the hex SHA-256 of the key (at most 193 bytes). The digest makes
// a collision as unlikely as a SHA-256 collision, and the effect key stored
// in the object's metadata would catch one anyway ([effects.ErrKeyReused]).
//
// EscapeKey does not validate k; [Writer.Apply] does that first.
func EscapeKey(k effects.Key) string {
	const hexdigits = "0123456789ABCDEF"
	s := string(k)
	b := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keepByte(c) && (c != '.' || i > 0) {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hexdigits[c>>4], hexdigits[c&0xF])
	}
	if len(b) <= maxEscapedKeyLen {
		return string(b)
	}
	prefix := b[:hashedKeyPrefixLen]
	// Do not cut an escape sequence in half.
	for i := len(prefix) - 1; i >= len(prefix)-2; i-- {
		if prefix[i] == '%' {
			prefix = prefix[:i]
			break
		}
	}
	sum := sha256.Sum256([]byte(s))
	return string(prefix) + "~" + hex.EncodeToString(sum[:])
}

func keepByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	case c == '-' || c == '_' || c == '.' || c == ':':
		return true
	}
	return false
}

// checkObjectKey reports why name cannot be an S3 object key, or "".
func checkObjectKey(name string) string {
	switch {
	case name == "":
		return "empty"
	case len(name) > maxObjectKeyLen:
		return fmt.Sprintf("%d bytes, longer than S3's %d", len(name), maxObjectKeyLen)
	case !utf8.ValidString(name):
		return "not valid UTF-8"
	}
	for i, r := range name {
		if r < 0x20 || r == 0x7F {
			return fmt.Sprintf("control character %U at byte %d", r, i)
		}
	}
	return ""
}
