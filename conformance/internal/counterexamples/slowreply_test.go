package counterexamples_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/conformance"
	"effectively.dev/conformance/internal/counterexamples"
	"effectively.dev/effects"
)

// TestSlowReplyCatchesOwnDeadline: an adapter on pgx that reports its own
// deadline as ErrTransient is caught by slow-reply, which holds each reply
// past that deadline; the same adapter reporting an unknown outcome (the
// control) passes.
func TestSlowReplyCatchesOwnDeadline(t *testing.T) {
	for _, tc := range []struct {
		name string
		lie  bool
		want conformance.Verdict
	}{
		{"its own deadline as ErrTransient", true, conformance.Fail},
		{"control: its own deadline as an unknown outcome", false, conformance.Pass},
	} {
		t.Run(tc.name, func(t *testing.T) {
			build := func(_ context.Context, p *pgxpool.Pool) effects.Effect[counterexamples.Payment] {
				return counterexamples.OwnDeadline{DB: p, Timeout: 250 * time.Millisecond, Lie: tc.lie}
			}
			rep := conformance.Run(t, "own deadline: "+tc.name, maker(build),
				conformance.Only(conformance.ScenarioSlowReply), conformance.WithSlowReply(750*time.Millisecond), conformance.ReportOnly())
			row, _ := rep.Row(conformance.ScenarioSlowReply)
			if row.Verdict != tc.want {
				t.Fatalf("slow-reply: %s %v (%s), want %s", row.Verdict, row.Failures, row.Skipped, tc.want)
			}
			if tc.lie && !strings.Contains(strings.Join(row.Failures, "\n"), "promises that nothing was applied") {
				t.Errorf("slow-reply failures %v: want the ErrTransient's broken promise named", row.Failures)
			}
		})
	}
}
