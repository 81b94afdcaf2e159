package torture_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/internal/torture"
)

// cleanHistory is a history of three events that an effectively-once
// worker could have left: evt-1 was produced twice (partition 0 offset 0
// and partition 1 offset 1), each event's ledger row committed before the
// commit request that covered its records, one output record each.
func cleanHistory() *torture.History {
	const scope = "s"
	t0 := time.Date(2024, 9, 17, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	key := func(id, step string) string { return string(effects.MustKey(scope, id, step)) }
	return &torture.History{
		Scope: scope,
		Sent:  map[string]int64{"evt-1": 100, "evt-2": 200, "evt-3": 300},
		Input: []torture.InputRecord{
			{Partition: 0, Offset: 0, EventID: "evt-1"},
			{Partition: 0, Offset: 1, EventID: "evt-2"},
			{Partition: 1, Offset: 0, EventID: "evt-3"},
			{Partition: 1, Offset: 1, EventID: "evt-1"},
		},
		Commits: []torture.CommitRequest{
			{At: at(10), Partition: 0, Offset: 1},
			{At: at(20), Partition: 1, Offset: 1},
			{At: at(30), Partition: 0, Offset: 2},
			{At: at(40), Partition: 1, Offset: 2},
		},
		Committed: map[int32]int64{0: 2, 1: 2},
		Ledger: []torture.LedgerRow{
			{ID: "1", EventID: "evt-1", Cents: 100, CommittedAt: at(5)},
			{ID: "2", EventID: "evt-2", Cents: 200, CommittedAt: at(25)},
			{ID: "3", EventID: "evt-3", Cents: 300, CommittedAt: at(15)},
		},
		Keys: map[string]bool{key("evt-1", torture.StepLedger): true, key("evt-2", torture.StepLedger): true, key("evt-3", torture.StepLedger): true},
		Output: []torture.OutputRecord{
			{Partition: 0, Offset: 0, EventID: "evt-1", LedgerEntry: "1", Cents: 100},
			{Partition: 1, Offset: 0, EventID: "evt-3", LedgerEntry: "3", Cents: 300},
			{Partition: 2, Offset: 0, EventID: "evt-2", LedgerEntry: "2", Cents: 200},
		},
		Journal: map[string]torture.JournalRow{
			key("evt-1", torture.StepOutput): {Done: true, Ref: "0/0", Attempt: 1},
			key("evt-2", torture.StepOutput): {Done: true, Ref: "2/0", Attempt: 1},
			key("evt-3", torture.StepOutput): {Done: true, Ref: "1/0", Attempt: 1},
		},
	}
}

// TestCheck holds the checker to its rules on hand-made histories: a
// clean one passes, and each kind of damage is reported under its name. A
// checker that cannot fail is untested; the torture's negative control
// shows the same on a real run.
func TestCheck(t *testing.T) {
	key := func(id, step string) string { return string(effects.MustKey("s", id, step)) }
	later := time.Date(2024, 9, 17, 13, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		damage func(h *torture.History)
		want   func(v *torture.Verdict) int // the count the damage must raise
		names  []string                     // violations that must be listed; none for a clean history
	}{
		{"clean history", func(*torture.History) {}, nil, nil},
		{"acked event without ledger row is lost", func(h *torture.History) {
			h.Ledger = slices.Delete(h.Ledger, 1, 2) // evt-2's
			delete(h.Keys, key("evt-2", torture.StepLedger))
		}, func(v *torture.Verdict) int { return v.Lost }, []string{"lost", "ack before commit"}},
		{"unacked event with an output but no ledger row is lost", func(h *torture.History) {
			h.Commits = []torture.CommitRequest{h.Commits[0], h.Commits[2]} // partition 0 only
			h.Committed[1] = 0
			h.Ledger = h.Ledger[:2] // not evt-3's
			delete(h.Keys, key("evt-3", torture.StepLedger))
		}, func(v *torture.Verdict) int { return v.Lost }, []string{"lost", "undrained"}},
		{"two ledger rows are a duplicate", func(h *torture.History) {
			h.Ledger = append(h.Ledger, torture.LedgerRow{ID: "4", EventID: "evt-1", Cents: 100, CommittedAt: later})
		}, func(v *torture.Verdict) int { return v.Duplicated }, []string{"duplicated"}},
		{"ledger row without its dedup row", func(h *torture.History) {
			delete(h.Keys, key("evt-2", torture.StepLedger))
		}, func(v *torture.Verdict) int { return v.EffectWithoutKey }, []string{"effect without dedup row"}},
		{"dedup row without a ledger row", func(h *torture.History) {
			h.Sent["evt-4"] = 400
			h.Keys[key("evt-4", torture.StepLedger)] = true
		}, func(v *torture.Verdict) int { return v.KeyWithoutEffect }, []string{"dedup row without effect"}},
		{"offset committed before the ledger row", func(h *torture.History) {
			h.Ledger[1].CommittedAt = later // evt-2's offset was committed at 30 ms
		}, func(v *torture.Verdict) int { return v.AckBeforeCommit }, []string{"ack before commit"}},
		{"the first commit request past an effect decides, not a later one", func(h *torture.History) {
			early := torture.CommitRequest{At: h.Commits[0].At.Add(2 * time.Millisecond), Partition: 0, Offset: 2} // before evt-2's ledger row
			h.Commits = slices.Insert(h.Commits, 1, early)
		}, func(v *torture.Verdict) int { return v.AckBeforeCommit }, []string{"ack before commit"}},
		{"ledger row for an event never sent", func(h *torture.History) {
			h.Ledger = append(h.Ledger, torture.LedgerRow{ID: "9", EventID: "evt-ghost", Cents: 1, CommittedAt: later})
		}, func(v *torture.Verdict) int { return v.Unexpected }, []string{"unexpected effect"}},
		{"ledger row with another amount", func(h *torture.History) {
			h.Ledger[2].Cents = 301
		}, func(v *torture.Verdict) int { return v.WrongPayload }, []string{"wrong payload"}},
		{"acked event without output", func(h *torture.History) {
			h.Output = h.Output[:2]
		}, func(v *torture.Verdict) int { return v.LostOutput }, []string{"lost output", "journal mismatch"}},
		{"output duplicate after an attempt with an unknown outcome is allowed", func(h *torture.History) {
			h.Output = append(h.Output, torture.OutputRecord{Partition: 0, Offset: 1, EventID: "evt-1", LedgerEntry: "1", Cents: 100})
			h.Journal[key("evt-1", torture.StepOutput)] = torture.JournalRow{Done: true, Ref: "0/1", Attempt: 2}
		}, func(v *torture.Verdict) int { return v.OutputDuplicates }, nil},
		{"output duplicate within one journal attempt", func(h *torture.History) {
			h.Output = append(h.Output, torture.OutputRecord{Partition: 0, Offset: 1, EventID: "evt-1", LedgerEntry: "1", Cents: 100})
		}, func(v *torture.Verdict) int { return v.OutputOutsideWindow }, []string{"output duplicate outside window"}},
		{"output duplicate the journal does not name", func(h *torture.History) {
			h.Output = append(h.Output, torture.OutputRecord{Partition: 0, Offset: 1, EventID: "evt-1", LedgerEntry: "1", Cents: 100})
			h.Journal[key("evt-1", torture.StepOutput)] = torture.JournalRow{Done: true, Ref: "7/7", Attempt: 3}
		}, func(v *torture.Verdict) int { return v.OutputOutsideWindow }, []string{"output duplicate outside window", "journal mismatch"}},
		{"output naming another ledger row", func(h *torture.History) {
			h.Output[1].LedgerEntry = "1"
		}, func(v *torture.Verdict) int { return v.OutputMismatch }, []string{"output mismatch"}},
		{"output for an event never sent", func(h *torture.History) {
			h.Output = append(h.Output, torture.OutputRecord{Partition: 2, Offset: 1, EventID: "evt-ghost"})
		}, func(v *torture.Verdict) int { return v.OutputMismatch }, []string{"output mismatch"}},
		{"acked event whose sent-record is not done", func(h *torture.History) {
			h.Journal[key("evt-3", torture.StepOutput)] = torture.JournalRow{Attempt: 1}
		}, func(v *torture.Verdict) int { return v.JournalMismatch }, []string{"journal mismatch"}},
		{"records past the committed offset", func(h *torture.History) {
			h.Committed[1] = 1
		}, func(v *torture.Verdict) int { return v.Undrained }, []string{"undrained"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := cleanHistory()
			tt.damage(h)
			v := torture.Check(h)
			got := v.Violations()
			if tt.want != nil && tt.want(v) != 1 {
				t.Errorf("count = %d, want 1; verdict: %s", tt.want(v), v)
			}
			if len(got) != len(tt.names) {
				t.Errorf("violations %q, want exactly %q", got, tt.names)
			}
			for _, n := range tt.names {
				if !strings.Contains(strings.Join(got, "\n"), n+":") {
					t.Errorf("violations %q do not name %q", got, n)
				}
			}
		})
	}
}

// TestCheckCommits: the commit checker passes a clean history and catches
// each fault it exists for, on hand-made histories.
func TestCheckCommits(t *testing.T) {
	t0 := time.Date(2024, 9, 17, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	req := func(ms int, p int32, o int64, m string) torture.CommitRequest {
		return torture.CommitRequest{At: at(ms), Partition: p, Offset: o, Member: m, Generation: 1}
	}
	app := func(ms int, p int32, o int64) torture.AppliedCommit {
		return torture.AppliedCommit{At: at(ms), Partition: p, Offset: o}
	}
	requests := []torture.CommitRequest{req(10, 0, 5, "a"), req(20, 0, 9, "a"), req(30, 1, 3, "b"), req(40, 0, 9, "zombie")}
	applied := []torture.AppliedCommit{app(11, 0, 5), app(21, 0, 9), app(31, 1, 3)}
	dropped := map[string]time.Time{"zombie": at(35)}
	for _, tc := range []struct {
		name    string
		applied []torture.AppliedCommit
		extra   []torture.CommitRequest // requests beside the shared ones
		want    string                  // a violation's name; "" for none
	}{
		{"clean (the zombie's request was refused)", applied, nil, ""},
		{"backwards", append(slices.Clone(applied), app(32, 0, 5)), []torture.CommitRequest{req(31, 0, 5, "a")}, "offset moved backwards"},
		{"zombie applied", append(slices.Clone(applied), app(41, 0, 9)), nil, "zombie commit applied"},
		{"a zombie's request refused between a live request and its apply", []torture.AppliedCommit{app(11, 0, 5), app(42, 0, 12)},
			[]torture.CommitRequest{req(38, 0, 12, "a"), req(39, 0, 12, "zombie")}, ""},
		{"a request applied twice", append(slices.Clone(applied), app(22, 0, 9)), nil, "applied commit without a request"},
		{"no request", append(slices.Clone(applied), app(50, 1, 7)), nil, "applied commit without a request"},
		{"applied before its request", []torture.AppliedCommit{app(5, 0, 5)}, nil, "applied commit without a request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqs := append(slices.Clone(requests), tc.extra...)
			v := torture.CheckCommits(reqs, tc.applied, dropped)
			if want := 1 + len(slices.DeleteFunc(slices.Clone(tc.extra), func(r torture.CommitRequest) bool { return r.Member != "zombie" })); v.ZombieRequests != want {
				t.Errorf("ZombieRequests %d, want %d (the zombie's requests)", v.ZombieRequests, want)
			}
			vs := v.Violations()
			switch {
			case tc.want == "" && len(vs) > 0:
				t.Errorf("clean history: %v", vs)
			case tc.want != "" && (len(vs) != 1 || !strings.HasPrefix(vs[0], tc.want)):
				t.Errorf("violations %v, want exactly %q", vs, tc.want)
			}
		})
	}
}
