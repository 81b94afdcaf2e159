// Package torture holds the SIGKILL torture test: the chargehook worker
// (internal/cmd/chargehook-worker) runs as a separate process against a kfake
// cluster and a PostgreSQL database that outlive it, and is killed with
// SIGKILL at seeded random points, dozens of times, while it claims keys,
// commits ledger rows, writes journal records, produces output records and
// commits offsets. After the last restart drains the input, a history
// checker ([Check]) reads the backends and the broker's record of every
// offset commit and says whether anything was lost, done twice, or acked
// before it was done.
//
// The package's non-test code is the checker, so that its rules can be read
// (and tested on hand-made histories) apart from the machinery that runs
// the worker.
//
// The day-two torture (a worker fleet meeting declines, panics, poison,
// configuration faults, a hung SMTP server and a crash mid-send) has its
// own checker, [CheckDayTwo].
package torture

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"effectively.dev/effects"
)

// Step names of the worker's plan (internal/cmd/chargehook-worker); they are part of
// the keys the checker looks up. Should they drift, every ledger row shows
// up as an effect without its dedup row.
const (
	StepLedger = "ledger"
	StepOutput = "charged-event"
)

// History is what a torture run left in the backends, and what the broker
// saw during it.
type History struct {
	// Scope is the worker's key scope.
	Scope string
	// Sent maps every event the test produced to its amount.
	Sent map[string]int64
	// Input is every record of the input topic.
	Input []InputRecord
	// Commits is every OffsetCommit request of the worker's group the
	// broker received, in the order it received them, each stamped with
	// the broker's clock on arrival (before the broker applied it). A
	// request the broker then refused counts too: a worker must not even
	// try to commit an offset past an event whose effect is not committed.
	Commits []CommitRequest
	// Committed is the group's committed offset per input partition at
	// the end (the next offset to consume; absent: none).
	Committed map[int32]int64
	// Ledger is every row of the ledger table, with the commit time of the
	// transaction that wrote it (PostgreSQL's track_commit_timestamp).
	Ledger []LedgerRow
	// Keys holds the keys of the scope's dedup rows (effectively_keys).
	Keys map[string]bool
	// Output is every record of the output topic (read_committed).
	Output []OutputRecord
	// Journal holds the scope's sent-records (effectively_journal), by key.
	Journal map[string]JournalRow
}

// InputRecord is one record of the input topic.
type InputRecord struct {
	Partition int32
	Offset    int64
	EventID   string
}

// CommitRequest is one partition's offset in an OffsetCommit request.
type CommitRequest struct {
	At        time.Time
	Partition int32
	Offset    int64
	// Member and Generation are the request's member id and generation.
	Member     string
	Generation int32
}

// LedgerRow is one ledger row.
type LedgerRow struct {
	ID, EventID string
	Cents       int64
	CommittedAt time.Time
}

// OutputRecord is one record of the output topic, with the fields of its
// value.
type OutputRecord struct {
	Partition   int32
	Offset      int64
	EventID     string
	LedgerEntry string
	Cents       int64
}

// Ref is the record's reference as the producer records it in the journal.
func (r OutputRecord) Ref() string {
	return strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10)
}

// JournalRow is one sent-record.
type JournalRow struct {
	Done    bool
	Ref     string
	Attempt int
}

// Verdict is what the checker found. The fields above Acked must be zero
// for an effectively-once worker ([Verdict.Violations] lists those that are
// not); OutputDuplicates is allowed, inside the producer's declared window.
type Verdict struct {
	// Events and Records: distinct events sent, and input records (an
	// event may have been produced more than once).
	Events, Records int

	// Lost counts events acked (an input record of theirs below the
	// group's committed offset) or with an output record, but without a
	// ledger row.
	Lost int
	// Duplicated counts events with more than one ledger row.
	Duplicated int
	// EffectWithoutKey counts ledger rows whose key has no dedup row;
	// KeyWithoutEffect dedup rows of the ledger step without a ledger row.
	EffectWithoutKey, KeyWithoutEffect int
	// AckBeforeCommit counts events with an input record that an offset
	// commit request covered before the event's ledger row committed (or
	// that has no ledger row at all): the worker acked before the effect
	// was durable, whether or not a crash then lost it.
	AckBeforeCommit int
	// Unexpected counts ledger rows for events never sent; WrongPayload
	// ledger rows whose amount is not the event's.
	Unexpected, WrongPayload int
	// LostOutput counts acked events without an output record.
	LostOutput int
	// OutputOutsideWindow counts output duplicates the producer's contract
	// does not allow: more records for an event than the journal recorded
	// attempts (each attempt produces at most one record; only an attempt
	// whose outcome was unknown may be followed by another), or duplicates
	// of an event whose sent-record is missing or names none of them.
	OutputOutsideWindow int
	// OutputMismatch counts output records that do not carry their
	// event's ledger row id and amount (a replayed plan must rebuild the
	// record from the recorded ledger id), or that belong to no sent event.
	OutputMismatch int
	// JournalMismatch counts acked events whose sent-record is not done,
	// or is done with a reference that is none of the event's records.
	JournalMismatch int
	// Undrained counts input records at or past the group's committed
	// offset at the end: the worker did not finish.
	Undrained int

	// Acked counts events acked; Applied events with a ledger row.
	Acked, Applied int
	// OutputDuplicates counts output records beyond the first per event:
	// allowed by the producer's AtLeastOnce contract inside its window.
	OutputDuplicates int
	// Commits counts offset commit requests; FirstCommitLag is the
	// smallest time between an event's ledger commit and the first commit
	// request that covered one of its records (how close an ack came to
	// the commit).
	Commits        int
	FirstCommitLag time.Duration

	// Samples holds up to five event ids per violation, by field name.
	Samples map[string][]string
}

// Violations names every must-be-zero count that is not, with samples.
func (v *Verdict) Violations() []string {
	var out []string
	for _, c := range v.counts() {
		if c.n != 0 {
			s := fmt.Sprintf("%s: %d", c.name, c.n)
			if ids := v.Samples[c.name]; len(ids) > 0 {
				s += " (" + strings.Join(ids, ", ") + ")"
			}
			out = append(out, s)
		}
	}
	return out
}

type count struct {
	name string
	n    int
}

func (v *Verdict) counts() []count {
	return []count{
		{"lost", v.Lost},
		{"duplicated", v.Duplicated},
		{"effect without dedup row", v.EffectWithoutKey},
		{"dedup row without effect", v.KeyWithoutEffect},
		{"ack before commit", v.AckBeforeCommit},
		{"unexpected effect", v.Unexpected},
		{"wrong payload", v.WrongPayload},
		{"lost output", v.LostOutput},
		{"output duplicate outside window", v.OutputOutsideWindow},
		{"output mismatch", v.OutputMismatch},
		{"journal mismatch", v.JournalMismatch},
		{"undrained", v.Undrained},
	}
}

// String is the checker's one-line report.
func (v *Verdict) String() string {
	var b strings.Builder
	for i, c := range v.counts() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", c.name, c.n)
	}
	fmt.Fprintf(&b, "; %d events (%d input records), %d acked, %d with a ledger row; %d output duplicates (allowed inside the window); %d offset commit requests, closest ack %v after its commit",
		v.Events, v.Records, v.Acked, v.Applied, v.OutputDuplicates, v.Commits, v.FirstCommitLag)
	return b.String()
}

func (v *Verdict) sample(name, id string) {
	if v.Samples == nil {
		v.Samples = map[string][]string{}
	}
	if len(v.Samples[name]) < 5 && !slices.Contains(v.Samples[name], id) {
		v.Samples[name] = append(v.Samples[name], id)
	}
}

// Check reads a history and returns the verdict.
func Check(h *History) *Verdict {
	v := &Verdict{Events: len(h.Sent), Records: len(h.Input), Commits: len(h.Commits), FirstCommitLag: -1}

	// The first commit request that covered each input record: requests
	// carry the next offset to consume, so offset o covers every record
	// below o. Records are matched by partition and offset.
	type pos struct {
		p int32
		o int64
	}
	firstCover := map[pos]time.Time{}
	byPart := map[int32][]int64{}
	for _, r := range h.Input {
		byPart[r.Partition] = append(byPart[r.Partition], r.Offset)
	}
	for p := range byPart {
		slices.Sort(byPart[p])
	}
	covered := map[int32]int{} // per partition: index into byPart of the first record not yet covered
	for _, c := range h.Commits {
		offs := byPart[c.Partition]
		for i := covered[c.Partition]; i < len(offs) && offs[i] < c.Offset; i++ {
			firstCover[pos{c.Partition, offs[i]}] = c.At
			covered[c.Partition] = i + 1
		}
	}

	ledger := map[string][]LedgerRow{}
	for _, r := range h.Ledger {
		ledger[r.EventID] = append(ledger[r.EventID], r)
	}
	// firstCommit is the commit time of an event's first ledger row.
	firstCommit := func(id string) (time.Time, bool) {
		rows := ledger[id]
		if len(rows) == 0 {
			return time.Time{}, false
		}
		t := rows[0].CommittedAt
		for _, r := range rows[1:] {
			if r.CommittedAt.Before(t) {
				t = r.CommittedAt
			}
		}
		return t, true
	}

	acked := map[string]bool{}
	ackedEarly := map[string]bool{}
	for _, r := range h.Input {
		if committed, ok := h.Committed[r.Partition]; ok && r.Offset < committed {
			acked[r.EventID] = true
		} else {
			v.Undrained++
			v.sample("undrained", r.EventID)
		}
		at, ok := firstCover[pos{r.Partition, r.Offset}]
		if !ok {
			continue
		}
		done, ok := firstCommit(r.EventID)
		// Microseconds: PostgreSQL's resolution. Both clocks are the
		// machine's wall clock.
		if !ok || done.UnixMicro() > at.UnixMicro() {
			ackedEarly[r.EventID] = true
			continue
		}
		if lag := at.Sub(done); v.FirstCommitLag < 0 || lag < v.FirstCommitLag {
			v.FirstCommitLag = lag
		}
	}
	v.Acked = len(acked)
	for _, id := range sortedKeys(ackedEarly) {
		v.AckBeforeCommit++
		v.sample("ack before commit", id)
	}

	outputs := map[string][]OutputRecord{}
	for _, r := range h.Output {
		outputs[r.EventID] = append(outputs[r.EventID], r)
	}

	// Ledger rows.
	for _, id := range sortedKeys(ledger) {
		rows := ledger[id]
		cents, sent := h.Sent[id]
		if !sent {
			v.Unexpected += len(rows)
			v.sample("unexpected effect", id)
			continue
		}
		v.Applied++
		if len(rows) > 1 {
			v.Duplicated++
			v.sample("duplicated", id)
		}
		for _, r := range rows {
			if r.Cents != cents {
				v.WrongPayload++
				v.sample("wrong payload", id)
			}
		}
		if !h.Keys[keyOf(h.Scope, id, StepLedger)] {
			v.EffectWithoutKey += len(rows)
			v.sample("effect without dedup row", id)
		}
	}

	// Events: lost effects, dedup rows without effects, outputs.
	for _, id := range sortedKeys(h.Sent) {
		rows := ledger[id]
		outs := outputs[id]
		if len(rows) == 0 && (acked[id] || len(outs) > 0) {
			v.Lost++
			v.sample("lost", id)
		}
		if len(rows) == 0 && h.Keys[keyOf(h.Scope, id, StepLedger)] {
			v.KeyWithoutEffect++
			v.sample("dedup row without effect", id)
		}
		if acked[id] && len(outs) == 0 {
			v.LostOutput++
			v.sample("lost output", id)
		}
		for _, o := range outs {
			if len(rows) == 1 && (o.LedgerEntry != rows[0].ID || o.Cents != h.Sent[id]) {
				v.OutputMismatch++
				v.sample("output mismatch", id)
			}
		}
		j, journaled := h.Journal[keyOf(h.Scope, id, StepOutput)]
		refOK := journaled && j.Done && slices.ContainsFunc(outs, func(o OutputRecord) bool { return o.Ref() == j.Ref })
		if len(outs) > 1 {
			v.OutputDuplicates += len(outs) - 1
			if !refOK || len(outs) > j.Attempt {
				v.OutputOutsideWindow += len(outs) - 1
				v.sample("output duplicate outside window", id)
			}
		}
		if acked[id] && !refOK {
			v.JournalMismatch++
			v.sample("journal mismatch", id)
		}
	}
	for _, id := range sortedKeys(outputs) {
		if _, sent := h.Sent[id]; !sent {
			v.OutputMismatch += len(outputs[id])
			v.sample("output mismatch", id)
		}
	}
	if v.FirstCommitLag < 0 {
		v.FirstCommitLag = 0
	}
	return v
}

func keyOf(scope, eventID, step string) string {
	k, err := effects.NewKey(scope, eventID, step)
	if err != nil {
		return "" // an empty event id: no key can match
	}
	return string(k)
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// AppliedCommit is a committed offset as the broker stored it: At is the
// broker's time of the commit (kfake's GroupCommit.At), which follows the
// arrival of the request that carried it and precedes the next request's.
type AppliedCommit struct {
	At        time.Time
	Partition int32
	Offset    int64
}

// CommitVerdict is what [CheckCommits] found. Backwards and Zombie must be
// zero; Unmatched too (an applied offset no request carried means the
// history is incomplete).
type CommitVerdict struct {
	// Applied counts the applied commits checked; Requests the requests.
	Applied, Requests int
	// Backwards counts applied commits whose offset is below the
	// partition's previous applied offset.
	Backwards int
	// Zombie counts applied commits carried by a request from a member
	// the group had already dropped when the request arrived.
	Zombie int
	// Unmatched counts applied commits no earlier request carried.
	Unmatched int
	// ZombieRequests counts requests from members the group had dropped
	// when they arrived: attempts the broker must refuse (not violations).
	ZombieRequests int
	// Samples holds up to five examples per violation.
	Samples map[string][]string
}

// Violations names every must-be-zero count that is not, with samples.
func (v *CommitVerdict) Violations() []string {
	var out []string
	for _, c := range []count{{"offset moved backwards", v.Backwards}, {"zombie commit applied", v.Zombie}, {"applied commit without a request", v.Unmatched}} {
		if c.n != 0 {
			out = append(out, fmt.Sprintf("%s: %d (%s)", c.name, c.n, strings.Join(v.Samples[c.name], "; ")))
		}
	}
	return out
}

// String is the one-line report.
func (v *CommitVerdict) String() string {
	return fmt.Sprintf("%d applied commits checked against %d requests (%d of them from members already dropped): %d moved an offset backwards, %d from a dropped member, %d without a request",
		v.Applied, v.Requests, v.ZombieRequests, v.Backwards, v.Zombie, v.Unmatched)
}

func (v *CommitVerdict) sample(name, s string) {
	if v.Samples == nil {
		v.Samples = map[string][]string{}
	}
	if len(v.Samples[name]) < 5 {
		v.Samples[name] = append(v.Samples[name], s)
	}
}

// CheckCommits checks the offsets a group's broker applied against the
// requests that carried them: per partition, in the broker's order, no
// applied offset is below the one before it, and none was carried by a
// request from a member the group had dropped before the request arrived
// (dropped maps a member id to the time it was first seen gone). An
// applied commit is matched to the requests for its partition and offset
// that arrived before it was applied and after the request matched to the
// partition's previous applied commit (a request is applied once); it came
// from a dropped member only if every one of them did (a zombie's request
// for the same offset, which the broker refused, may arrive between a live
// member's request and its apply).
func CheckCommits(requests []CommitRequest, applied []AppliedCommit, dropped map[string]time.Time) *CommitVerdict {
	v := &CommitVerdict{Applied: len(applied), Requests: len(requests)}
	for _, r := range requests {
		if gone, ok := dropped[r.Member]; ok && !gone.After(r.At) {
			v.ZombieRequests++
		}
	}
	byPart := map[int32][]AppliedCommit{}
	for _, a := range applied {
		byPart[a.Partition] = append(byPart[a.Partition], a)
	}
	reqs := map[int32][]CommitRequest{}
	for _, r := range requests {
		reqs[r.Partition] = append(reqs[r.Partition], r)
	}
	for p, as := range byPart {
		slices.SortFunc(as, func(a, b AppliedCommit) int { return a.At.Compare(b.At) })
		rs := reqs[p]
		slices.SortStableFunc(rs, func(a, b CommitRequest) int { return a.At.Compare(b.At) })
		used := -1 // index in rs of the request matched to the previous applied commit
		for i, a := range as {
			if i > 0 && a.Offset < as[i-1].Offset {
				v.Backwards++
				v.sample("offset moved backwards", fmt.Sprintf("partition %d: %d after %d", p, a.Offset, as[i-1].Offset))
			}
			var from []CommitRequest // the requests that may have carried a
			live, match := false, -1
			for k := used + 1; k < len(rs) && !rs[k].At.After(a.At); k++ {
				r := rs[k]
				if r.Offset != a.Offset {
					continue
				}
				from = append(from, r)
				if gone, ok := dropped[r.Member]; !ok || gone.After(r.At) {
					live, match = true, k
				} else if !live {
					match = k
				}
			}
			if len(from) == 0 {
				v.Unmatched++
				v.sample("applied commit without a request", fmt.Sprintf("partition %d offset %d at %s", p, a.Offset, a.At.Format(time.StampMicro)))
				continue
			}
			used = match
			if !live {
				r := from[len(from)-1]
				gone := dropped[r.Member]
				v.Zombie++
				v.sample("zombie commit applied", fmt.Sprintf("partition %d offset %d from %s (generation %d), dropped at %s, request at %s",
					p, a.Offset, r.Member, r.Generation, gone.Format(time.StampMicro), r.At.Format(time.StampMicro)))
			}
		}
	}
	return v
}
