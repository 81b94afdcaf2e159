package httpkey

import (
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"math"
	"math/big"
	"strings"

	"effectively.dev/effects"
)

// hashMarker separates a shortened wire key's readable prefix from its
// digest. It never occurs in a wire key that was not shortened, because
// the encoding writes every '%' as "%25" and '~' is not a hex digit.
const hashMarker = "%~"

// minKeyLen is the smallest limit [WithMaxKeyLen] accepts: room for the
// marker and 22 characters (132 bits) of digest, so that two keys
// shortened to it still differ.
const minKeyLen = 24

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

// keyFormat is how a key is written on the wire: the default escaped
// form within max bytes, a form over a restricted alphabet, or a UUID.
type keyFormat struct {
	max      int
	alphabet string // "" : the default escaped form
	min      int
	uuid     bool
}

// wire returns key in the format f.
func (f keyFormat) wire(key effects.Key) string {
	switch {
	case f.uuid:
		return uuidKey(key)
	case f.alphabet != "":
		return alphabetKey(key, f.alphabet, f.min, f.max)
	}
	return wireKey(key, f.max)
}

// digestBits is the strength of the digest that keeps shortened keys
// apart: 128 bits, a collision between two keys needing about 2^64 keys.
const digestBits = 128

// emitted returns the symbols of alphabet that a wire key is written
// with: every one but space and tab, which HTTP trims from a header's
// ends, in the alphabet's order, without repeats.
func emitted(alphabet string) string {
	var b strings.Builder
	for i := 0; i < len(alphabet); i++ {
		c := alphabet[i]
		if c == ' ' || c == '\t' || strings.IndexByte(b.String(), c) >= 0 {
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// digestLen is how many symbols of an alphabet of n carry digestBits.
func digestLen(n int) int {
	if n < 2 {
		return 0
	}
	return int(math.Ceil(digestBits / math.Log2(float64(n))))
}

// alphabetKey writes key over alphabet, between min and max bytes: a
// readable prefix (the key's bytes that are in the alphabet, the others
// as the separator) and a digest of the whole key in the alphabet, long
// enough for digestBits and for min. Every key gets a digest, so two keys
// differ on the wire whenever their digests do, whatever their prefixes,
// and a key cannot be crafted to equal another's wire form.
func alphabetKey(key effects.Key, alphabet string, min, max int) string {
	syms := emitted(alphabet)
	d := digestLen(len(syms))
	sep := byte(0)
	for _, c := range []byte("-_.~:") {
		if strings.IndexByte(syms, c) >= 0 {
			sep = c
			break
		}
	}
	room := max - d
	if sep != 0 {
		room-- // the separator before the digest
	}
	var prefix []byte
	for i := 0; i < len(key) && len(prefix) < room; i++ {
		c := key[i]
		switch {
		case strings.IndexByte(syms, c) >= 0:
			prefix = append(prefix, c)
		case sep != 0 && (len(prefix) == 0 || prefix[len(prefix)-1] != sep):
			prefix = append(prefix, sep)
		}
	}
	if len(prefix) > 0 && sep != 0 && prefix[len(prefix)-1] != sep {
		prefix = append(prefix, sep)
	}
	n := d
	if len(prefix)+n < min {
		n = min - len(prefix)
	}
	return string(prefix) + digestIn(key, syms, n)
}

// digestIn writes the SHA-512 of key as n symbols of syms (the digest as
// a number in base len(syms)); n must carry at most 512 bits.
func digestIn(key effects.Key, syms string, n int) string {
	sum := sha512.Sum512([]byte(key))
	v := new(big.Int).SetBytes(sum[:])
	base := big.NewInt(int64(len(syms)))
	out := make([]byte, n)
	mod := new(big.Int)
	for i := range out {
		v.DivMod(v, base, mod)
		out[i] = syms[mod.Int64()]
	}
	return string(out)
}

// keyNamespace is the namespace of the UUIDv5 keys ([WithKeyUUID]).
var keyNamespace = [16]byte{0x6b, 0x1f, 0x0e, 0x2c, 0x8a, 0x53, 0x4d, 0x19, 0x9c, 0x3e, 0x5a, 0x77, 0x2d, 0x41, 0xe0, 0x88}

// uuidKey returns the RFC 9562 version 5 UUID of key in keyNamespace.
func uuidKey(key effects.Key) string {
	h := sha1.New()
	h.Write(keyNamespace[:])
	h.Write([]byte(key))
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x50 // version 5
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	const hexdigits = "0123456789abcdef"
	out := make([]byte, 0, 36)
	for i, b := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hexdigits[b>>4], hexdigits[b&0xf])
	}
	return string(out)
}
