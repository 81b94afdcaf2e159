package conformance

import (
	"errors"
	"fmt"

	"effectively.dev/effects"
)

// WithCapacity sets how many other keys the key-capacity scenario applies
// between a key's first Apply and its redelivery (default
// 5,000, at least 1). Make it larger than any cache or
// bounded table the adapter keeps keys in: a dedup that remembers only
// the newest N keys passes every scenario with fewer keys than N. Below
// 5,000 the scenario runs reduced: the report says so, and the
// fields it verifies are not verified, so [Run] fails unless
// [AllowUnverified] says why a smaller run is enough.
func WithCapacity(n int) EffectOption {
	return opt(func(c *config) {
		if n < 1 {
			c.bad("WithCapacity", "%d: at least 1", n)
		}
		c.capacity = n
	})
}

// keyCapacity applies a key, then cfg.capacity other keys, and redelivers
// the first one on the same instance and on a new one (and, where the
// contract detects key reuse, reuses it with the other payload): what a
// broker does when one message comes back after a backlog. A dedup that
// keeps only the newest keys (an LRU cache, a table capped by a sweep)
// forgets the first key and applies it again.
func (s *scene[In]) keyCapacity() {
	if !s.recordsKeys() {
		s.inapplicable("nothing records keys (the contract allows a duplicate on any redelivery)")
	}
	n := s.cfg.capacity
	if n < defaultCapacity {
		// It runs, and what it checks must hold, but a dedup capped above
		// n keys passes it: the fields it verifies stay unverified.
		s.row.Reduced = fmt.Sprintf("WithCapacity(%d) is below defaultCapacity (%d): a dedup that keeps the newest %d keys passes", n, defaultCapacity, defaultCapacity-1)
		s.row.Fix = fmt.Sprintf("leave WithCapacity out (or give at least %d), or give AllowUnverified the reason a smaller run is enough", defaultCapacity)
	}
	inst := s.open(new(Faults))
	key := s.key("capacity", "first")
	first := s.applyFirst(inst, key, "first Apply")
	fill := make([]effects.Key, n)
	for i := range fill {
		fill[i] = s.key("capacity", fmt.Sprint(i))
	}
	before := s.total("before the other keys")
	applied, err := s.applyAll(inst, fill, fmt.Sprintf("applying %d other keys", n))
	if err != nil {
		s.fatalf("applying %d other keys: %v", n, err)
	}
	grew := s.total("after the other keys") - before
	s.check(applied == n, "%d of %d new keys reported applied, want all", applied, n)
	s.check(grew >= n, "the backend grew by %d effects for %d new keys, want at least %d", grew, n, n)
	s.check(grew <= n || s.contract.Guarantee != effects.EffectivelyOnce, "the backend grew by %d effects for %d new keys, want %d", grew, n, n)
	what := fmt.Sprintf("redelivery after %d other keys", n)
	s.redeliverOn(inst, key, first, what+", on the same instance")
	inst.Close()
	next := s.open(new(Faults))
	s.redeliverOn(next, key, first, what+", on a new instance")
	s.reuseOn(next, key, fmt.Sprintf("the key with another payload after %d other keys", n))
	s.expect(key, cleanRepeat, true, "after the "+what)
	s.notef("%d other keys applied between the first Apply and its redelivery (WithCapacity)", n)
}

// reuseOn applies key with the other payload on inst: where the contract
// detects key reuse it must be refused with ErrKeyReused, and it may never
// fail otherwise. It returns what the Apply returned.
func (s *scene[In]) reuseOn(inst *instance[In], key effects.Key, what string) (effects.Result, error) {
	res, err := s.applyUntilDone(inst, key, s.h.Input(key, 1), what)
	switch {
	case s.contract.DetectsKeyReuse:
		s.check(errors.Is(err, effects.ErrKeyReused), "%s: contract detects key reuse, but it got (%v, %v), want ErrKeyReused", what, res.Status, err)
	case err != nil && !errors.Is(err, effects.ErrKeyReused):
		s.failf("%s: %v", what, err)
	}
	if errors.Is(err, effects.ErrKeyReused) {
		s.check(effects.ClassOf(err) != effects.Retryable, "ErrKeyReused must not be retryable")
	}
	return res, err
}
