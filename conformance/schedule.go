package conformance

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"

	"effectively.dev/effects"
)

// defaultSchedules is how many generated fault schedules the
// fault-schedules scenario runs ([WithSchedules]): sized for CI.
const defaultSchedules = 8

// maxScheduleFaults bounds the faults of one generated schedule.
const maxScheduleFaults = 4

// faultStep is one faulted attempt of a schedule: the attempt suffers
// Kind at its round trip Trip (counted from 1 after the attempt starts),
// answering Code for an application fault, on a new instance when Fresh
// (the instance of the attempt before is closed: a successor process),
// else on the instance of the attempt before (a process that survived
// and retries).
type faultStep struct {
	Trip  int
	Kind  FaultKind
	Code  string
	Fresh bool
}

func (f faultStep) String() string {
	kind := f.Kind.String()
	if f.Kind == AppErrorBefore || f.Kind == AppErrorAfter {
		kind += " " + f.Code
	}
	where := "same instance"
	if f.Fresh {
		where = "new instance"
	}
	return fmt.Sprintf("%s at trip %d (%s)", kind, f.Trip, where)
}

// schedule is a generated fault schedule for one key: attempt i suffers
// Steps[i], and clean attempts follow until the key is done.
type schedule struct {
	Seed  uint64
	Steps []faultStep
}

func (s schedule) String() string {
	parts := make([]string, len(s.Steps))
	for i, st := range s.Steps {
		parts[i] = fmt.Sprintf("attempt %d: %s", i+1, st)
	}
	return fmt.Sprintf("seed %d: [%s]", s.Seed, strings.Join(parts, "; "))
}

// faultMenu is what schedules draw from: the kinds, the application
// error codes, and the round trips of one attempt.
type faultMenu struct {
	kinds []FaultKind
	codes []string
	trips int // round trips of a clean Apply: faults land in 1..trips+1
}

// defaultMenu returns the kinds every schedule may use: the network
// faults, slow replies when asked for, and the application faults.
func defaultMenu(trips int, slowReply bool, codes []string) faultMenu {
	kinds := []FaultKind{DropReply, CutRequest, CancelAfterSend, AppErrorBefore, AppErrorAfter}
	if slowReply {
		kinds = append(kinds, SlowReply)
	}
	if len(codes) == 0 {
		codes = append(append([]string(nil), SQLAppCodes...), HTTPAppCodes...)
	}
	return faultMenu{kinds: kinds, codes: codes, trips: trips}
}

// genSchedule draws a schedule of 2 to maxScheduleFaults faults from
// menu, reproducibly from seed.
func genSchedule(seed uint64, menu faultMenu) schedule {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	n := 2 + rng.IntN(maxScheduleFaults-1)
	s := schedule{Seed: seed, Steps: make([]faultStep, n)}
	for i := range s.Steps {
		st := faultStep{
			Kind:  menu.kinds[rng.IntN(len(menu.kinds))],
			Trip:  1 + rng.IntN(max(menu.trips, 1)),
			Fresh: rng.IntN(3) == 0,
		}
		if st.Kind == AppErrorBefore || st.Kind == AppErrorAfter {
			st.Code = menu.codes[rng.IntN(len(menu.codes))]
			if st.Kind == AppErrorAfter && !afterApply(st.Code) {
				// Only a server error comes after the work was done; a
				// database's refusal comes before.
				st.Kind = AppErrorBefore
			}
		}
		s.Steps[i] = st
	}
	return s
}

// shrinkSchedule returns the smallest schedule it finds that still fails
// (fails reports the failure, "" for a pass), with its failure: it drops
// steps one at a time, then lowers trip numbers and turns new instances
// into the same one, keeping each change that still fails, until no
// change does. budget bounds the runs of fails.
func shrinkSchedule(s schedule, failure string, budget int, fails func(schedule) string) (schedule, string) {
	try := func(c schedule) bool {
		if budget <= 0 {
			return false
		}
		budget--
		if msg := fails(c); msg != "" {
			s, failure = c, msg
			return true
		}
		return false
	}
	for changed := true; changed && budget > 0; {
		changed = false
		for i := 0; i < len(s.Steps) && len(s.Steps) > 1; i++ {
			c := s.clone()
			c.Steps = append(c.Steps[:i], c.Steps[i+1:]...)
			if try(c) {
				changed = true
				i--
			}
		}
		for i := range s.Steps {
			for s.Steps[i].Trip > 1 {
				c := s.clone()
				c.Steps[i].Trip--
				if !try(c) {
					break
				}
				changed = true
			}
			if s.Steps[i].Fresh {
				c := s.clone()
				c.Steps[i].Fresh = false
				if try(c) {
					changed = true
				}
			}
		}
	}
	return s, failure
}

func (s schedule) clone() schedule {
	return schedule{Seed: s.Seed, Steps: append([]faultStep(nil), s.Steps...)}
}

// attemptRecord is one attempt of a schedule's history: the fault it
// suffered (Kind NoFault for a clean attempt), whether it fired, what
// Apply returned, and the key's count in the backend before and after.
type attemptRecord struct {
	step          faultStep
	fired         bool
	res           effects.Result
	err           error
	before, after int
}

// judgeHistory holds a schedule's history of one key to the contract c:
// every error retryable, ErrTransient leaving the backend as it was, a
// success showing its effect, every success after the first replaying its
// ref, and the final count within the contract. It returns the failures.
func judgeHistory(c effects.Contract, hist []attemptRecord, final int) []string {
	var out []string
	recordsKeys := c.Guarantee == effects.EffectivelyOnce || c.DuplicateWindow.Trigger != effects.AnyRedelivery
	unknown, succeeded := false, false
	var first *attemptRecord
	for i := range hist {
		a := &hist[i]
		what := fmt.Sprintf("attempt %d", i+1)
		if a.step.Kind != NoFault {
			what += fmt.Sprintf(" (%s, %s)", a.step, firedWord(a.fired))
		}
		switch {
		case a.err == nil:
			succeeded = true
			if a.after < 1 {
				out = append(out, fmt.Sprintf("%s: Apply returned %s with no error, but the backend shows no effect", what, a.res.Status))
			}
			if first == nil {
				first = a
				break
			}
			if recordsKeys && (a.res.Status != effects.Replayed || a.res.Ref != first.res.Ref) {
				out = append(out, fmt.Sprintf("%s: returned (%s, ref %q) after an earlier success (%s, ref %q), want a replay of it", what, a.res.Status, a.res.Ref, first.res.Status, first.res.Ref))
			}
		case effects.ClassOf(a.err) != effects.Retryable:
			out = append(out, fmt.Sprintf("%s: Apply returned an error that is not retryable (effects.ClassOf), so a consumer would give up on a key it may have applied: %v", what, a.err))
		case errors.Is(a.err, effects.ErrTransient):
			if a.after != a.before {
				out = append(out, fmt.Sprintf("%s: returned ErrTransient, which promises that nothing was applied, but the backend went from %d to %d effects: %v", what, a.before, a.after, a.err))
			}
		default:
			unknown = true
		}
	}
	if !succeeded {
		out = append(out, "no attempt succeeded")
	}
	switch {
	case succeeded && final == 0:
		out = append(out, "0 effects in the backend after a successful Apply")
	case c.Guarantee == effects.EffectivelyOnce && final > 1:
		out = append(out, fmt.Sprintf("%d effects for one key, contract says effectively-once", final))
	case final > 1 && !(c.DuplicateWindow.Trigger == effects.AnyRedelivery || unknown && c.DuplicateWindow.Trigger == effects.AfterUnknownOutcome):
		out = append(out, fmt.Sprintf("%d effects for one key without an unknown outcome, outside the declared window (%s)", final, c.DuplicateWindow.Trigger))
	}
	return out
}

func firedWord(fired bool) string {
	if fired {
		return "fired"
	}
	return "did not fire"
}
