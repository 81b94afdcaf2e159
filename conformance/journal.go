package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/retry"
)

// JournalHarness connects the journal suite ([RunJournal]) to one
// [journal.Journal] implementation and its backend. A [Restarter] harness
// also runs the backend-restart scenario.
type JournalHarness interface {
	// Open returns a new instance of the journal over the harness's
	// backend, as a process would build it at start-up, with every
	// connection through f (a journal held in process memory ignores f).
	// Instances of one harness share the backend: what one records, the
	// others read. close releases the instance.
	Open(ctx context.Context, f *Faults) (j journal.Journal, close func(), err error)
}

// holdLease is the lease the journal suite takes when it must not expire
// during a scenario.
const holdLease = time.Minute

func journalTable() []scenario[JournalHarness] {
	type s = jscene
	j := func(name, doc string, needs []capability, verifies, options, proofs []string, fn func(*s)) scenario[JournalHarness] {
		return rec(suiteJournal, name, doc, needs, verifies, options, proofs, jscenario(fn))
	}
	leases, records, durable := list(FieldLeases), list(FieldRecords), list(FieldDurability)
	return []scenario[JournalHarness]{
		j(JournalLease, "Begin takes the lease of a new key; another Begin gets ErrInFlight while it is held",
			nil, leases, nil, list("TwoLeases"), (*s).lease),
		j(JournalLeaseExpiry, "an expired lease is taken over with a higher attempt, the fingerprint still checked",
			nil, leases, nil, list("NoExpiry", "FingerprintOnTakeover", "ShortLease", "AttemptPerLease"), (*s).leaseExpiry),
		j(JournalFencing, "a Release by an attempt whose lease was taken over frees nothing",
			nil, leases, nil, list("UnfencedRelease", "AttemptPerLease"), (*s).fencing),
		j(JournalFirstRef, "Complete keeps the first reference (an empty one too) and refuses a key never begun",
			nil, records, nil, list("LastRefWins", "CompleteCreates", "EmptyRefNotDone"), (*s).firstRef),
		j(JournalKeyReuse, "Begin of a key with another fingerprint: ErrKeyReused",
			nil, records, nil, list("FingerprintOnTakeover"), (*s).keyReuse),
		j(JournalInvalidKeys, "invalid keys refused with ErrInvalidKey",
			nil, records, nil, nil, (*s).invalidKeys),
		j(JournalDistinctKeys, "keys that differ only in case, normalization or after a long prefix are separate records",
			nil, records, nil, nil, (*s).distinctKeys),
		j(JournalConcurrent, "concurrent Begins of a new key and of an expired lease: one lease",
			nil, leases, nil, list("TwoLeases"), (*s).concurrent),
		j(JournalCrashedHolder, "a lease holder that crashed: its key is taken over once the lease expires",
			nil, leases, nil, list("TwoLeases", "NoExpiry"), (*s).crashedHolder),
		j(JournalBackendRestart, "complete a key and lease another, restart the backend cleanly: done stays done, the lease stays held",
			[]capability{capRestarter}, durable, nil, nil, (*s).restart),
		j(JournalCrashRestart, "lease a key and complete another, the Complete the last write, crash the backend and start it again: done stays done, the lease stays held",
			[]capability{capCrashRestarter}, durable, nil, nil, (*s).crashRestart),
		j(JournalLookupMarkDone, "for a journal.DoneJournal: Lookup and MarkDone keep the first reference, refuse key reuse, complete a pending record",
			nil, records, nil, list("LookupIgnoresFingerprint", "MarkDoneNeedsBegin", "EmptyRefNotDone", "ReleaseMarksDone", "LookupLeasedDone"), (*s).lookupMarkDone),
		j(JournalTripFaults, "each round trip of Begin, Complete, Release and Lookup in turn loses its reply, is cut, or is the instance's last: what the call returned holds, seen from another instance",
			nil, list(FieldLeases, FieldRecords), nil, list("SwallowedComplete"), (*s).journalTripFaults),
		j(JournalAttempts, "the attempt number rises on every Begin: the same instance re-taking its own expired or released lease, then another instance",
			nil, leases, nil, list("CachedAttempt"), (*s).attemptNumbers),
		j(JournalClockSkew, "an instance whose clock runs past a live lease's end must not take it over",
			[]capability{capClockSkewer}, leases, nil, list("InstanceClock"), (*s).clockSkew),
	}
}

// RunJournal runs the journal suite against the journal that mk's harness
// opens: a lease and its expiry, fencing by attempt, Complete keeping the
// first reference and refusing a key never begun, key reuse, invalid and distinct keys, concurrent Begins
// (of a new key and of an expired lease), a lease holder that crashed,
// and a backend restart when the harness can do one; for a journal that
// implements [journal.DoneJournal], Lookup and MarkDone (a key marked
// done without Begin, the first reference kept, key reuse refused by both,
// a pending record completed and its lease dropped; "not run" for a
// journal without them), and an instance whose clock runs ahead (for a
// [ClockSkewer] harness).
// Each scenario is a subtest of t; every failed check fails t. The report is returned and,
// with CONFORMANCE_REPORT set, written for the matrix.
// mk returns a fresh harness (a fresh backend, or a fresh scope in a
// shared one) for each scenario, cleaning up with t.Cleanup.
func RunJournal(t *testing.T, name string, mk func(t testing.TB) JournalHarness, opts ...JournalOption) Report {
	t.Helper()
	return runSuite(t, suiteJournal, name, journalTable(), mk, configure("conformance.RunJournal", opts, JournalOption.journalOption))
}

func jscenario(fn func(s *jscene)) func(c *checker, h JournalHarness) {
	return func(c *checker, h JournalHarness) { fn(&jscene{checker: c, h: h}) }
}

// jscene is one journal scenario's run.
type jscene struct {
	*checker
	h JournalHarness
}

// jinst is one journal instance: a process, to the suite.
type jinst struct {
	j     journal.Journal
	f     *Faults
	close func()
	done  bool
	name  string
}

func (i *jinst) Close() {
	if !i.done {
		i.done = true
		i.close()
	}
}

func (s *jscene) open(name string) *jinst { return s.openBy(name, s.h.Open) }

// openBy opens an instance with open (the harness's Open, or a variant).
func (s *jscene) openBy(name string, open func(context.Context, *Faults) (journal.Journal, func(), error)) *jinst {
	f := new(Faults)
	j, closeFn, err := open(s.ctx, f)
	if err != nil {
		s.t.Fatalf("conformance: harness Open: %v", err)
	}
	if j == nil {
		s.t.Fatalf("conformance: harness Open returned a nil journal")
	}
	if closeFn == nil {
		closeFn = func() {}
	}
	i := &jinst{j: j, f: f, close: closeFn, name: name}
	s.t.Cleanup(i.Close)
	return i
}

func (s *jscene) key(parts ...string) effects.Key {
	return effects.MustKey(append([]string{"conformance", s.run}, parts...)...)
}

var fp1, fp2 = []byte("fingerprint-1"), []byte("fingerprint-2")

func (s *jscene) begin(i *jinst, key effects.Key, fp []byte, lease time.Duration) (journal.Record, error) {
	return timed(s.checker, i.f, 0, fmt.Sprintf("Begin(%s) on instance %s", shortKey(key), i.name), func(ctx context.Context) (journal.Record, error) {
		return i.j.Begin(ctx, key, fp, lease)
	})
}

func (s *jscene) lookup(i *jinst, key effects.Key, fp []byte) (journal.Record, error) {
	return timed(s.checker, i.f, 0, fmt.Sprintf("Lookup(%s) on instance %s", shortKey(key), i.name), func(ctx context.Context) (journal.Record, error) {
		return i.j.(journal.DoneJournal).Lookup(ctx, key, fp)
	})
}

func (s *jscene) markDone(i *jinst, key effects.Key, fp []byte, ref string) error {
	_, err := timed(s.checker, i.f, 0, fmt.Sprintf("MarkDone(%s) on instance %s", shortKey(key), i.name), func(ctx context.Context) (struct{}, error) {
		return struct{}{}, i.j.(journal.DoneJournal).MarkDone(ctx, key, fp, ref)
	})
	return err
}

func (s *jscene) complete(i *jinst, key effects.Key, ref string) error {
	_, err := timed(s.checker, i.f, 0, fmt.Sprintf("Complete(%s) on instance %s", shortKey(key), i.name), func(ctx context.Context) (struct{}, error) {
		return struct{}{}, i.j.Complete(ctx, key, ref)
	})
	return err
}

func (s *jscene) release(i *jinst, key effects.Key, attempt int) error {
	_, err := timed(s.checker, i.f, 0, fmt.Sprintf("Release(%s, %d) on instance %s", shortKey(key), attempt, i.name), func(ctx context.Context) (struct{}, error) {
		return struct{}{}, i.j.Release(ctx, key, attempt)
	})
	return err
}

// mustLease begins key and requires the lease.
func (s *jscene) mustLease(i *jinst, key effects.Key, lease time.Duration, what string) journal.Record {
	rec, err := s.begin(i, key, fp1, lease)
	if err != nil {
		s.fatalf("%s: Begin: %v, want the lease", what, err)
	}
	if !s.check(!rec.Done, "%s: Begin returned a done record (ref %q), want the lease", what, rec.Ref) {
		panic(abort{})
	}
	return rec
}

// inFlight requires Begin to refuse key with ErrInFlight.
func (s *jscene) inFlight(i *jinst, key effects.Key, what string) {
	s.inFlightUntil(i, key, time.Time{}, what)
}

// inFlightUntil is inFlight for a lease that ends at until (zero: not
// before the scenario does). A Begin that returns after until proves
// nothing (the lease may have expired meanwhile, on a slow machine) and
// is only noted.
func (s *jscene) inFlightUntil(i *jinst, key effects.Key, until time.Time, what string) {
	rec, err := s.begin(i, key, fp1, holdLease)
	if !until.IsZero() && time.Now().After(until) {
		s.notef("%s: Begin returned after the lease could have expired (%v, %v): not checked", what, rec.Attempt, err)
		return
	}
	if err == nil {
		s.failf("%s: Begin granted attempt %d (done %v) while another attempt holds the lease: two attempts hold one lease", what, rec.Attempt, rec.Done)
		return
	}
	if s.check(errors.Is(err, effects.ErrInFlight), "%s: Begin: %v, want ErrInFlight", what, err) {
		s.check(effects.ClassOf(err) == effects.Retryable, "%s: ErrInFlight must be retryable", what)
	}
}

// doneWith requires Begin to return key done with ref.
func (s *jscene) doneWith(i *jinst, key effects.Key, ref, what string) {
	rec, err := s.begin(i, key, fp1, holdLease)
	if err != nil {
		s.failf("%s: Begin: %v, want the done record", what, err)
		return
	}
	s.check(rec.Done, "%s: Begin granted attempt %d, want the done record", what, rec.Attempt)
	s.check(!rec.Done || rec.Ref == ref, "%s: done with ref %q, want %q", what, rec.Ref, ref)
}

// expire waits until a lease of cfg.lease has surely expired.
func (s *jscene) expire() {
	if err := retry.Sleep(s.ctx, s.cfg.lease+max(s.cfg.lease/2, 250*time.Millisecond)); err != nil {
		s.fatalf("waiting for a lease to expire: %v", err)
	}
}

func (s *jscene) lease() {
	a, b := s.open("A"), s.open("B")
	key := s.key("lease")
	rec := s.mustLease(a, key, holdLease, "a new key")
	s.check(rec.Attempt == 1, "a new key: Attempt %d, want 1", rec.Attempt)
	s.inFlight(a, key, "a second Begin on the same instance")
	s.inFlight(b, key, "a Begin on another instance")
	if err := s.release(a, key, rec.Attempt); err != nil {
		s.fatalf("Release: %v", err)
	}
	rec2 := s.mustLease(b, key, holdLease, "a Begin after Release")
	s.check(rec2.Attempt == rec.Attempt+1, "a Begin after Release: Attempt %d, want %d", rec2.Attempt, rec.Attempt+1)
	s.inFlight(a, key, "a Begin while the new attempt holds the lease")
	if err := s.complete(b, key, "ref-lease"); err != nil {
		s.fatalf("Complete: %v", err)
	}
	s.doneWith(a, key, "ref-lease", "a Begin after Complete")
}

func (s *jscene) leaseExpiry() {
	a, b := s.open("A"), s.open("B")
	key := s.key("expiry")
	// Taken alongside: a key reused with another payload once its lease
	// expired (a takeover must not adopt the new fingerprint), and a key
	// leased for longer than the scenario waits (a journal that cuts
	// leases short lets a second attempt start while the first still
	// runs; a cut longer than the wait cannot be seen from outside).
	reused, long := s.key("expiry", "reused"), s.key("expiry", "long")
	s.mustLease(a, reused, s.cfg.lease, "a new key")
	s.mustLease(a, long, holdLease, "a new key")
	until := time.Now().Add(s.cfg.lease)
	rec := s.mustLease(a, key, s.cfg.lease, "a new key")
	s.inFlightUntil(b, key, until, "a Begin before the lease expired")
	s.expire()
	rec2 := s.mustLease(b, key, holdLease, "a Begin after the lease expired")
	s.check(rec2.Attempt > rec.Attempt, "takeover after expiry: Attempt %d, want more than %d (Attempt > 1 tells the new holder an earlier attempt may have done the effect)", rec2.Attempt, rec.Attempt)
	s.inFlight(a, key, "the expired holder's next Begin")
	s.inFlight(b, long, fmt.Sprintf("a Begin %v into a lease of %v", s.cfg.lease+max(s.cfg.lease/2, 250*time.Millisecond), holdLease))
	_, err := s.begin(b, reused, fp2, holdLease)
	s.check(errors.Is(err, effects.ErrKeyReused), "another fingerprint after the first one's lease expired: %v, want ErrKeyReused (a takeover must keep the key's fingerprint)", err)
	s.notef("lease of %v expired and was taken over", s.cfg.lease)
}

func (s *jscene) fencing() {
	a, b := s.open("A"), s.open("B")
	key := s.key("fencing")
	stale := s.mustLease(a, key, s.cfg.lease, "a new key")
	s.expire()
	cur := s.mustLease(b, key, holdLease, "a takeover after expiry")
	if err := s.release(a, key, stale.Attempt); err != nil {
		s.fatalf("a stale Release: %v", err)
	}
	s.inFlight(a, key, fmt.Sprintf("a Begin after attempt %d (stale) released while attempt %d holds the lease", stale.Attempt, cur.Attempt))
	if err := s.release(b, key, cur.Attempt); err != nil {
		s.fatalf("Release by the holder: %v", err)
	}
	next := s.mustLease(a, key, holdLease, "a Begin after the holder released")
	s.check(next.Attempt == cur.Attempt+1, "a Begin after the holder released: Attempt %d, want %d", next.Attempt, cur.Attempt+1)
	if err := s.complete(a, key, "ref-fencing"); err != nil {
		s.fatalf("Complete: %v", err)
	}
	if err := s.release(a, key, next.Attempt); err != nil {
		s.fatalf("Release of a done key: %v", err)
	}
	s.doneWith(b, key, "ref-fencing", "a Begin after releasing a done key")
}

func (s *jscene) firstRef() {
	a, b := s.open("A"), s.open("B")
	key := s.key("first-ref")
	s.mustLease(a, key, holdLease, "a new key")
	if err := s.complete(a, key, "ref-first"); err != nil {
		s.fatalf("Complete: %v", err)
	}
	if err := s.complete(b, key, "ref-second"); err != nil {
		s.failf("completing a done key again: %v, want success", err)
	}
	s.doneWith(b, key, "ref-first", "after two Completes")
	// A slow holder completes after its lease expired and another attempt
	// completed: the record keeps the first completion.
	key2 := s.key("first-ref", "late")
	s.mustLease(a, key2, s.cfg.lease, "a new key")
	s.expire()
	s.mustLease(b, key2, holdLease, "a takeover after expiry")
	if err := s.complete(b, key2, "ref-takeover"); err != nil {
		s.fatalf("Complete by the new holder: %v", err)
	}
	if err := s.complete(a, key2, "ref-late"); err != nil {
		s.notef("the expired holder's late Complete returned %v", err)
	}
	s.doneWith(s.open("C"), key2, "ref-takeover", "after a late Complete by an expired holder")

	// An empty reference is legal (an effect with nothing to refer to):
	// Complete with ref "" marks the key done all the same.
	empty := s.key("first-ref", "empty")
	s.mustLease(a, empty, holdLease, "a new key")
	if err := s.complete(a, empty, ""); err != nil {
		s.fatalf("Complete with an empty ref: %v, want the key done", err)
	}
	s.doneWith(b, empty, "", "a Begin after Complete with an empty ref")

	// Complete of a key never begun records nothing, and says so: a done
	// record without the payload's fingerprint would replay for any
	// payload, and silence would hide a success that is not recorded.
	never := s.key("first-ref", "never-begun")
	s.check(s.complete(b, never, "ref-never") != nil, "Complete of a key never begun succeeded, want an error")
	rec, err := s.begin(a, never, fp1, holdLease)
	s.check(err == nil && !rec.Done, "a Begin after Complete of a key never begun = %+v, %v, want the lease (nothing recorded)", rec, err)
}

func (s *jscene) keyReuse() {
	a := s.open("A")
	key := s.key("reuse")
	s.mustLease(a, key, holdLease, "a new key")
	_, err := s.begin(a, key, fp2, holdLease)
	if s.check(errors.Is(err, effects.ErrKeyReused), "another fingerprint while leased: %v, want ErrKeyReused", err) {
		s.check(effects.ClassOf(err) != effects.Retryable, "ErrKeyReused must not be retryable")
	}
	if err := s.complete(a, key, "ref-reuse"); err != nil {
		s.fatalf("Complete: %v", err)
	}
	_, err = s.begin(s.open("B"), key, fp2, holdLease)
	s.check(errors.Is(err, effects.ErrKeyReused), "another fingerprint after Complete: %v, want ErrKeyReused", err)
	s.doneWith(a, key, "ref-reuse", "the first fingerprint after Complete")

	// After a Release the key is free for the same payload, not another.
	released := s.key("reuse", "released")
	rec := s.mustLease(a, released, holdLease, "a new key")
	if err := s.release(a, released, rec.Attempt); err != nil {
		s.fatalf("Release: %v", err)
	}
	_, err = s.begin(s.open("C"), released, fp2, holdLease)
	s.check(errors.Is(err, effects.ErrKeyReused), "another fingerprint after a Release: %v, want ErrKeyReused (a takeover must keep the key's fingerprint)", err)
}

func (s *jscene) invalidKeys() {
	a := s.open("A")
	for _, k := range []effects.Key{"", "abc\x00def", "abc\xffdef", "abc\ndef", effects.Key(strings.Repeat("k", effects.MaxKeyLen+1))} {
		_, err := s.begin(a, k, fp1, holdLease)
		s.check(errors.Is(err, effects.ErrInvalidKey), "Begin(%s): %v, want ErrInvalidKey", shortKey(k), err)
		err = s.complete(a, k, "ref")
		s.check(errors.Is(err, effects.ErrInvalidKey), "Complete(%s): %v, want ErrInvalidKey", shortKey(k), err)
		err = s.release(a, k, 1)
		s.check(errors.Is(err, effects.ErrInvalidKey), "Release(%s): %v, want ErrInvalidKey", shortKey(k), err)
	}
	s.check(a.f.RoundTrips() == 0, "invalid keys made %d round trips to the backend, want none (validate before any I/O)", a.f.RoundTrips())
}

func (s *jscene) distinctKeys() {
	a := s.open("A")
	pairs := distinctPairs(string(s.key("distinct")) + ":")
	for _, p := range pairs {
		for _, k := range []effects.Key{p.a, p.b} {
			rec, err := s.begin(a, k, fp1, holdLease)
			if err != nil || rec.Done {
				s.failf("%s: Begin(%s) got (done %v, ref %q, %v), want the lease: the journal treats %s and %s as one key", p.why, shortKey(k), rec.Done, rec.Ref, err, shortKey(p.a), shortKey(p.b))
				continue
			}
			if err := s.complete(a, k, string(k)); err != nil {
				s.fatalf("Complete(%s): %v", shortKey(k), err)
			}
		}
	}
	b := s.open("B")
	for _, p := range pairs {
		s.doneWith(b, p.a, string(p.a), p.why)
		s.doneWith(b, p.b, string(p.b), p.why)
	}
}

// concurrent races Begins of one key from two instances: on a new key, and
// on a key whose lease just expired. Exactly one may win each race.
func (s *jscene) concurrent() {
	insts := []*jinst{s.open("A"), s.open("B")}
	for round := range 3 {
		key := s.key("concurrent", fmt.Sprint(round))
		s.race(insts, key, fmt.Sprintf("%d concurrent Begins of a new key", raceAttempts))
		if err := s.complete(insts[0], key, "ref-concurrent"); err != nil {
			s.fatalf("Complete: %v", err)
		}
		s.doneWith(insts[1], key, "ref-concurrent", "after the race")
	}
	key := s.key("concurrent", "takeover")
	s.mustLease(insts[0], key, s.cfg.lease, "a new key")
	s.expire()
	s.race(insts, key, fmt.Sprintf("%d concurrent takeovers of an expired lease", raceAttempts))
}

func (s *jscene) race(insts []*jinst, key effects.Key, what string) {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		won     []int
		other   []string
		aborted bool
		start   = make(chan struct{})
	)
	for g := 0; g < raceAttempts; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			finished := false
			s.guard(func() {
				rec, err := s.begin(insts[g%len(insts)], key, fp1, holdLease)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && !rec.Done:
					won = append(won, rec.Attempt)
				case err != nil && errors.Is(err, effects.ErrInFlight):
				default:
					other = append(other, fmt.Sprintf("(done %v, %v)", rec.Done, err))
				}
				finished = true
			})
			if !finished {
				mu.Lock()
				aborted = true
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	if aborted {
		panic(abort{})
	}
	s.check(len(won) == 1, "%s: %d won the lease (attempts %v), want exactly 1", what, len(won), won)
	s.check(len(other) == 0, "%s: %d got neither the lease nor ErrInFlight, e.g. %s", what, len(other), firstFew(other))
}

// crashedHolder: a lease holder dies (its connections cut, no Complete,
// no Release). Its lease outlives it, and only its expiry lets another
// instance take over, with an Attempt that says an earlier attempt may
// have done the effect.
func (s *jscene) crashedHolder() {
	a := s.open("A")
	key := s.key("crashed")
	until := time.Now().Add(s.cfg.lease)
	rec := s.mustLease(a, key, s.cfg.lease, "a new key")
	a.f.Sever()
	a.Close()
	b := s.open("B")
	s.inFlightUntil(b, key, until, "a Begin right after the holder crashed")
	s.expire()
	rec2 := s.mustLease(b, key, holdLease, "a Begin after the crashed holder's lease expired")
	s.check(rec2.Attempt > rec.Attempt, "takeover of a crashed holder's lease: Attempt %d, want more than %d", rec2.Attempt, rec.Attempt)
	if err := s.complete(b, key, "ref-crashed"); err != nil {
		s.fatalf("Complete: %v", err)
	}
	s.doneWith(s.open("C"), key, "ref-crashed", "a new instance after the takeover completed")
}

// restart restarts the backend between Begin/Complete and the reads.
func (s *jscene) restart() {
	r := s.h.(Restarter)
	a := s.open("A")
	done, held := s.key("restart", "done"), s.key("restart", "held")
	s.mustLease(a, done, holdLease, "a new key")
	if err := s.complete(a, done, "ref-restart"); err != nil {
		s.fatalf("Complete: %v", err)
	}
	s.mustLease(a, held, holdLease, "a new key")
	if err := r.Restart(s.ctx); err != nil {
		s.fatalf("harness Restart: %v", err)
	}
	b := s.open("B")
	s.doneAfterRestart(b, done, "ref-restart", "a completed key after a restart")
	s.inFlight(b, held, "a leased key after a restart")
}

// lookupMarkDone holds a DoneJournal to its word: what Journaled relies on
// when it does an owner-keyed effect without a lease.
func (s *jscene) lookupMarkDone() {
	a, b := s.open("A"), s.open("B")
	if _, ok := a.j.(journal.DoneJournal); !ok {
		s.inapplicable("the journal (%T) does not implement journal.DoneJournal", a.j)
	}
	// lookedUp requires Lookup to return key done with ref (ref "": not
	// done).
	lookedUp := func(i *jinst, key effects.Key, ref, what string) {
		rec, err := s.lookup(i, key, fp1)
		if err != nil {
			s.failf("%s: Lookup: %v", what, err)
			return
		}
		if ref == "" {
			s.check(!rec.Done, "%s: Lookup says done with ref %q, want not done", what, rec.Ref)
			return
		}
		s.check(rec.Done && rec.Ref == ref, "%s: Lookup = %+v, want done with ref %q", what, rec, ref)
	}
	reusedBy := func(err error, what string) {
		if s.check(errors.Is(err, effects.ErrKeyReused), "%s: %v, want ErrKeyReused", what, err) {
			s.check(effects.ClassOf(err) != effects.Retryable, "%s: ErrKeyReused must not be retryable", what)
		}
	}

	key := s.key("mark-done")
	lookedUp(a, key, "", "an unknown key")
	if err := s.markDone(a, key, fp1, "ref-first"); err != nil {
		s.fatalf("MarkDone of a key never begun: %v, want it recorded", err)
	}
	lookedUp(b, key, "ref-first", "after MarkDone")
	s.doneWith(b, key, "ref-first", "a Begin after MarkDone")
	if err := s.markDone(b, key, fp1, "ref-second"); err != nil {
		s.failf("marking a done key done again: %v, want success", err)
	}
	lookedUp(a, key, "ref-first", "after a second MarkDone")
	if err := s.complete(b, key, "ref-complete"); err != nil {
		s.failf("Complete of a key marked done: %v, want success", err)
	}
	lookedUp(a, key, "ref-first", "after a Complete of a key marked done")
	_, err := s.lookup(b, key, fp2)
	reusedBy(err, "Lookup with another fingerprint")
	reusedBy(s.markDone(b, key, fp2, "ref-reused"), "MarkDone with another fingerprint")
	lookedUp(a, key, "ref-first", "after MarkDone with another fingerprint")

	// An empty reference is legal: MarkDone with ref "" marks the key done.
	empty := s.key("mark-done", "empty")
	if err := s.markDone(a, empty, fp1, ""); err != nil {
		s.fatalf("MarkDone with an empty ref: %v, want the key done", err)
	}
	if rec, err := s.lookup(b, empty, fp1); err != nil || !rec.Done {
		s.failf("Lookup after MarkDone with an empty ref = %+v, %v, want done", rec, err)
	}
	s.doneWith(a, empty, "", "a Begin after MarkDone with an empty ref")

	// A released lease leaves the key not done: Lookup must not take the
	// released attempt for a completed one.
	released := s.key("mark-done", "released")
	rel := s.mustLease(a, released, holdLease, "a new key")
	if err := s.release(a, released, rel.Attempt); err != nil {
		s.fatalf("Release: %v", err)
	}
	lookedUp(b, released, "", "a key whose lease was released")

	// A pending record: Lookup does not take it, MarkDone completes it and
	// drops its lease, unless the fingerprint differs.
	pending := s.key("mark-done", "pending")
	s.mustLease(a, pending, holdLease, "a new key")
	lookedUp(b, pending, "", "a key whose lease another attempt holds")
	_, err = s.lookup(b, pending, fp2)
	reusedBy(err, "Lookup of a pending key with another fingerprint")
	reusedBy(s.markDone(b, pending, fp2, "ref-reused"), "MarkDone of a pending key with another fingerprint")
	s.inFlight(b, pending, "a Begin after a refused MarkDone (the lease must still hold)")
	if err := s.markDone(b, pending, fp1, "ref-pending"); err != nil {
		s.fatalf("MarkDone of a pending key: %v", err)
	}
	s.doneWith(a, pending, "ref-pending", "a Begin after MarkDone of a pending key")

	// Two instances mark one new key done at once: one reference wins, and
	// every later Lookup returns it.
	racing := s.key("mark-done", "racing")
	var wg sync.WaitGroup
	for _, i := range []*jinst{a, b} {
		wg.Go(func() {
			s.guard(func() {
				if err := s.markDone(i, racing, fp1, "ref-"+i.name); err != nil {
					s.failf("concurrent MarkDone: %v, want success", err)
				}
			})
		})
	}
	wg.Wait()
	first, err := s.lookup(a, racing, fp1)
	if err != nil || !first.Done || (first.Ref != "ref-A" && first.Ref != "ref-B") {
		s.failf("after concurrent MarkDones: Lookup = %+v, %v, want done with ref-A or ref-B", first, err)
		return
	}
	lookedUp(b, racing, first.Ref, "a second Lookup after concurrent MarkDones")
}
