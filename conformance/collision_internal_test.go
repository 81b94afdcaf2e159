package conformance

import (
	"hash/crc32"
	"hash/fnv"
	"strings"
	"testing"
)

// TestDistinctPairsCollide: the hash pairs of distinct-keys do collide
// under the hashes they are named for, computed by the standard library.
func TestDistinctPairsCollide(t *testing.T) {
	sums := map[string]func(string) uint32{
		"CRC-32":  func(s string) uint32 { return crc32.ChecksumIEEE([]byte(s)) },
		"FNV-32a": func(s string) uint32 { f := fnv.New32a(); f.Write([]byte(s)); return f.Sum32() },
		"FNV-32":  func(s string) uint32 { f := fnv.New32(); f.Write([]byte(s)); return f.Sum32() },
	}
	found := 0
	for _, p := range distinctPairs("conformance:0123456789ab:distinct:") {
		for name, sum := range sums {
			if p.why == "the same "+name+" of the key" {
				found++
				if p.a == p.b || sum(string(p.a)) != sum(string(p.b)) {
					t.Errorf("%s: %q and %q do not collide", p.why, p.a, p.b)
				}
			}
		}
		if strings.HasPrefix(p.why, "the same") && !strings.HasPrefix(string(p.a), "conformance:0123456789ab:distinct:") {
			t.Errorf("%s: %q lost the scenario's prefix", p.why, p.a)
		}
	}
	if found != len(sums) {
		t.Errorf("%d hash pairs, want %d", found, len(sums))
	}
}
