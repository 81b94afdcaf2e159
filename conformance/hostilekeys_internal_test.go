package conformance

import (
	"hash/crc32"
	"strings"
	"testing"

	"effectively.dev/effects"
)

// TestHostilePairs: every generated key is valid, the two keys of a pair
// differ, every class has pairs, the same seed makes the same pairs, each
// pair comes in both orders, and the CRC-32 pairs collide.
func TestHostilePairs(t *testing.T) {
	base := "conformance:0123456789ab:hostile:"
	pairs := hostilePairsBothOrders(base, 7, 3)
	classes := map[string]int{}
	seen := map[effects.Key]bool{}
	for _, p := range pairs {
		classes[p.class]++
		for _, k := range []effects.Key{p.a, p.b} {
			if err := k.Validate(); err != nil {
				t.Errorf("%s: key %q invalid: %v", p.why, k, err)
			}
			if !strings.HasPrefix(string(k), base) {
				t.Errorf("%s: key %q lost the base", p.why, k)
			}
		}
		if p.a == p.b {
			t.Errorf("%s: both keys are %q", p.why, p.a)
		}
		for _, k := range []effects.Key{p.a, p.b} {
			if seen[k] {
				t.Errorf("%s: key %q is in two pairs", p.why, k)
			}
		}
		seen[p.a], seen[p.b] = true, true
		if strings.Contains(p.why, "CRC-32") && crc32.ChecksumIEEE([]byte(p.a)) != crc32.ChecksumIEEE([]byte(p.b)) {
			t.Errorf("%s: %q and %q do not collide", p.why, p.a, p.b)
		}
	}
	for _, c := range hostileClasses {
		if classes[c] < 8 {
			t.Errorf("class %s: %d pairs, want at least 8", c, classes[c])
		}
	}
	again := hostilePairsBothOrders(base, 7, 3)
	if len(again) != len(pairs) {
		t.Fatalf("seed 7 made %d pairs, then %d", len(pairs), len(again))
	}
	for i := range pairs {
		if pairs[i] != again[i] {
			t.Errorf("pair %d differs between two runs of one seed: %v, %v", i, pairs[i], again[i])
		}
	}
	half := len(pairs) / 2
	if pairs[0].a[len(base):] != pairs[half].b[len(base):] && strings.TrimPrefix(string(pairs[0].a), base+"1:") != strings.TrimPrefix(string(pairs[half].b), base+"2:") {
		t.Errorf("the second half is not the first in the other order: %q vs %q", pairs[0].a, pairs[half].b)
	}
	other := hostilePairsBothOrders(base, 8, 3)
	same := 0
	for i := range other {
		if i < len(pairs) && other[i] == pairs[i] {
			same++
		}
	}
	if same == len(pairs) {
		t.Errorf("seeds 7 and 8 made the same pairs")
	}
}
