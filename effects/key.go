package effects

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxKeyLen is the longest key in bytes. It is Stripe's limit for an
// Idempotency-Key, the tightest of the backends; [NewKey] hashes longer
// input down to a stable form below it.
const MaxKeyLen = 255

// hashedPrefixLen is how many bytes of the readable form a hashed key keeps
// before its digest, so operators can still tell keys apart in logs.
const hashedPrefixLen = 160

// hashMarker separates a hashed key's readable prefix from its digest. It can
// never occur in an unhashed key built by NewKey, because NewKey escapes every
// '%' as "%25"; so a hashed key never equals an unhashed one.
const hashMarker = "%~"

// A Key is an idempotency key: the identity of one side effect. The same
// message processed by the same step must always produce the same key, on
// every delivery and every attempt, so build it with [NewKey] from the
// message's own identity, never from a random value, a clock or an attempt
// counter.
//
// A Key is a string so that keys received from elsewhere (a webhook's event
// id, a client's Idempotency-Key header) can be used directly; adapters call
// [Key.Validate] before any I/O and refuse invalid keys with [ErrInvalidKey].
type Key string

// NewKey builds a key from its parts, typically a scope (the application or
// tenant), the message's id, and the step's name:
//
//	key, err := effects.NewKey("billing", event.ID, "ledger")
//
// The joining is unambiguous: parts are joined with ':' after escaping ':',
// '%', control bytes and invalid UTF-8 as %XX (and white space at either end
// of the key, which some clients trim), so ("a:b", "c") and
// ("a", "b:c") give different keys, and any byte string can be a part.
// The result is deterministic across processes and versions. If the joined
// form is longer than [MaxKeyLen] bytes, it is replaced by its first bytes,
// the marker "%~" and the hex SHA-256 of the whole joined form: stable, at
// most 226 bytes, and distinct from every unhashed key.
//
// NewKey returns an error wrapping [ErrInvalidKey] when there are no parts
// or a part is empty: an empty message id is a bug upstream, and keying on it
// would merge unrelated messages.
//
// NewKey keeps apart parts that differ in any byte, but it cannot see bytes
// a decoder replaced before it: encoding/json turns invalid UTF-8 and lone
// surrogate escapes into U+FFFD, so two ids that differ only there arrive
// equal and would share every key. Check ids decoded from a text format
// with [CheckID] before keying on them.
func NewKey(parts ...string) (Key, error) {
	if len(parts) == 0 {
		return "", &Error{Kind: ErrInvalidKey, Op: "NewKey", Err: fmt.Errorf("no parts")}
	}
	var b strings.Builder
	for i, p := range parts {
		if p == "" {
			return "", &Error{Kind: ErrInvalidKey, Op: "NewKey", Err: fmt.Errorf("part %d is empty", i)}
		}
		if i > 0 {
			b.WriteByte(':')
		}
		escapePart(&b, p)
	}
	joined := escapeEdgeSpace(b.String())
	if len(joined) <= MaxKeyLen {
		return Key(joined), nil
	}
	sum := sha256.Sum256([]byte(joined))
	prefix := joined[:hashedPrefixLen]
	// Do not cut an escape sequence or a multi-byte rune in half.
	for i := len(prefix) - 1; i >= len(prefix)-2 && i >= 0; i-- {
		if prefix[i] == '%' {
			prefix = prefix[:i]
			break
		}
	}
	for len(prefix) > 0 && !utf8.ValidString(prefix) {
		prefix = prefix[:len(prefix)-1]
	}
	return Key(prefix + hashMarker + hex.EncodeToString(sum[:])), nil
}

// CheckID returns nil if id, a message id decoded from a text format such
// as JSON, can identify a message, and otherwise an error wrapping
// [ErrPoison] (a [effectively.dev/effects/consume.Consumer] dead-letters the delivery at once): id is
// empty, is not valid UTF-8, or holds U+FFFD, the replacement character
// that encoding/json substitutes for invalid UTF-8 and for lone surrogate
// escapes (`"\ud800"`). Two events whose ids differed only in such bytes
// decode to the same string; keyed on it, the second would be acked as a
// replay of the first (or refused with [ErrKeyReused]). An id that really
// contains U+FFFD is refused too: it cannot be told apart from a damaged
// one. Ids taken as raw bytes (a Kafka header) need no check beyond being
// non-empty: [NewKey] escapes invalid UTF-8 and keeps them apart.
func CheckID(id string) error {
	var why string
	switch {
	case id == "":
		why = "empty"
	case !utf8.ValidString(id):
		why = "not valid UTF-8"
	case strings.ContainsRune(id, utf8.RuneError):
		why = "holds U+FFFD, which a decoder substitutes for invalid UTF-8 (ids that differed there would merge)"
	default:
		return nil
	}
	return fmt.Errorf("%w: message id %q: %s", ErrPoison, id, why)
}

// MustKey is like [NewKey] but panics on error. Use it for keys built from
// constants, in tests and examples.
func MustKey(parts ...string) Key {
	k, err := NewKey(parts...)
	if err != nil {
		panic(err)
	}
	return k
}

// escapePart appends p to b with ':', '%', control bytes and bytes that are
// not valid UTF-8 replaced by %XX (upper-case hex).
func escapePart(b *strings.Builder, p string) {
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRuneInString(p[i:])
		if (r == utf8.RuneError && size == 1) || r == ':' || r == '%' || isControl(r) {
			hexBytes(b, p[i:i+size])
		} else {
			b.WriteString(p[i : i+size])
		}
		i += size
	}
}

// escapeEdgeSpace escapes leading and trailing white space as %XX: some
// clients trim it from keys (stripe-go does), which would merge " k" and
// "k". Escaping stays injective because every '%' in a part was escaped.
func escapeEdgeSpace(s string) string {
	trimmed := strings.TrimLeftFunc(s, unicode.IsSpace)
	lead := s[:len(s)-len(trimmed)]
	core := strings.TrimRightFunc(trimmed, unicode.IsSpace)
	trail := trimmed[len(core):]
	if lead == "" && trail == "" {
		return s
	}
	var b strings.Builder
	hexBytes(&b, lead)
	b.WriteString(core)
	hexBytes(&b, trail)
	return b.String()
}

func hexBytes(b *strings.Builder, s string) {
	const hexdigits = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		b.WriteByte('%')
		b.WriteByte(hexdigits[s[i]>>4])
		b.WriteByte(hexdigits[s[i]&0xF])
	}
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7F || (r >= 0x80 && r < 0xA0) }

// Validate reports whether k can be used as an idempotency key by every
// adapter: non-empty, at most [MaxKeyLen] bytes, valid UTF-8, free of
// control characters (C0, DEL and C1), and without leading or trailing white
// space (which some clients trim, merging distinct keys). It returns nil or an *[Error] whose
// Kind is [ErrInvalidKey] and which says what is wrong. Adapters call it
// before any I/O, so an invalid key never leaves anything half-done.
func (k Key) Validate() error {
	var why string
	switch {
	case k == "":
		why = "empty"
	case len(k) > MaxKeyLen:
		why = fmt.Sprintf("%d bytes, longer than %d (build keys with NewKey, which hashes long input)", len(k), MaxKeyLen)
	case !utf8.ValidString(string(k)):
		why = "not valid UTF-8"
	case strings.TrimFunc(string(k), unicode.IsSpace) != string(k):
		why = "leading or trailing white space"
	default:
		for i, r := range string(k) {
			if isControl(r) {
				why = fmt.Sprintf("control character %U at byte %d", r, i)
				break
			}
		}
	}
	if why == "" {
		return nil
	}
	return &Error{Kind: ErrInvalidKey, Op: "Validate", Key: k, Err: fmt.Errorf("%s", why)}
}

// String returns the key itself.
func (k Key) String() string { return string(k) }
