package negcache_test

import (
	"fmt"

	"effectively.dev/effects"
	"effectively.dev/negcache"
)

// A Filter answers "certainly not seen" without a round trip; "maybe seen"
// still needs the backend's answer (Precheck asks it).
func ExampleFilter() {
	f, err := negcache.New(10000, 0.01) // 10,000 keys at a 1 % false-positive rate
	if err != nil {
		fmt.Println(err)
		return
	}
	f.Add(effects.MustKey("billing", "evt_1"))
	fmt.Println(f.MaybeSeen(effects.MustKey("billing", "evt_1")))
	fmt.Println(f.Added())
	// Output:
	// true
	// 1
}
