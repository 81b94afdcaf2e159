package postgres

import (
	"slices"
	"testing"
	"time"

	"effectively.dev/effects"
)

func TestLostLeases(t *testing.T) {
	var l lostLeases
	key := effects.Key("k")
	if got := l.tokens(key); got != nil {
		t.Fatalf("tokens of an empty set = %v, want none", got)
	}
	now := time.Now()
	l.remember(key, "a", now, time.Minute)
	l.remember(key, "b", now, time.Minute)
	l.remember(key, "gone", now.Add(-time.Hour), time.Minute) // its lease ended
	if got := l.tokens(key); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("tokens = %v, want [a b] (the ended lease dropped)", got)
	}
	l.remember(key, "c", now, time.Minute)
	l.forget(key, []string{"a", "b"}) // a Begin named a and b; c was lost since
	if got := l.tokens(key); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("tokens after forgetting a and b = %v, want [c]", got)
	}
	l.forget(key, []string{"c"})
	if len(l.m) != 0 {
		t.Fatalf("a key with no lost leases left stays in the map: %v", l.m)
	}
	for i := range maxLostLeasesPerKey + 3 {
		l.remember(key, string(rune('a'+i)), now, time.Minute)
	}
	if got := l.tokens(key); len(got) != maxLostLeasesPerKey || got[len(got)-1] != string(rune('a'+maxLostLeasesPerKey+2)) {
		t.Fatalf("tokens after %d leases of one key = %v, want the last %d", maxLostLeasesPerKey+3, got, maxLostLeasesPerKey)
	}
	var full lostLeases
	for i := range maxLostLeases {
		full.remember(effects.Key(string(rune(0x1000+i))), "t", now, time.Minute)
	}
	full.remember("one more", "t", now, time.Minute)
	if full.tokens("one more") != nil || len(full.m) != maxLostLeases {
		t.Fatalf("a full set remembered one more key (%d keys)", len(full.m))
	}
	full.remember("late", "t", now.Add(-time.Hour), time.Minute) // sweeps nothing: every other lease is live
	for i := range maxLostLeases {
		full.m[effects.Key(string(rune(0x1000+i)))][0].until = now.Add(-time.Second)
	}
	full.remember("after the sweep", "t", now, time.Minute)
	if got := full.tokens("after the sweep"); !slices.Equal(got, []string{"t"}) || len(full.m) != 1 {
		t.Fatalf("after the ended leases were swept: tokens %v, %d keys; want [t], 1 key", got, len(full.m))
	}
}
