package conformance

import (
	"errors"
	"strings"
	"testing"

	"effectively.dev/effects"
)

// TestGenScheduleReproducible: one seed makes one schedule, of 2 to
// maxScheduleFaults faults within the menu; many seeds draw every kind.
func TestGenScheduleReproducible(t *testing.T) {
	menu := defaultMenu(5, true, nil)
	kinds := map[FaultKind]bool{}
	for seed := uint64(1); seed <= 200; seed++ {
		a, b := genSchedule(seed, menu), genSchedule(seed, menu)
		if a.String() != b.String() {
			t.Fatalf("seed %d: %s, then %s", seed, a, b)
		}
		if n := len(a.Steps); n < 2 || n > maxScheduleFaults {
			t.Errorf("seed %d: %d faults", seed, n)
		}
		for _, st := range a.Steps {
			kinds[st.Kind] = true
			if st.Trip < 1 || st.Trip > 5 {
				t.Errorf("seed %d: trip %d outside 1..5", seed, st.Trip)
			}
			if (st.Kind == AppErrorBefore || st.Kind == AppErrorAfter) != (st.Code != "") {
				t.Errorf("seed %d: %s", seed, st)
			}
		}
	}
	for _, k := range menu.kinds {
		if !kinds[k] {
			t.Errorf("200 seeds never drew %s", k)
		}
	}
	if !strings.Contains(genSchedule(42, menu).String(), "seed 42") {
		t.Errorf("a schedule does not print its seed: %s", genSchedule(42, menu))
	}
}

// TestShrinkSchedule: shrinking keeps only what the failure needs: the
// fault that causes it, at the lowest trip, on the same instance.
func TestShrinkSchedule(t *testing.T) {
	s := schedule{Seed: 9, Steps: []faultStep{
		{Trip: 4, Kind: CutRequest, Fresh: true},
		{Trip: 3, Kind: DropReply, Fresh: true},
		{Trip: 5, Kind: AppErrorAfter, Code: "500", Fresh: true},
		{Trip: 2, Kind: CancelAfterSend},
	}}
	// Fails when a DropReply at trip >= 2 happens anywhere.
	fails := func(c schedule) string {
		for _, st := range c.Steps {
			if st.Kind == DropReply && st.Trip >= 2 {
				return "lost"
			}
		}
		return ""
	}
	got, msg := shrinkSchedule(s, "lost", 100, fails)
	if msg != "lost" || len(got.Steps) != 1 || got.Steps[0] != (faultStep{Trip: 2, Kind: DropReply}) {
		t.Errorf("shrunk to %s (%q), want one drop reply at trip 2 on the same instance", got, msg)
	}
	if got.Seed != 9 {
		t.Errorf("the shrunk schedule lost its seed: %s", got)
	}
	// A budget of 0 runs nothing and returns the schedule as it was.
	if got, _ := shrinkSchedule(s, "lost", 0, fails); len(got.Steps) != 4 {
		t.Errorf("budget 0 shrank to %s", got)
	}
}

// TestJudgeHistory: the checker's verdicts on histories of one key.
func TestJudgeHistory(t *testing.T) {
	once := effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "x"}
	alo := effects.Contract{Guarantee: effects.AtLeastOnce, Enforcer: "x", DuplicateWindow: effects.Window{Trigger: effects.AfterUnknownOutcome, Between: "a and b"}}
	drop := faultStep{Trip: 1, Kind: DropReply}
	applied := effects.Result{Status: effects.Applied, Ref: "r1"}
	replayed := effects.Result{Status: effects.Replayed, Ref: "r1"}
	amb := effects.Ambiguous("t", "k", errors.New("lost"))
	trans := effects.Transient("t", "k", errors.New("busy"))
	perm := effects.Refused("t", "k", errors.New("no"))
	cases := []struct {
		name  string
		c     effects.Contract
		hist  []attemptRecord
		final int
		want  string // "" for no failure
	}{
		{"lost then replayed", once, []attemptRecord{{step: drop, fired: true, err: amb, after: 1}, {res: replayed, before: 1, after: 1}}, 1, ""},
		{"transient that applied", once, []attemptRecord{{step: drop, fired: true, err: trans, after: 1}, {res: replayed, before: 1, after: 1}}, 1, "promises that nothing was applied"},
		{"permanent", once, []attemptRecord{{step: drop, fired: true, err: perm}}, 0, "is not retryable"},
		{"two effects", once, []attemptRecord{{step: drop, fired: true, err: amb, after: 1}, {res: applied, before: 1, after: 2}}, 2, "contract says effectively-once"},
		{"second success applies again", once, []attemptRecord{{res: applied, after: 1}, {res: effects.Result{Status: effects.Applied, Ref: "r2"}, before: 1, after: 1}}, 1, "want a replay"},
		{"success without effect", once, []attemptRecord{{res: applied}}, 0, "shows no effect"},
		{"at-least-once after unknown", alo, []attemptRecord{{step: drop, fired: true, err: amb, after: 1}, {res: applied, before: 1, after: 2}}, 2, ""},
		{"at-least-once without unknown", alo, []attemptRecord{{res: applied, after: 1}, {res: replayed, before: 1, after: 2}}, 2, "outside the declared window"},
		{"never succeeded", once, []attemptRecord{{err: amb}}, 0, "no attempt succeeded"},
	}
	for _, c := range cases {
		got := strings.Join(judgeHistory(c.c, c.hist, c.final), "; ")
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
