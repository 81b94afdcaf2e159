package conformance

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
)

// applyFirst applies a new key on inst and checks that it applied and
// shows once in the backend.
func (s *scene[In]) applyFirst(inst *instance[In], key effects.Key, what string) effects.Result {
	first, err := s.applyUntilDone(inst, key, s.h.Input(key, 0), what)
	if err != nil {
		s.fatalf("%s: %v", what, err)
	}
	s.check(first.Status == effects.Applied, "%s returned %s, want applied", what, first.Status)
	s.expect(key, cleanRepeat, true, "after "+what)
	return first
}

// redeliverOn applies key again on inst and checks it replayed first.
func (s *scene[In]) redeliverOn(inst *instance[In], key effects.Key, first effects.Result, what string) {
	res, err := s.applyUntilDone(inst, key, s.h.Input(key, 0), what)
	if err != nil {
		s.fatalf("%s: %v", what, err)
	}
	s.checkReplay(first, res, what)
}

// redelivery applies one key, redelivers it three times to the same
// instance and once to a new instance (a restarted process).
func (s *scene[In]) redelivery() {
	inst := s.open(new(Faults))
	key := s.key("redelivery")
	first := s.applyFirst(inst, key, "first Apply")
	for i := 1; i <= 3; i++ {
		s.redeliverOn(inst, key, first, fmt.Sprintf("redelivery %d", i))
	}
	inst.Close()
	s.redeliverOn(s.open(new(Faults)), key, first, "redelivery to a new instance")
	s.expect(key, cleanRepeat, true, "after 4 redeliveries")
}

// lateRedelivery redelivers a key to a new instance after a wait on the
// wall clock: what a broker does after a visibility timeout. A dedup
// record that vanishes after a second or two fails here whatever the
// harness can do.
func (s *scene[In]) lateRedelivery() {
	if !s.recordsKeys() {
		s.inapplicable("nothing records keys (the contract allows a duplicate on any redelivery)")
	}
	wait := s.cfg.lateRedelivery
	if h := s.contract.Horizon; h > 0 && h <= 2*wait {
		s.inapplicable("the declared horizon %v is too short for a redelivery %v later (the horizon scenario verifies it)", h, wait)
	}
	inst := s.open(new(Faults))
	key := s.key("late")
	first := s.applyFirst(inst, key, "first Apply")
	inst.Close()
	if err := retry.Sleep(s.ctx, wait); err != nil {
		s.fatalf("waiting %v: %v", wait, err)
	}
	what := fmt.Sprintf("redelivery %v later to a new instance", wait)
	s.redeliverOn(s.open(new(Faults)), key, first, what)
	s.expect(key, cleanRepeat, true, "after the "+what)
}

// horizon ages the backend to just inside the declared horizon (or, for
// "kept until pruned", by a long age) and redelivers: the key must still
// be remembered. Where nothing records keys (duplicates on any
// redelivery) a non-zero horizon still claims that the backend absorbs a
// repeat within it, though Apply may not say so: the redelivery need not
// replay, but the backend must still show one effect. Past a non-zero
// horizon a redelivery must apply again, or the harness's Age did not
// reach whatever enforces the keys, and the horizon is not verified.
func (s *scene[In]) horizon() {
	ager := s.h.(Ager)
	h := s.contract.Horizon
	if !s.recordsKeys() && h == 0 {
		s.inapplicable("nothing records keys (the contract allows a duplicate on any redelivery) and no horizon is declared: no horizon to verify")
	}
	inst := s.open(new(Faults))
	key := s.key("horizon")
	start := time.Now()
	first := s.applyFirst(inst, key, "first Apply")
	inst.Close()
	var age, margin time.Duration
	var what string
	if h > 0 {
		margin = horizonMargin(h)
		age = h - margin - time.Since(start)
		if age <= 0 {
			s.skip("the declared horizon %v is too short to age the backend to just inside it", h)
		}
		what = fmt.Sprintf("redelivery after aging the backend by %v, %v inside the declared horizon of %v", age.Round(time.Millisecond), margin, h)
	} else {
		age = longAge
		what = fmt.Sprintf("redelivery after aging the backend by %s without pruning (declared horizon 0: kept until pruned)", days(age))
	}
	if err := ager.Age(s.ctx, age); err != nil {
		s.fatalf("harness Age(%v): %v", age, err)
	}
	aged := s.open(new(Faults))
	s.redeliverOn(aged, key, first, what)
	// The key's payload must be kept as long as the key: a fingerprint
	// forgotten sooner lets another payload replay the first one's result.
	s.reuseOn(aged, key, "the key with another payload after aging the backend by "+days(age))
	n := s.expect(key, cleanRepeat, true, "after the "+what)
	if !s.recordsKeys() {
		s.check(n == 1, "after the %s: %d effects for one key: the backend forgot the key inside the declared horizon of %v", what, n, h)
	}
	if h == 0 {
		return
	}
	s.pastHorizon(ager, key, margin)
}

// horizonMargin is how far inside a non-zero horizon the horizon scenario
// redelivers, and half how far past it.
func horizonMargin(h time.Duration) time.Duration {
	return min(max(h/20, time.Second), time.Minute)
}

// pastHorizon ages the backend 2*margin more, past the declared horizon,
// and redelivers key: the backend must apply it again. When it does not,
// the harness's Age changed nothing the backend reads (or the backend
// keeps keys longer than declared, which the harness must say with
// [AllowUnverified]), so the check inside the horizon proved nothing and
// the row is marked unconfirmed.
func (s *scene[In]) pastHorizon(ager Ager, key effects.Key, margin time.Duration) {
	if err := ager.Age(s.ctx, 2*margin); err != nil {
		s.fatalf("harness Age(%v): %v", 2*margin, err)
	}
	late := s.open(new(Faults))
	res, err := s.applyUntilDone(late, key, s.h.Input(key, 0), "redelivery past the horizon")
	n := s.peek(key, "after the redelivery past the horizon")
	s.notef("past the horizon (aged %v more) a redelivery got (%s, %v) and the backend shows %d effects", 2*margin, res.Status, err, n)
	if n >= 2 {
		return
	}
	s.row.unconfirmed(fmt.Sprintf("Age did not reach whatever enforces the keys: %v past the declared horizon of %v a redelivery applied nothing new (%d effects)",
		margin, s.contract.Horizon, n),
		"make Age reach the key store (the backend's clock or its stored timestamps); for a backend that keeps keys longer than the declared horizon, "+
			"give AllowUnverified the reason, naming conformance.ScenarioHorizon")
}

func days(d time.Duration) string {
	if d >= 48*time.Hour && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	}
	return d.String()
}

// concurrent applies one key from raceAttempts goroutines at once,
// spread over two instances (two processes: a lock in process memory
// guards nothing), for four keys in turn, so that a race window that
// connection set-up hid in one round opens in the next.
func (s *scene[In]) concurrent() {
	insts := s.racers()
	for round := range 4 {
		s.concurrentRound(insts, s.key("concurrent", fmt.Sprint(round)))
	}
	s.widened(insts)
}

// widened notes when the racers' round trips did not go through their
// Faults, so the delay that widens race windows was never added: the
// race ran at the backend's own speed, and a pass proves less.
func (s *scene[In]) widened(insts []*instance[In]) {
	for _, i := range insts {
		if i.f.RoundTrips() > i.base {
			return
		}
	}
	s.notef("race window not widened: the attempts made no round trip through the harness's Faults, so no delay was added to them (see \"Writing a harness\")")
}

// racers opens the two instances a race spreads its attempts over, each
// with every round trip delayed a little to widen the race windows.
func (s *scene[In]) racers() []*instance[In] {
	insts := make([]*instance[In], 2)
	for i := range insts {
		f := new(Faults)
		f.SetDelay(time.Millisecond)
		insts[i] = s.open(f)
	}
	return insts
}

// outcome is one concurrent attempt's result.
type outcome struct {
	variant int
	res     effects.Result
	err     error
}

// race applies key from raceAttempts goroutines at once, attempt i on
// insts[i%len(insts)] with input variant(i), and returns every outcome.
// An attempt that hung has recorded the hang; race then stops the
// scenario.
func (s *scene[In]) race(insts []*instance[In], key effects.Key, variant func(i int) int, what string) []outcome {
	out := make([]outcome, raceAttempts)
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		hung  = make([]bool, len(out))
	)
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			v := variant(i)
			hung[i] = true
			s.guard(func() {
				res, err := s.applyUntilDone(insts[i%len(insts)], key, s.h.Input(key, v), what)
				out[i] = outcome{v, res, err}
				hung[i] = false
			})
		}()
	}
	close(start)
	wg.Wait()
	for _, h := range hung {
		if h {
			panic(abort{})
		}
	}
	return out
}

func (s *scene[In]) concurrentRound(insts []*instance[In], key effects.Key) {
	what := fmt.Sprintf("%d concurrent attempts on %s over %d instances", raceAttempts, key, len(insts))
	out := s.race(insts, key, func(int) int { return 0 }, what)
	applied, refs, failed := 0, map[string]int{}, 0
	for _, o := range out {
		if o.err != nil {
			if failed == 0 {
				s.failf("%s: an attempt failed: %v", what, o.err)
			}
			failed++
			continue
		}
		if o.res.Status == effects.Applied {
			applied++
		}
		refs[o.res.Ref]++
	}
	s.check(failed == 0, "%s: %d attempts failed", what, failed)
	n := s.expect(key, cleanRepeat, failed < len(out), what)
	if s.recordsKeys() {
		s.check(applied == 1, "%s: %d reported applied, want exactly 1 (backend shows %d effects)", what, applied, n)
		s.check(len(refs) <= 1, "%s: %d different refs returned, want one", what, len(refs))
	}
}

// sweep counts the round trips of a clean Apply (Make's own excluded),
// then for each n injects kind at round trip n of a fresh instance, twice,
// each in a subtest of its own: once retried on a new instance (trip-NN),
// once on the faulted instance itself (trip-NN-same); see faultAt.
func (s *scene[In]) sweep(kind FaultKind) {
	gaveUp := new(atomic.Int64)
	inst := s.open(new(Faults))
	clean := s.key(kind.slug(), "clean")
	if _, err := s.applyUntilDone(inst, clean, s.h.Input(clean, 0), "the clean Apply that counts round trips"); err != nil {
		s.fatalf("clean Apply: %v", err)
	}
	trips := inst.f.RoundTrips() - inst.base
	inst.Close()
	s.expect(clean, cleanRepeat, true, "clean Apply")
	if trips == 0 {
		s.skip("the adapter made no round trip through the harness's Faults after Make returned: wire Make's connections through f.DialContext or f.Transport, " +
			"a database/sql driver through conformance.Faults.SQLConnector, or each call of an in-process backend through f.RoundTrip")
	}
	if trips > s.cfg.maxSweep {
		s.notef("a clean Apply takes %d round trips; swept the first %d", trips, s.cfg.maxSweep)
		trips = s.cfg.maxSweep
	}
	s.notef("%s at each of the %d round trips of a clean Apply (Make's own excluded), retried on a new instance and on the faulted one", kind, trips)
	notFired, left := 0, 0
	for n := 1; n <= trips; n++ {
		for _, same := range []bool{false, true} {
			name := fmt.Sprintf("trip-%02d", n)
			if same {
				name += "-same"
			}
			ran := s.sub(name, func(c *checker) {
				ts := &scene[In]{checker: c, h: s.h, contract: s.contract, gaveUp: gaveUp}
				if !ts.faultAt(kind, n, same) {
					notFired++
				}
			})
			if !ran {
				left++
			}
		}
	}
	if notFired > 0 {
		s.notef("%d of %d armed faults did not fire (the apply took fewer round trips)", notFired, 2*trips)
	}
	if kind == SlowReply && gaveUp.Load() == 0 && left == 0 {
		s.notef("no Apply gave up while its reply was held %v: the adapter waited for every reply, so how it reports giving up "+
			"was not seen; give WithSlowReply a hold longer than its own per-call deadline, if it has one", s.cfg.slowReply)
	}
	dupTrips := s.dupSweep(kind, clean)
	if left > 0 {
		s.skip(notSelectedRun+": %d of %d faulted applies left out, the sweep is incomplete", left, 2*trips+dupTrips)
	}
}

// slowReplySweep is the sweep of SlowReply, run only when
// [WithSlowReply] gives its delay: every reply of an Apply in turn is held past the adapter's own
// deadline, the connection up, while the backend has processed the
// request. An adapter that gives up must report an unknown outcome, never
// ErrTransient; one that waits must get the reply.
func (s *scene[In]) slowReplySweep() {
	s.sweep(SlowReply)
}

// dupSweep counts the round trips of a clean duplicate Apply of clean (a
// key applied before), then for each n injects kind at round trip n of a
// duplicate Apply of a key applied once, on a new instance, in a subtest
// of its own (dup-trip-NN), retried on another new instance: a duplicate
// takes paths of its own (a lookup, a replay, a rollback), which must hold
// the contract under faults too. It returns how many it swept.
func (s *scene[In]) dupSweep(kind FaultKind, clean effects.Key) int {
	inst := s.open(new(Faults))
	if _, err := s.applyUntilDone(inst, clean, s.h.Input(clean, 0), "the clean duplicate Apply that counts round trips"); err != nil {
		s.fatalf("clean duplicate Apply: %v", err)
	}
	trips := min(inst.f.RoundTrips()-inst.base, s.cfg.maxSweep)
	inst.Close()
	s.expect(clean, cleanRepeat, true, "clean duplicate Apply")
	s.notef("%s at each of the %d round trips of a duplicate Apply, retried on a new instance", kind, trips)
	for n := 1; n <= trips; n++ {
		s.sub(fmt.Sprintf("dup-trip-%02d", n), func(c *checker) {
			ts := &scene[In]{checker: c, h: s.h, contract: s.contract}
			ts.faultDuplicateAt(kind, n)
		})
	}
	return trips
}

// faultDuplicateAt applies a new key once, then injects kind at round trip
// n of its duplicate Apply on a new instance: a duplicate that returned no
// error must not have added an effect, nor one that returned ErrTransient;
// an error must be retryable; the retry, on another new instance, must
// replay the first Apply.
func (s *scene[In]) faultDuplicateAt(kind FaultKind, n int) {
	key := s.key(kind.slug()+s.appCode, "dup", fmt.Sprint(n))
	in := s.h.Input(key, 0)
	firstInst := s.open(new(Faults))
	first := s.applyFirst(firstInst, key, "the first Apply")
	firstInst.Close()
	f := new(Faults)
	inst := s.open(f)
	what := fmt.Sprintf("%s at round trip %d of a duplicate", kind, n)
	res, _, err := s.applyFaulted(inst, f, kind, n, key, in, what)
	inst.Close()
	switch {
	case err == nil:
		s.checkReplay(first, res, what)
		s.expect(key, cleanRepeat, true, what+": after Apply returned no error")
	case effects.ClassOf(err) != effects.Retryable:
		s.failf("%s: Apply returned an error that is not retryable (effects.ClassOf), so a consumer would give up on a key it may have applied: %v", what, err)
		return
	case errors.Is(err, effects.ErrTransient):
		s.quiet()
		s.expect(key, cleanRepeat, true, what+": after ErrTransient, which promises that nothing more was applied")
	}
	again := what + ", retried on a new instance"
	retry := s.open(new(Faults))
	res2, err2 := s.applyUntilDone(retry, key, in, again)
	retry.Close()
	if err2 != nil {
		s.failf("%s: %v", again, err2)
		return
	}
	s.checkReplay(first, res2, again)
	s.expect(key, unknownOutcome, true, again)
}

// faultAt injects kind at round trip n of one Apply of a new key on a new
// instance, then holds the outcome to its promise: an Apply that returned
// no error must already show its effect in the backend; one that returned
// ErrTransient must show none (once its instance is gone, unless same).
// Then it retries the key, and checks the backend against the contract:
// if same, on the faulted instance (a process that survived the fault and
// retries, as a consumer does: what it kept in memory, a vendor key made
// per attempt, must not make the retry a second effect), then closes it;
// else it closes the faulted instance first and retries on a new one (a
// successor process, which knows nothing the faulted one kept in memory).
// It reports whether the fault fired.
func (s *scene[In]) faultAt(kind FaultKind, n int, same bool) bool {
	f := new(Faults)
	inst := s.open(f)
	key := s.key(kind.slug()+s.appCode, fmt.Sprint(n))
	if same {
		key = s.key(kind.slug()+s.appCode, fmt.Sprint(n), "same")
	}
	in := s.h.Input(key, 0)
	what := fmt.Sprintf("%s at round trip %d", kind, n)
	res, fired, err := s.applyFaulted(inst, f, kind, n, key, in, what)
	if err != nil && s.gaveUp != nil {
		s.gaveUp.Add(1)
	}
	if err == nil {
		got := s.peek(key, what+": after Apply returned no error")
		s.check(got >= 1, "%s: Apply returned %s with no error, but the backend shows no effect: it reported an effect that did not happen", what, res.Status)
	} else if effects.ClassOf(err) != effects.Retryable {
		s.failf("%s: Apply returned an error that is not retryable (effects.ClassOf), so a consumer would give up on a key it may have applied: %v", what, err)
		return fired
	}
	// retry is the instance the key is retried on: the faulted one, or a
	// successor once the faulted one is gone.
	retry, again := inst, what+", retried on the same instance"
	if !same {
		inst.Close() // the faulted process is gone
	}
	if errors.Is(err, effects.ErrTransient) {
		s.quiet()
		got := s.peek(key, what+": after ErrTransient")
		s.check(got == 0, "%s: Apply returned ErrTransient, which promises that nothing was applied, but the backend shows %d effects %v later: %v", what, got, s.cfg.quietPeriod, err)
	}
	if !same {
		retry, again = s.open(new(Faults)), what+", retried on a new instance"
	}
	res2, err2 := s.applyUntilDone(retry, key, in, again)
	retry.Close()
	if err2 != nil {
		s.failf("%s: %v", again, err2)
		return fired
	}
	if err == nil {
		s.checkReplay(res, res2, again+" after an Apply that succeeded")
	}
	s.expect(key, unknownOutcome, true, again)
	return fired
}

// quiet waits the quiet period ([WithQuietPeriod]) after an Apply that
// returned ErrTransient, before its effects are counted: work handed to
// something that applies it later breaks the promise as surely as work
// applied at once.
func (s *scene[In]) quiet() {
	if s.cfg.quietPeriod > 0 {
		if err := retry.Sleep(s.ctx, s.cfg.quietPeriod); err != nil {
			s.fatalf("waiting the quiet period after ErrTransient: %v", err)
		}
	}
}

// applyFaulted applies key on inst, whose Faults f injects kind at round
// trip n of the Apply (cancelling its context for CancelAfterSend), and
// reports whether the fault fired.
func (s *scene[In]) applyFaulted(inst *instance[In], f *Faults, kind FaultKind, n int, key effects.Key, in In, what string) (res effects.Result, fired bool, err error) {
	actx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	f.SetSlowReply(s.cfg.slowReply)
	f.SetAppError(s.appCode)
	f.Arm(inst.base+n, kind, cancel)
	res, err = s.apply(actx, inst, key, in, what)
	cancel()
	fired = f.Fired()
	f.Disarm()
	return res, fired, err
}

// keyReuse applies a key, then applies it again with another payload, on
// the same instance and on a new one (a process that never saw the first
// payload: reuse must be detected from the backend, not from memory).
func (s *scene[In]) keyReuse() {
	inst := s.open(new(Faults))
	key := s.key("reuse")
	s.applyFirst(inst, key, "first Apply")
	for _, on := range []struct {
		inst *instance[In]
		what string
	}{{inst, "the same key with another payload"}, {s.open(new(Faults)), "the same key with another payload, on a new instance"}} {
		if res, err := s.reuseOn(on.inst, key, on.what); !s.contract.DetectsKeyReuse && err == nil {
			s.notef("contract does not detect key reuse; %s got %v", on.what, res.Status)
		}
	}
	s.expect(key, cleanRepeat, true, "after key reuse")
}

// raceReuse has concurrent writers apply one key with two different
// payloads at once (half each), twice: exactly one may apply, the writers
// of the winning payload replay it, and, where the contract detects key
// reuse, the others get ErrKeyReused. The backend must hold one effect.
func (s *scene[In]) raceReuse() {
	insts := s.racers()
	for round := range 2 {
		key := s.key("race-reuse", fmt.Sprint(round))
		what := fmt.Sprintf("%d concurrent writers, two payloads, on %s over %d instances", raceAttempts, key, len(insts))
		// Writer i runs on instance i%2 with payload (i/2)%2: each instance
		// has writers of both payloads.
		out := s.race(insts, key, func(i int) int { return (i / 2) % 2 }, what)
		winner, applied, succeeded := -1, 0, 0
		for _, o := range out {
			if o.err == nil {
				succeeded++
				if o.res.Status == effects.Applied {
					applied++
					winner = o.variant
				}
			}
		}
		s.expect(key, cleanRepeat, succeeded > 0, what)
		if !s.recordsKeys() {
			continue
		}
		if !s.check(applied == 1, "%s: %d reported applied, want exactly 1", what, applied) {
			continue
		}
		for _, o := range out {
			switch {
			case o.variant == winner:
				s.check(o.err == nil, "%s: a writer of the winning payload failed: %v", what, o.err)
			case o.err == nil:
				s.check(!s.contract.DetectsKeyReuse, "%s: a writer of the losing payload got %s, want ErrKeyReused", what, o.res.Status)
			default:
				s.check(errors.Is(o.err, effects.ErrKeyReused), "%s: a writer of the losing payload got %v, want ErrKeyReused", what, o.err)
			}
		}
	}
	s.widened(insts)
}

// invalidKeys applies keys every adapter must refuse before any I/O.
func (s *scene[In]) invalidKeys() {
	f := new(Faults)
	inst := s.open(f)
	before := s.total("before")
	invalid := []struct {
		what string
		key  effects.Key
	}{
		{"empty", ""},
		{"10 KB", effects.Key(strings.Repeat("k", 10<<10))},
		{"one byte over MaxKeyLen", effects.Key(strings.Repeat("k", effects.MaxKeyLen+1))},
		{"NUL byte", "abc\x00def"},
		{"invalid UTF-8", "abc\xff\xfedef"},
		{"newline", "abc\ndef"},
		{"tab", "abc\tdef"},
		{"carriage return", "abc\rdef"},
		{"DEL", "abc\x7fdef"},
		{"C1 control (U+0085)", "abc\u0085def"},
		// Keys some clients trim, merging them with the trimmed key.
		{"leading space", " abcdef"},
		{"trailing space", "abcdef "},
		{"trailing no-break space", "abcdef\u00a0"},
	}
	for _, k := range invalid {
		_, err := s.apply(s.ctx, inst, k.key, s.h.Input(k.key, 0), k.what+" key")
		if s.check(errors.Is(err, effects.ErrInvalidKey), "%s key: got %v, want ErrInvalidKey", k.what, err) {
			s.check(effects.ClassOf(err) != effects.Retryable, "%s key: ErrInvalidKey must not be retryable", k.what)
		}
	}
	s.check(f.RoundTrips() == inst.base, "invalid keys made %d round trips to the backend, want none (validate before any I/O)", f.RoundTrips()-inst.base)
	after := s.total("after")
	s.row.observe(after - before)
	s.check(after == before, "invalid keys wrote %d effects, want 0", after-before)
}

// distinctPair is two valid keys that differ in one way only.
type distinctPair struct {
	why  string
	a, b effects.Key
}

// distinctPairs returns keys under base that an adapter must keep apart:
// ones that differ only after a long common prefix (up to MaxKeyLen),
// only in letter case, only in Unicode normalization, and ones at
// MaxKeyLen.
func distinctPairs(base string) []distinctPair {
	pad := func(n int) string { return (base + strings.Repeat("x", effects.MaxKeyLen))[:n] }
	var out []distinctPair
	for _, l := range []int{40, 48, 64, 100, 128, 200, effects.MaxKeyLen - 1} {
		if l <= len(base) {
			continue
		}
		out = append(out, distinctPair{fmt.Sprintf("only the last byte differs, after a common prefix of %d bytes", l),
			effects.Key(pad(l) + "a"), effects.Key(pad(l) + "b")})
	}
	mid := pad(effects.MaxKeyLen)
	out = append(out,
		distinctPair{fmt.Sprintf("both %d bytes (MaxKeyLen), differing only at byte 128", effects.MaxKeyLen),
			effects.Key(mid[:127] + "A" + mid[128:]), effects.Key(mid[:127] + "B" + mid[128:])},
		distinctPair{"only letter case (ASCII)", effects.Key(base + "Order-7"), effects.Key(base + "order-7")},
		distinctPair{"only letter case (non-ASCII)", effects.Key(base + "\u00c9mile"), effects.Key(base + "\u00e9mile")},
		distinctPair{"only Unicode normalization (NFC vs NFD)", effects.Key(base + "caf\u00e9"), effects.Key(base + "cafe\u0301")},
		// Keys an HTTP adapter merges when it puts them unescaped in a URL
		// path, or a server decodes them twice.
		distinctPair{"a slash, and its percent-escape", effects.Key(base + "a/b"), effects.Key(base + "a%2Fb")},
		distinctPair{"a query mark, and nothing after it", effects.Key(base + "q?x=1"), effects.Key(base + "q")},
		distinctPair{"a fragment mark, and nothing after it", effects.Key(base + "f#x"), effects.Key(base + "f")},
		distinctPair{"a plus, and a space", effects.Key(base + "p+q"), effects.Key(base + "p q")},
		distinctPair{"a no-break space, and a space", effects.Key(base + "n\u00a0m"), effects.Key(base + "n m")},
		distinctPair{"a percent-escape, and what it decodes to", effects.Key(base + "e%41"), effects.Key(base + "eA")},
		distinctPair{"dot segments of a path", effects.Key(base + "d/../e"), effects.Key(base + "e")},
		// Keys whose parts differ only in where a separator falls.
		distinctPair{"NewKey parts differing only in where the separator falls",
			effects.MustKey(strings.TrimSuffix(base, ":"), "a:b", "c"), effects.MustKey(strings.TrimSuffix(base, ":"), "a", "b:c")},
	)
	// Keys whose short hashes collide: a dedup column holding a CRC-32 or
	// an FNV-32 of the key merges them.
	prefix := base + "h-"
	crc := crc32.ChecksumIEEE([]byte(prefix))
	fnv1a, fnv1 := fnvState(prefix, true), fnvState(prefix, false)
	for _, h := range []struct {
		name string
		sum  func(suffix []byte) uint32
	}{
		{"CRC-32", func(x []byte) uint32 { return crc32.Update(crc, crc32.IEEETable, x) }},
		{"FNV-32a", func(x []byte) uint32 { return fnvMore(fnv1a, x, true) }},
		{"FNV-32", func(x []byte) uint32 { return fnvMore(fnv1, x, false) }},
	} {
		if a, b, ok := collision(h.sum); ok {
			out = append(out, distinctPair{"the same " + h.name + " of the key", effects.Key(prefix + a), effects.Key(prefix + b)})
		}
	}
	return out
}

// collisionWidth is the length of the suffixes collision tries: 48 bits
// of a pseudo-random sequence each, so that no structure of the hash
// keeps them apart.
const collisionWidth = 8

// collision finds two suffixes whose sum (of the key they end) is the
// same: a birthday search, which needs about 80,000 tries.
func collision(sum func(suffix []byte) uint32) (a, b string, ok bool) {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	suffix := func(i uint64, buf []byte) []byte {
		z := i*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019 // splitmix64
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		for j := range buf {
			buf[j] = alphabet[z&63]
			z >>= 6
		}
		return buf
	}
	var buf [collisionWidth]byte
	seen := make(map[uint32]uint64, 1<<17)
	for i := range uint64(1 << 20) {
		h := sum(suffix(i, buf[:]))
		if prev, dup := seen[h]; dup {
			var pb [collisionWidth]byte
			return string(suffix(prev, pb[:])), string(suffix(i, buf[:])), true
		}
		seen[h] = i
	}
	return "", "", false
}

// fnvState is the FNV-32 (1a if a) state after s; fnvMore continues it
// over x.
func fnvState(s string, a bool) uint32 { return fnvMore(2166136261, []byte(s), a) }

func fnvMore(h uint32, x []byte, a bool) uint32 {
	const prime = 16777619
	for _, c := range x {
		if a {
			h ^= uint32(c)
			h *= prime
		} else {
			h *= prime
			h ^= uint32(c)
		}
	}
	return h
}

// distinctKeys applies both keys of every distinct pair: each must apply
// once, be counted once, and replay on its own.
func (s *scene[In]) distinctKeys() {
	s.applyDistinct(distinctPairs(string(s.key("distinct")) + ":"))
}

// applyDistinct applies both keys of every pair, a then b: each must
// apply once, be counted once, and replay on its own.
func (s *scene[In]) applyDistinct(pairs []distinctPair) {
	inst := s.open(new(Faults))
	var keys []effects.Key
	first := map[effects.Key]effects.Result{}
	for _, p := range pairs {
		for i, k := range []effects.Key{p.a, p.b} {
			if err := k.Validate(); err != nil {
				panic(fmt.Sprintf("conformance: distinct key %q is invalid: %v", k, err))
			}
			res, err := s.applyUntilDone(inst, k, s.h.Input(k, 0), p.why)
			if err != nil {
				s.fatalf("%s: key %d of the pair (%s) failed: %v: the adapter treats %s and %s as one key", p.why, i+1, shortKey(k), err, shortKey(p.a), shortKey(p.b))
			}
			s.check(res.Status == effects.Applied, "%s: key %d of the pair (%s) returned %s, want applied: the adapter treats %s and %s as one key",
				p.why, i+1, shortKey(k), res.Status, shortKey(p.a), shortKey(p.b))
			first[k] = res
			keys = append(keys, k)
		}
	}
	for i, n := range s.countAll(keys, "distinct keys") {
		s.judge(n, cleanRepeat, true, fmt.Sprintf("distinct key %s", shortKey(keys[i])))
	}
	inst.Close()
	again := s.open(new(Faults))
	for _, k := range keys {
		s.redeliverOn(again, k, first[k], "redelivery of distinct key "+shortKey(k))
	}
	s.notef("%d pairs: %d keys applied once each and replayed", len(pairs), len(keys))
}

// storm applies a fraction of the keys (the warm-up), then replays all of
// them in random order, and counts every key in the backend.
func (s *scene[In]) storm() {
	inst := s.open(new(Faults))
	total := s.cfg.stormKeys
	seen := int(float64(total) * s.cfg.stormSeen)
	keys := make([]effects.Key, total)
	for i := range keys {
		keys[i] = s.key("storm", fmt.Sprint(i))
	}
	exact := s.recordsKeys()
	before := s.total("before the warm-up")
	warm, err := s.applyAll(inst, keys[:seen], "the warm-up")
	if err != nil {
		s.fatalf("applying the %d keys of the warm-up: %v", seen, err)
	}
	afterWarm := s.total("after the warm-up")
	s.check(warm == seen, "warm-up: %d of %d new keys reported applied, want all", warm, seen)
	if exact {
		s.check(afterWarm-before == seen, "warm-up: the backend grew by %d effects for %d new keys, want %d", afterWarm-before, seen, seen)
	} else {
		s.check(afterWarm-before >= seen, "warm-up: the backend grew by %d effects for %d new keys, want at least %d", afterWarm-before, seen, seen)
	}
	order := append([]effects.Key(nil), keys...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	applied, err := s.applyAll(inst, order, "the storm")
	if err != nil {
		s.fatalf("replay storm: %v", err)
	}
	after := s.total("after the storm")
	s.notef("%d keys, %d applied in the warm-up (backend +%d); the storm applied %d, backend +%d", total, seen, afterWarm-before, applied, after-afterWarm)
	if exact {
		s.check(after-afterWarm == total-seen, "storm: the backend grew by %d effects, want %d (only the new keys)", after-afterWarm, total-seen)
		s.check(applied == total-seen, "storm: %d reported applied, want %d (only the new keys)", applied, total-seen)
	} else {
		s.check(after-afterWarm >= total-seen, "storm: the backend grew by %d effects, fewer than the %d new keys", after-afterWarm, total-seen)
	}
	counts := s.countAll(keys, "storm")
	var zero, dup []string
	for i, n := range counts {
		switch {
		case n == 0:
			zero = append(zero, fmt.Sprint(i))
		case n > 1 && exact:
			dup = append(dup, fmt.Sprintf("%d (%d effects)", i, n))
		}
	}
	s.check(len(zero) == 0, "storm: %d of %d keys show no effect in the backend after successful Applies, e.g. keys %s", len(zero), total, firstFew(zero))
	s.check(len(dup) == 0, "storm: %d of %d keys show more than one effect, e.g. keys %s", len(dup), total, firstFew(dup))
	how := "key by key"
	if _, ok := s.h.(BatchCounter); ok {
		how = "in one look (BatchCounter)"
	}
	s.notef("counted all %d keys %s", total, how)
}

func firstFew(xs []string) string {
	if len(xs) > 5 {
		return strings.Join(xs[:5], ", ") + ", ..."
	}
	return strings.Join(xs, ", ")
}

// applyAll applies keys with 8 workers and returns how many reported
// Applied.
func (s *scene[In]) applyAll(inst *instance[In], keys []effects.Key, what string) (int, error) {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		applied  int
		firstErr error
		aborted  bool
		next     = make(chan effects.Key)
	)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				done := false
				s.guard(func() {
					res, err := s.applyUntilDone(inst, k, s.h.Input(k, 0), what)
					mu.Lock()
					defer mu.Unlock()
					if err != nil && firstErr == nil {
						firstErr = fmt.Errorf("key %s: %w", k, err)
					}
					if err == nil && res.Status == effects.Applied {
						applied++
					}
					done = true
				})
				if !done {
					mu.Lock()
					aborted = true
					mu.Unlock()
				}
			}
		}()
	}
	for _, k := range keys {
		next <- k
	}
	close(next)
	wg.Wait()
	if aborted {
		panic(abort{})
	}
	return applied, firstErr
}

// restart applies a key, restarts the backend and redelivers.
func (s *scene[In]) restart() {
	r := s.h.(Restarter)
	inst := s.open(new(Faults))
	key := s.key("restart")
	first := s.applyFirst(inst, key, "first Apply")
	if err := r.Restart(s.ctx); err != nil {
		s.fatalf("harness Restart: %v", err)
	}
	s.redeliverOn(inst, key, first, "redelivery after a backend restart")
	s.expect(key, cleanRepeat, true, "after restart")
}
