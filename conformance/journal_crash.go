package conformance

import (
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
)

// crashRestart completes a key and leases another, crashes the backend
// and starts it again: the completed key must still be done with its
// reference, the leased one still held.
func (s *jscene) crashRestart() {
	r := s.h.(CrashRestarter)
	a := s.open("A")
	done, held := s.key("crash", "done"), s.key("crash", "held")
	s.mustLease(a, held, holdLease, "a new key")
	s.mustLease(a, done, holdLease, "a new key")
	if err := s.complete(a, done, "ref-crash"); err != nil {
		s.fatalf("Complete: %v", err)
	}
	if err := r.CrashRestart(s.ctx); err != nil {
		s.fatalf("harness CrashRestart: %v", err)
	}
	b := s.open("B")
	s.doneAfterRestart(b, done, "ref-crash", "a completed key after a crash restart")
	s.inFlight(b, held, "a leased key after a crash restart")
}

// doneAfterRestart checks that key is done with ref on b, retrying what
// is retryable for a while: the first calls after a restart may meet
// broken pooled connections.
func (s *jscene) doneAfterRestart(b *jinst, key effects.Key, ref, what string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, err := s.begin(b, key, fp1, holdLease)
		if err == nil || effects.ClassOf(err) != effects.Retryable || time.Now().After(deadline) {
			s.check(err == nil && rec.Done && rec.Ref == ref, "%s: (done %v, ref %q, %v), want done with %s", what, rec.Done, rec.Ref, err, ref)
			return
		}
		_ = retry.Sleep(s.ctx, 100*time.Millisecond)
	}
}
