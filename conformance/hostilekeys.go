package conformance

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strings"

	"effectively.dev/effects"
)

// Classes of hostile key pairs: two valid keys that differ, which a key
// store that normalises, strips, folds, matches patterns, decodes or
// truncates would take for one.
const (
	hostileInvisible     = "invisible"     // an invisible or non-printing rune, and nothing
	hostileNormalization = "normalization" // Unicode compatibility, canonical order and case variants
	hostileWildcard      = "wildcard"      // SQL LIKE, glob and regular expression wildcards, and the literal they match
	hostilePath          = "path"          // path separators, dot segments and percent-escapes
	hostileLength        = "length"        // keys near every length limit and hashing threshold
)

// hostileClasses lists the classes, in the order the pairs are made.
var hostileClasses = []string{hostileInvisible, hostileNormalization, hostileWildcard, hostilePath, hostileLength}

// hostilePair is two distinct valid keys of one class, and why a store
// might merge them.
type hostilePair struct {
	class string
	why   string
	a, b  effects.Key
}

// invisibleRunes are runes that show as nothing (format characters,
// joiners, a variation selector, a soft hyphen) and that some stores strip.
var invisibleRunes = []struct {
	r    rune
	name string
}{
	{'\u200b', "zero-width space"},
	{'\u200c', "zero-width non-joiner"},
	{'\u200d', "zero-width joiner"},
	{'\u2060', "word joiner"},
	{'\ufeff', "byte-order mark"},
	{'\u00ad', "soft hyphen"},
	{'\u034f', "combining grapheme joiner"},
	{'\ufe0f', "variation selector 16"},
	{'\u180e', "Mongolian vowel separator"},
	{'\u2062', "invisible times"},
}

// variants are pairs of strings that a normalisation, a case fold or a
// collation merges.
var variants = []struct{ a, b, why string }{
	{"\uff21\uff22", "AB", "fullwidth letters, and ASCII (NFKC, width folding)"},
	{"\ufb01le", "file", "a ligature, and its letters (NFKC)"},
	{"x\u00b2", "x2", "a superscript digit, and the digit (NFKC)"},
	{"\u212a", "K", "the Kelvin sign, and K (NFC, case folding)"},
	{"\u212b", "\u00c5", "the Angstrom sign, and \u00c5 (NFC)"},
	{"stra\u00dfe", "strasse", "sharp s, and ss (full case folding, collations)"},
	{"\u017fun", "sun", "long s, and s (simple case folding)"},
	{"\u0131d", "id", "dotless i, and i (Turkish case mapping)"},
	{"\u03c2", "\u03c3", "final sigma, and sigma (case folding)"},
	{"a\u0323\u0307", "a\u0307\u0323", "combining marks in two orders (canonical ordering)"},
	{"\u00e9", "e", "an accent, and none (accent-insensitive collations)"},
	{"\u2126", "\u03a9", "the Ohm sign, and omega (NFC)"},
	{"\u0661\u0662", "12", "Arabic-Indic digits, and ASCII digits (numeric folding)"},
	{"ABC-9", "abc-9", "letter case (ASCII)"},
}

// wildcards are a pattern and a literal it matches under LIKE, a glob or a
// regular expression.
var wildcards = []struct{ a, b, why string }{
	{"a_c", "abc", "LIKE's _, and the letter it matches"},
	{"a%c", "abbc", "LIKE's %, and what it matches"},
	{"a%", "a", "LIKE's trailing %, and nothing"},
	{"a*c", "abc", "a glob's *, and what it matches"},
	{"a?c", "abc", "a glob's ?, and the letter it matches"},
	{"a[b]c", "abc", "a glob's class, and the letter it matches"},
	{"a.c", "abc", "a regular expression's dot, and a letter"},
	{"a.*", "abc", "a regular expression's .*, and what it matches"},
	{"a\\_c", "a_c", "an escaped LIKE wildcard, and the wildcard"},
	{"{a,b}", "a", "a brace expansion, and one of its words"},
}

// paths are keys a path, a URL or a decoder merges.
var paths = []struct{ a, b, why string }{
	{"a\\b", "a/b", "a backslash, and a slash"},
	{"a//b", "a/b", "a doubled slash, and one"},
	{"a/b/", "a/b", "a trailing slash, and none"},
	{"a/./b", "a/b", "a dot segment, and none"},
	{"%2e%2e/x", "../x", "percent-escaped dots, and dots"},
	{"a%2fb", "a%2Fb", "a percent-escape in lower and upper case hex"},
	{"a%252Fb", "a%2Fb", "a doubly escaped slash, and its single escape"},
	{"a;v=1", "a", "a path parameter, and nothing"},
	{"a%20b", "a b", "an escaped space, and a space"},
	{"a&b=c", "a", "a query separator, and nothing after it"},
	{"a:b", "a%3Ab", "a colon, and its percent-escape"},
	{"a~b", "a%7Eb", "a tilde, and its percent-escape"},
}

// lengthThresholds are lengths at which stores truncate keys or start to
// hash them: column widths, index limits, hash block sizes.
var lengthThresholds = []int{32, 36, 40, 44, 48, 50, 60, 63, 64, 65, 100, 127, 128, 129, 150, 191, 200, 240, 250, 254, effects.MaxKeyLen}

// hostilePairs generates the pairs of every class under base (a prefix
// unique to the scenario run), count random ones per class besides the
// fixed ones, reproducibly from seed. Every key is valid, every pair
// distinct.
func hostilePairs(base string, seed uint64, count int) []hostilePair {
	rng := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	word := func() string {
		const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
		b := make([]byte, 3+rng.IntN(6))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	var out []hostilePair
	add := func(class, why, a, b string) {
		out = append(out, hostilePair{class, why, effects.Key(base + a), effects.Key(base + b)})
	}
	// Invisible runes, inside and at the end of a key, and nothing.
	for i, r := range invisibleRunes {
		w := word()
		add(hostileInvisible, r.name+" inside the key, and nothing", w+string(r.r)+"x", w+"x")
		if i < count {
			w := word()
			at := rng.IntN(len(w) + 1)
			add(hostileInvisible, r.name+" at a random place, and nothing", w[:at]+string(r.r)+w[at:]+"z", w+"z")
		}
	}
	for _, v := range variants {
		w := word()
		add(hostileNormalization, v.why, w+v.a, w+v.b)
	}
	for _, v := range wildcards {
		w := word()
		add(hostileWildcard, v.why, w+v.a, w+v.b)
	}
	for _, v := range paths {
		w := word()
		add(hostilePath, v.why, w+v.a, w+v.b)
	}
	// Keys of each threshold length that differ only in the last byte,
	// only at the threshold (one byte longer), and, past it, keys whose
	// CRC-32 collides: a store that hashes long keys with a short hash.
	pad := func(n int) string { return (base + strings.Repeat("x", effects.MaxKeyLen))[:n] }
	for _, l := range lengthThresholds {
		if l <= len(base)+2 {
			continue
		}
		p := pad(l - 1)
		out = append(out, hostilePair{hostileLength, fmt.Sprintf("%d bytes, only the last byte differs", l), effects.Key(p + "a"), effects.Key(p + "b")})
		if l < effects.MaxKeyLen {
			out = append(out, hostilePair{hostileLength, fmt.Sprintf("%d and %d bytes, one a prefix of the other", l, l+1), effects.Key(p + "c"), effects.Key(p + "cd")})
		}
	}
	for _, l := range []int{64, 128, 200, effects.MaxKeyLen} {
		prefix := pad(l - collisionWidth)
		crc := crc32.ChecksumIEEE([]byte(prefix))
		if a, b, ok := collision(func(x []byte) uint32 { return crc32.Update(crc, crc32.IEEETable, x) }); ok {
			out = append(out, hostilePair{hostileLength, fmt.Sprintf("%d bytes, the same CRC-32", l), effects.Key(prefix + a), effects.Key(prefix + b)})
		}
	}
	return out
}

// hostilePairsBothOrders returns the pairs of hostilePairs twice: under
// base+"1:" as made, and under base+"2:" in the other order. A store that
// merges a pattern with the literal it matches may do so only when the
// pattern comes second.
func hostilePairsBothOrders(base string, seed uint64, count int) []hostilePair {
	out := hostilePairs(base+"1:", seed, count)
	for _, p := range hostilePairs(base+"2:", seed, count) {
		out = append(out, hostilePair{p.class, p.why + " (the other order)", p.b, p.a})
	}
	return out
}
