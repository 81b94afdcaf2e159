package conformance

import (
	"fmt"
	"time"
)

// planDistinctIDs are event ids that differ only in letter case, in
// Unicode normalization or width, or in an invisible rune: a handler that
// folds or normalises ids runs the second as a replay of the first.
var planDistinctIDs = [][2]string{
	{"Order-7", "order-7"},
	{"\u00c9mile", "\u00e9mile"},
	{"caf\u00e9", "cafe\u0301"},
	{"\uff21\uff22", "AB"},
	{"a\u200bb", "ab"},
	{"stra\u00dfe", "strasse"},
}

// distinctIDs runs events whose ids differ only in case, normalization,
// width or an invisible rune, each pair in both orders: every event must
// do every step once.
func (s *pscene[E]) distinctIDs() {
	inst := s.open()
	defer inst.Close()
	for i, p := range planDistinctIDs {
		for order, pair := range [][2]string{p, {p[1], p[0]}} {
			base := s.id("distinct", fmt.Sprint(i), fmt.Sprint(order))
			for _, suffix := range pair {
				id := base + "-" + suffix
				what := fmt.Sprintf("event %q after %q", id, base+"-"+pair[0])
				s.mustRun(inst, id, what)
				s.counts(id, "", true, what)
			}
		}
	}
	s.notef("%d pairs of ids, in both orders", len(planDistinctIDs))
}

// horizon runs an event, ages every step's backend to just inside the
// plan's declared horizon (or by a long age for one kept until pruned),
// and runs it again on a new instance: every step must replay, none
// apply again.
func (s *pscene[E]) horizon() {
	ager := s.h.(Ager)
	h := s.pc.Contract.Horizon
	inst := s.open()
	id := s.id("horizon")
	first := s.mustRun(inst, id, "a first run")
	inst.Close()
	age := longAge
	what := fmt.Sprintf("a redelivery after aging every step's backend by %s (the plan declares keys kept until pruned)", days(age))
	if h > 0 {
		margin := min(max(h/20, time.Second), time.Minute)
		age = h - margin
		what = fmt.Sprintf("a redelivery after aging every step's backend by %v, %v inside the plan's declared horizon of %v", age, margin, h)
	}
	if err := ager.Age(s.ctx, age); err != nil {
		s.fatalf("harness Age(%v): %v", age, err)
	}
	next := s.open()
	res := s.mustRun(next, id, what)
	next.Close()
	s.replayed(first, res, what)
	s.counts(id, "", true, what)
	for _, st := range s.pc.Steps {
		if sh := st.Contract.Horizon; sh > 0 && (h == 0 || sh < h) {
			s.failf("step %q declares a horizon of %v, shorter than the plan's %v: the plan claims keys kept longer than its weakest step keeps them", st.Step, sh, horizonWord(h))
		}
	}
}

func horizonWord(h time.Duration) string {
	if h == 0 {
		return "kept until pruned"
	}
	return h.String()
}
