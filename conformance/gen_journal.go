package conformance

import (
	"errors"
	"fmt"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
)

// journalOps are the calls whose round trips round-trip-faults arms.
var journalOps = []string{"Begin", "Complete", "Release", "Lookup"}

// journalTripFaults counts the round trips of each call of a journal
// (Begin, Complete, Release, and Lookup for a [journal.DoneJournal]),
// then faults each with a lost reply, a cut request and a cancellation,
// and holds what the call returned to the protocol, checked from another
// instance: a Complete that returned no error left the key done with its
// reference; a Release that returned no error freed the lease; a Begin
// that granted a lease holds it against others, and the next attempt's
// number is higher; a Lookup that returned no error tells the truth.
func (s *jscene) journalTripFaults() {
	fired := 0
	for _, op := range journalOps {
		a := s.open("counting")
		if _, ok := a.j.(journal.DoneJournal); op == "Lookup" && !ok {
			continue
		}
		trips := s.opTrips(a, op)
		a.Close()
		if trips == 0 {
			continue
		}
		trips = min(trips, s.cfg.maxSweep)
		for _, kind := range []FaultKind{DropReply, CutRequest, CancelAfterSend} {
			for n := 1; n <= trips; n++ {
				s.sub(fmt.Sprintf("%s-%s-trip-%02d", op, kind.slug(), n), func(c *checker) {
					js := &jscene{checker: c, h: s.h}
					if js.faultOp(op, kind, n) {
						fired++
					}
				})
			}
		}
	}
	if fired == 0 {
		s.skip("no fault fired: the journal makes no round trip through the harness's Faults (open its connections through f, or run each call of an in-process backend through f.RoundTrip)")
	}
	s.notef("%d faults fired on the round trips of Begin, Complete, Release and Lookup", fired)
}

// opTrips counts the round trips of one clean call of op on i.
func (s *jscene) opTrips(i *jinst, op string) int {
	key := s.key("trips", op)
	var before int
	switch op {
	case "Begin":
		before = i.f.RoundTrips()
		s.mustLease(i, key, holdLease, "counting Begin's round trips")
	case "Complete":
		s.mustLease(i, key, holdLease, "counting Complete's round trips")
		before = i.f.RoundTrips()
		if err := s.complete(i, key, "ref"); err != nil {
			s.fatalf("a clean Complete: %v", err)
		}
	case "Release":
		rec := s.mustLease(i, key, holdLease, "counting Release's round trips")
		before = i.f.RoundTrips()
		if err := s.release(i, key, rec.Attempt); err != nil {
			s.fatalf("a clean Release: %v", err)
		}
	case "Lookup":
		before = i.f.RoundTrips()
		if _, err := s.lookup(i, key, fp1); err != nil {
			s.fatalf("a clean Lookup: %v", err)
		}
	}
	return i.f.RoundTrips() - before
}

// faultOp runs op on a new key with kind at its round trip n, on
// instance A, and checks the outcome from instance B. It reports whether
// the fault fired.
func (s *jscene) faultOp(op string, kind FaultKind, n int) bool {
	a, b := s.open("A"), s.open("B")
	key := s.key("faulted", op, kind.slug(), fmt.Sprint(n))
	what := fmt.Sprintf("%s at round trip %d of %s", kind, n, op)
	var rec journal.Record
	if op != "Begin" && op != "Lookup" {
		rec = s.mustLease(a, key, s.cfg.lease, what+": the lease first")
	}
	if op == "Lookup" {
		s.mustLease(a, key, holdLease, what+": the lease first")
		if err := s.complete(a, key, "ref-lookup"); err != nil {
			s.fatalf("%s: Complete: %v", what, err)
		}
	}
	// A cancellation is the instance's process dying once the request
	// was sent: every connection cut.
	a.f.Arm(a.f.RoundTrips()+n, kind, a.f.Sever)
	var err error
	switch op {
	case "Begin":
		var got journal.Record
		got, err = s.begin(a, key, fp1, s.cfg.lease)
		fired := a.f.Fired()
		a.f.Disarm()
		if err == nil {
			s.check(!got.Done, "%s: Begin of a new key returned it done", what)
			s.inFlightUntil(b, key, time.Now().Add(s.cfg.lease), what+": another instance while the granted lease runs")
		}
		s.expire()
		next := s.mustLease(b, key, holdLease, what+": another instance once the lease expired")
		if err == nil {
			s.check(next.Attempt > got.Attempt, "%s: the next attempt is numbered %d after attempt %d", what, next.Attempt, got.Attempt)
		}
		return fired
	case "Complete":
		err = s.complete(a, key, "ref-1")
	case "Release":
		err = s.release(a, key, rec.Attempt)
	case "Lookup":
		var got journal.Record
		got, err = s.lookup(a, key, fp1)
		if err == nil {
			s.check(got.Done && got.Ref == "ref-lookup", "%s: Lookup returned (done %v, ref %q) with no error, want done with %q", what, got.Done, got.Ref, "ref-lookup")
		}
	}
	fired := a.f.Fired()
	a.f.Disarm()
	switch {
	case op == "Complete" && err == nil:
		s.doneWith(b, key, "ref-1", what+": Complete returned no error, so another instance must find the key done")
	case op == "Complete":
		s.check(effects.ClassOf(err) == effects.Retryable || errors.Is(err, effects.ErrInFlight), "%s: Complete returned %v, which is not retryable (effects.ClassOf)", what, err)
		s.expire()
		// Retried, from another instance once the lease is gone, the key
		// is either done with the first ref or begun again.
		got, berr := s.begin(b, key, fp1, holdLease)
		if berr == nil && got.Done {
			s.check(got.Ref == "ref-1", "%s: done with ref %q, want %q", what, got.Ref, "ref-1")
		} else if berr == nil {
			s.check(got.Attempt > rec.Attempt, "%s: the next attempt is numbered %d after attempt %d", what, got.Attempt, rec.Attempt)
		}
	case op == "Release" && err == nil:
		got, berr := s.begin(b, key, fp1, holdLease)
		if s.check(berr == nil, "%s: Release returned no error, yet another instance's Begin got %v, want the lease at once", what, berr) {
			s.check(!got.Done && got.Attempt > rec.Attempt, "%s: after the Release, Begin returned (done %v, attempt %d), want attempt > %d", what, got.Done, got.Attempt, rec.Attempt)
		}
	}
	return fired
}

// attemptNumbers checks the attempt number of every Begin, the same
// instance re-taking its own lease included: once it expired, and once
// it was released, and another instance after that.
func (s *jscene) attemptNumbers() {
	a, b := s.open("A"), s.open("B")
	key := s.key("attempts")
	first := s.mustLease(a, key, s.cfg.lease, "a new key")
	s.check(first.Attempt >= 1, "a new key's first attempt is numbered %d, want at least 1", first.Attempt)
	s.expire()
	second := s.mustLease(a, key, s.cfg.lease, "the same instance re-taking its own expired lease")
	s.check(second.Attempt > first.Attempt, "the same instance re-took its own expired lease as attempt %d after attempt %d: a re-take is a new attempt", second.Attempt, first.Attempt)
	if err := s.release(a, key, second.Attempt); err != nil {
		s.fatalf("Release(%d): %v", second.Attempt, err)
	}
	third := s.mustLease(a, key, s.cfg.lease, "the same instance re-taking the lease it released")
	s.check(third.Attempt > second.Attempt, "the same instance re-took the lease it released as attempt %d after attempt %d", third.Attempt, second.Attempt)
	s.expire()
	fourth := s.mustLease(b, key, holdLease, "another instance once the lease expired")
	s.check(fourth.Attempt > third.Attempt, "another instance took the key as attempt %d after attempt %d", fourth.Attempt, third.Attempt)
	// A Release of an old attempt frees nothing.
	if err := s.release(a, key, third.Attempt); err == nil {
		s.inFlight(a, key, "after a Release of an earlier attempt")
	}
}
