package conformance

import (
	"context"
	"time"

	"effectively.dev/effects/journal"
)

// ClockSkewer is implemented by a journal harness that can open an
// instance whose clock runs skew ahead of the other instances' (a
// journal built with a clock option, a process on a host whose clock is
// off). The clock-skew scenario runs only when it is implemented; without
// it the journal's leases are not verified, and [RunJournal] fails unless
// [AllowUnverified] names clock-skew and says why (a journal whose leases
// are judged by one clock whatever each instance's, the database server's
// now(), says so there). A harness whose journal reads no clock of its own
// can implement ClockSkewer by opening an ordinary instance: the scenario
// then checks that claim against the journal.
type ClockSkewer interface {
	// OpenSkewed is [JournalHarness.Open] for an instance whose clock
	// reads skew ahead of true time.
	OpenSkewed(ctx context.Context, f *Faults, skew time.Duration) (j journal.Journal, close func(), err error)
}

// clockSkew is how far the skewed instance's clock runs ahead: more than
// the lease the scenario holds, as a host whose clock jumped would.
const clockSkew = 2 * holdLease

// clockSkewScenario: instance A, whose clock is true, holds a lease of
// holdLease; instance B, whose clock runs clockSkew ahead (past the
// lease's end), must not take it over. A lease B takes for the short
// lease must end for A when it expires on the true clock.
func (s *jscene) clockSkew() {
	sk := s.h.(ClockSkewer) // the table runs it only then
	a := s.open("A")
	b := s.openBy("B (clock "+clockSkew.String()+" ahead)", func(ctx context.Context, f *Faults) (journal.Journal, func(), error) {
		return sk.OpenSkewed(ctx, f, clockSkew)
	})
	key := s.key("skew")
	s.mustLease(a, key, holdLease, "a new key")
	s.inFlight(b, key, "a Begin on an instance whose clock runs past the lease's end")
	short := s.key("skew", "short")
	s.mustLease(b, short, s.cfg.lease, "a new key on the instance ahead")
	s.expire()
	rec := s.mustLease(a, short, holdLease, "a Begin on an instance with a true clock after a lease the instance ahead took expired")
	s.check(rec.Attempt > 1, "takeover after expiry: Attempt %d, want more than 1", rec.Attempt)
	s.notef("instance B's clock ran %v ahead", clockSkew)
}
