package conformance

import (
	"context"
	"fmt"

	"effectively.dev/effects"
)

// CrashRestarter is implemented by a harness (effect, journal) that can
// crash its backend and start it again: stop it at once, with no clean
// shutdown (PostgreSQL's immediate mode: no checkpoint, crash recovery on
// the next start; a server process killed; a store in process memory
// keeping only what it had made durable), then start it over the same data
// on the same address. What a crash loses and a clean restart keeps shows:
// an UNLOGGED dedup table, a commit acknowledged before it was durable
// (synchronous_commit=off), records held in memory. The crash-restart
// scenarios run only when it is implemented; without it they are not run
// and the fields they verify are not verified.
type CrashRestarter interface {
	CrashRestart(ctx context.Context) error
}

// crashKeys is how many keys the effect suite applies before the crash.
const crashKeys = 4

// crashRestart applies keys, crashes the backend and starts it again,
// counts every key's effects before any redelivery (an Apply that
// returned success must not lose its effect), then redelivers each on a
// new instance: it must replay, adding nothing.
func (s *scene[In]) crashRestart() {
	r := s.h.(CrashRestarter)
	inst := s.open(new(Faults))
	keys := make([]effects.Key, crashKeys)
	firsts := make([]effects.Result, crashKeys)
	for i := range keys {
		keys[i] = s.key("crash", fmt.Sprint(i))
		firsts[i] = s.applyFirst(inst, keys[i], "an Apply before the crash")
	}
	inst.Close()
	if err := r.CrashRestart(s.ctx); err != nil {
		s.fatalf("harness CrashRestart: %v", err)
	}
	for _, k := range keys {
		n := s.count(k, "after the crash, before any redelivery")
		s.check(n >= 1, "after the crash, before any redelivery: key %s shows %d effects: an Apply that returned success lost its effect in the crash", shortKey(k), n)
	}
	next := s.open(new(Faults))
	for i, k := range keys {
		s.redeliverOn(next, k, firsts[i], "a redelivery after a crash restart")
		s.expect(k, cleanRepeat, true, "after a crash restart and a redelivery")
	}
	s.notef("%d keys applied, the backend crashed and restarted, counted, then redelivered", crashKeys)
}
