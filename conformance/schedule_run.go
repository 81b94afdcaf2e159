package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
)

// AppFaultCodes is implemented by a Harness that says which application
// errors its backend can answer with (see [AppError]): the generated
// schedules and the app-fault sweep draw their codes from it. Without it,
// they draw from [SQLAppCodes] and [HTTPAppCodes].
type AppFaultCodes interface {
	AppFaultCodes() []string
}

// faultSchedules runs cfg.schedules generated schedules, each several
// faults on one key, and judges each history against the contract. A
// failing schedule is shrunk to the shortest that still fails, and the
// failure names its seed, so that WithScheduleSeed reruns it.
func (s *scene[In]) faultSchedules() {
	trips := s.cleanTrips()
	var codes []string
	if ac, ok := s.h.(AppFaultCodes); ok {
		codes = ac.AppFaultCodes()
	}
	menu := defaultMenu(min(trips, s.cfg.maxSweep), s.cfg.slowReplySet, codes)
	seed := s.cfg.gen.scheduleSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	n := s.cfg.gen.scheduleCount()
	s.notef("%d generated schedules of 2 to %d faults on one key each, from seed %d (a failing one is shrunk and printed with its seed)", n, maxScheduleFaults, seed)
	fired := 0
	for i := range n {
		sc := genSchedule(seed+uint64(i), menu)
		msg, f := s.runSchedule(sc, fmt.Sprint(i))
		fired += f
		if msg == "" {
			continue
		}
		run := 0
		small, smallMsg := shrinkSchedule(sc, msg, 24, func(c schedule) string {
			run++
			m, _ := s.runSchedule(c, fmt.Sprintf("%d-shrink-%d", i, run))
			return m
		})
		s.failf("generated schedule failed (rerun it alone with conformance.WithScheduleSeed(%d), conformance.WithSchedules(1)): %s\n  shortest failing schedule: %s\n  its failure: %s",
			sc.Seed, msg, small, smallMsg)
		return
	}
	s.check(fired > 0, "none of the %d schedules' faults fired: the adapter's round trips do not reach the harness's Faults", n)
	s.notef("%d faults fired", fired)
}

// cleanTrips counts the round trips of a clean Apply of a new key.
func (s *scene[In]) cleanTrips() int {
	inst := s.open(new(Faults))
	defer inst.Close()
	key := s.key("sched", "clean")
	if _, err := s.applyUntilDone(inst, key, s.h.Input(key, 0), "the clean Apply that counts round trips"); err != nil {
		s.fatalf("clean Apply: %v", err)
	}
	trips := inst.f.RoundTrips() - inst.base
	if trips == 0 {
		s.skip("the adapter made no round trip through the harness's Faults after Make returned")
	}
	return trips
}

// runSchedule applies a new key under sc and returns the failures of its
// history ("" when it kept the contract) and how many faults fired.
func (s *scene[In]) runSchedule(sc schedule, tag string) (string, int) {
	key := s.key("sched", tag)
	in := s.h.Input(key, 0)
	var hist []attemptRecord
	var insts []*instance[In]
	defer func() {
		for _, i := range insts {
			i.Close()
		}
	}()
	open := func() *instance[In] {
		i := s.open(new(Faults))
		insts = append(insts, i)
		return i
	}
	inst := open()
	fired := 0
	for i, st := range sc.Steps {
		if st.Fresh && i > 0 {
			inst.Close()
			inst = open()
		}
		if i > 0 && unknownOutcomeErr(hist[i-1].err) {
			// A request whose outcome is unknown may still be on its way to
			// the backend: let it land before this attempt is judged.
			s.quiet()
		}
		before := s.peek(key, "schedule "+sc.String())
		actx, cancel := context.WithCancel(s.ctx)
		inst.f.SetSlowReply(s.cfg.slowReply)
		inst.f.SetAppError(st.Code)
		inst.f.Arm(inst.f.RoundTrips()+st.Trip, st.Kind, cancel)
		res, err := s.apply(actx, inst, key, in, fmt.Sprintf("attempt %d of schedule %s", i+1, sc))
		cancel()
		ok := inst.f.Fired()
		inst.f.Disarm()
		if ok {
			fired++
		}
		hist = append(hist, attemptRecord{step: st, fired: ok, res: res, err: err, before: before, after: s.peek(key, "schedule")})
		if err != nil && effects.ClassOf(err) != effects.Retryable {
			break
		}
	}
	// Clean attempts until the key is done, on the last instance.
	deadline := time.Now().Add(s.cfg.retryFor)
	for !succeededIn(hist) && time.Now().Before(deadline) && s.ctx.Err() == nil {
		before := s.peek(key, "schedule")
		res, err := s.apply(s.ctx, inst, key, in, "a clean attempt of schedule "+sc.String())
		hist = append(hist, attemptRecord{res: res, err: err, before: before, after: s.peek(key, "schedule")})
		if err != nil && effects.ClassOf(err) != effects.Retryable {
			break
		}
		if err != nil && retry.Sleep(s.ctx, 20*time.Millisecond) != nil {
			break
		}
	}
	// One redelivery on a new instance, as a broker would after the ack.
	if succeededIn(hist) {
		again := open()
		before := s.peek(key, "schedule")
		res, err := s.apply(s.ctx, again, key, in, "a redelivery after schedule "+sc.String())
		hist = append(hist, attemptRecord{res: res, err: err, before: before, after: s.peek(key, "schedule")})
	}
	s.quiet()
	final := s.peek(key, "after schedule "+sc.String())
	s.row.observe(final)
	fails := judgeHistory(s.contract, hist, final)
	if len(fails) == 0 {
		return "", fired
	}
	return strings.Join(fails, "; "), fired
}

// unknownOutcomeErr reports whether err left the outcome unknown: a
// retryable error other than ErrTransient.
func unknownOutcomeErr(err error) bool {
	return err != nil && effects.ClassOf(err) == effects.Retryable && !errors.Is(err, effects.ErrTransient)
}

func succeededIn(hist []attemptRecord) bool {
	for _, a := range hist {
		if a.err == nil {
			return true
		}
	}
	return false
}
