package counterexamples_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/conformance/internal/counterexamples"
	"effectively.dev/effects"
)

// fetchLogHarness opens members of one FetchLog of three partitions,
// honest or lying as l builds it. It publishes to an ordering of the
// suite's choice (conformance.OrderingPublisher).
type fetchLogHarness struct{ log *counterexamples.FetchLog }

var _ conformance.OrderingPublisher = fetchLogHarness{}

func fetchLogMaker(l counterexamples.SourceLiar) func(testing.TB) conformance.SourceHarness {
	return func(testing.TB) conformance.SourceHarness { return fetchLogHarness{l.NewLog(3)} }
}

func (h fetchLogHarness) Publish(_ context.Context, n int) ([]string, error) {
	return h.log.Publish(n), nil
}

func (h fetchLogHarness) Orderings() int { return h.log.Partitions() }

func (h fetchLogHarness) PublishTo(_ context.Context, k, n int) ([]string, error) {
	return h.log.PublishTo(k, n), nil
}

func (h fetchLogHarness) Open(context.Context, *conformance.Faults) (conformance.SourceInstance, error) {
	m := h.log.Join()
	return conformance.SourceInstance{Source: m, Close: m.Close, Crash: m.Crash}, nil
}

// drain takes what m hands out within 50 ms of the last delivery.
func drain(m *counterexamples.FetchMember) []effects.Delivery {
	var out []effects.Delivery
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		d, err := m.Next(ctx)
		cancel()
		if err != nil {
			return out
		}
		out = append(out, d)
	}
}

// sourceProbes show each liar's lie directly, without the suite: "" when
// the member behaves (the honest log's answer to every probe).
var sourceProbes = map[string]func(l counterexamples.SourceLiar) string{
	// A fetches ten records of partition 0, takes two and acks neither; B
	// joins and A gets partition 0 back: it must hand out all ten again.
	counterexamples.ResumeAtFetchPosition.Name: func(l counterexamples.SourceLiar) string {
		g := l.NewLog(2)
		g.PublishTo(0, 10)
		a := g.Join()
		ctx := context.Background()
		for range 2 {
			if _, err := a.Next(ctx); err != nil {
				return err.Error()
			}
		}
		g.Join()
		if got := drain(a); len(got) != 10 {
			return fmt.Sprintf("after the rebalance, A handed out %d of the 10 unacked records of the partition it got back", len(got))
		}
		return ""
	},
	// A fetches ten records of partition 1, takes two and acks both; B
	// joins and gets partition 1: it must hand out the eight never handed
	// out.
	counterexamples.CommitFetchedWhenIdle.Name: func(l counterexamples.SourceLiar) string {
		g := l.NewLog(2)
		g.PublishTo(1, 10)
		a := g.Join()
		ctx := context.Background()
		for range 2 {
			d, err := a.Next(ctx)
			if err != nil {
				return err.Error()
			}
			if err := a.Ack(ctx, d); err != nil {
				return err.Error()
			}
		}
		b := g.Join()
		if got := drain(b); len(got) != 8 {
			return fmt.Sprintf("after the rebalance, B got %d of the 8 records A fetched and never handed out", len(got))
		}
		return ""
	},
	// A takes and acks the four records of partition 0, and polls once
	// more (the partition is idle); B joins and A gets partition 0 back:
	// nothing may come back.
	counterexamples.StalledIdleCommit.Name: func(l counterexamples.SourceLiar) string {
		g := l.NewLog(2)
		g.PublishTo(0, 4)
		a := g.Join()
		ctx := context.Background()
		for range 4 {
			d, err := a.Next(ctx)
			if err != nil {
				return err.Error()
			}
			if err := a.Ack(ctx, d); err != nil {
				return err.Error()
			}
		}
		drain(a)
		g.Join()
		if got := drain(a); len(got) != 0 {
			return fmt.Sprintf("after the rebalance, %d acked records of the idle partition came back", len(got))
		}
		return ""
	},
	// A takes the record of partition 1 (attempt 1) and does not ack it;
	// B joins and gets partition 1: its delivery is attempt 2.
	counterexamples.AttemptsLostOnRevoke.Name: func(l counterexamples.SourceLiar) string {
		g := l.NewLog(2)
		g.PublishTo(1, 1)
		a := g.Join()
		first, err := a.Next(context.Background())
		if err != nil {
			return err.Error()
		}
		got := drain(g.Join())
		if len(got) != 1 || got[0].Attempt <= first.Attempt {
			return fmt.Sprintf("after the rebalance, B's deliveries %v of a record first delivered as attempt %d", attempts(got), first.Attempt)
		}
		return ""
	},
}

func attempts(ds []effects.Delivery) []int {
	out := make([]int, len(ds))
	for i, d := range ds {
		out[i] = d.Attempt
	}
	return out
}

// TestRound3SourceProbes: each source liar of round 3 shows its lie
// under its probe, and the honest fetch log shows none under any.
func TestRound3SourceProbes(t *testing.T) {
	if len(counterexamples.SourceLiars) != len(sourceProbes) {
		t.Fatalf("%d liars, %d probes", len(counterexamples.SourceLiars), len(sourceProbes))
	}
	for _, l := range counterexamples.SourceLiars {
		t.Run(l.Name, func(t *testing.T) {
			p := sourceProbes[l.Name]
			if p == nil {
				t.Fatalf("no probe for %s", l.Name)
			}
			lie := p(l)
			if lie == "" {
				t.Fatalf("the probe shows no lie")
			}
			t.Logf("the lie: %s", lie)
			if got := p(counterexamples.HonestFetchLog); got != "" {
				t.Errorf("%s fails the probe: %s", counterexamples.HonestFetchLog.Name, got)
			}
		})
	}
}

// TestRound3SourcesCaught: each source liar of round 3 fails
// rebalance-full-buffers and no scenario of the first source suite but
// revocation, which checks Attempt on the deliveries a rebalance moved;
// the honest fetch log passes every scenario.
func TestRound3SourcesCaught(t *testing.T) {
	opts := []conformance.SourceOption{conformance.WithRedeliveryWait(2 * time.Second), conformance.WithSourceBacklog(2 * counterexamples.FetchAhead)}
	also := map[string][]string{
		// The revoke callback erases the counts of every rebalance,
		// revocation's included.
		counterexamples.AttemptsLostOnRevoke.Name: {conformance.SourceRevocation},
	}
	for _, l := range counterexamples.SourceLiars {
		t.Run(l.Name, func(t *testing.T) {
			rep := conformance.RunSource(t, "round3/"+l.Name, fetchLogMaker(l), append(opts, conformance.ReportOnly())...)
			row, _ := rep.Row(conformance.SourceRebalanceFullBuffers)
			if row.Verdict != conformance.Fail {
				t.Fatalf("%s: %s, want FAIL (notes %v)", conformance.SourceRebalanceFullBuffers, row.Verdict, row.Notes)
			}
			t.Logf("caught by %s: %s", conformance.SourceRebalanceFullBuffers, firstLine(row.Failures))
			for _, s := range rep.Failed() {
				if s != conformance.SourceRebalanceFullBuffers && !slices.Contains(also[l.Name], s) {
					row, _ := rep.Row(s)
					t.Errorf("%s failed too: %s", s, firstLine(row.Failures))
				}
			}
		})
	}
	t.Run("control/"+counterexamples.HonestFetchLog.Name, func(t *testing.T) {
		rep := conformance.RunSource(t, "round3/"+counterexamples.HonestFetchLog.Name, fetchLogMaker(counterexamples.HonestFetchLog), opts...)
		for _, row := range rep.Rows {
			want := conformance.Pass
			if row.Scenario == conformance.SourceReleased {
				want = conformance.NotRun // no Release
			}
			if row.Verdict != want {
				t.Errorf("%s: %s %v, want %s", row.Scenario, row.Verdict, row.Failures, want)
			}
		}
	})
}
