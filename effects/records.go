package effects

import (
	"context"
	"reflect"
	"sync"
)

// heldRecords are the records one [Plan.Run] holds back to commit them
// together (see [BatchJournal]): the MarkDones of its lease-free journaled
// steps. A Complete on the same journal in the same run takes them along
// in one CompleteAll; Run writes what is left when it ends, whatever the
// outcome, before it returns.
type heldRecords struct {
	mu     sync.Mutex
	held   []heldRecord
	closed bool // flushed: a late hold writes its record itself
}

// heldRecord is one success waiting for its record.
type heldRecord struct {
	a   *Attempt
	ref string
}

type heldRecordsKey struct{}

// withHeldRecords returns ctx carrying a new, empty set of held records.
func withHeldRecords(ctx context.Context) (context.Context, *heldRecords) {
	h := &heldRecords{}
	return context.WithValue(ctx, heldRecordsKey{}, h), h
}

// heldRecordsFrom returns the held records ctx carries, or nil outside a
// plan run.
func heldRecordsFrom(ctx context.Context) *heldRecords {
	h, _ := ctx.Value(heldRecordsKey{}).(*heldRecords)
	return h
}

// batchJournal returns j as a BatchJournal if it is a pointer (records
// are grouped by journal, and comparing pointers never panics, where a
// struct holding an interface may), or nil.
func batchJournal(j Journal) BatchJournal {
	bj, ok := j.(BatchJournal)
	if !ok || !isPointer(bj) {
		return nil
	}
	return bj
}

// isPointer reports whether j is a pointer: journals are told apart by
// ==, which never panics on pointers, where it may on a struct holding an
// interface.
func isPointer(j Journal) bool {
	return j != nil && reflect.TypeOf(j).Kind() == reflect.Pointer
}

// hold keeps a's record for the run. It reports false, keeping nothing,
// once the run has flushed (a step's work that outlived its step, or a
// sibling still running after a panic ended the run): the caller writes
// the record itself.
func (h *heldRecords) hold(a *Attempt, ref string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.held = append(h.held, heldRecord{a: a, ref: ref})
	return true
}

// take removes and returns the records held for journal bj.
func (h *heldRecords) take(bj BatchJournal) []heldRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []heldRecord
	out, h.held = partition(h.held, bj)
	return out
}

// partition splits recs into the records on journal bj and the others.
func partition(recs []heldRecord, bj BatchJournal) (on, others []heldRecord) {
	for _, r := range recs {
		if r.a.j.batch == bj {
			on = append(on, r)
		} else {
			others = append(others, r)
		}
	}
	return on, others
}

// flush writes every held record, one CompleteAll per journal, and
// holds no more.
func (h *heldRecords) flush() {
	h.mu.Lock()
	rest := h.held
	h.held, h.closed = nil, true
	h.mu.Unlock()
	for len(rest) > 0 {
		var same []heldRecord
		same, rest = partition(rest, rest[0].a.j.batch)
		writeRecords(same)
	}
}

// writeRecords writes recs, all on one BatchJournal: a single record with
// its own call, several in one CompleteAll. A record CompleteAll could not
// write for a reason a retry may fix gets its own call after it, with the
// retries and the logging of any other record (see [Journaled]); one it
// refused for good (another fingerprint, a key never begun) is logged.
func writeRecords(recs []heldRecord) {
	if len(recs) == 1 {
		recs[0].a.j.complete(recs[0].a, recs[0].ref)
		return
	}
	bj := recs[0].a.j.batch
	cs := make([]Completion, len(recs))
	timeout := recs[0].a.j.record
	for i, r := range recs {
		cs[i] = Completion{Key: r.a.key, Ref: r.ref, MarkDone: r.a.unleased != nil, Fingerprint: r.a.fingerprint}
		timeout = max(timeout, r.a.j.record)
	}
	dctx, cancel := Detached(recs[len(recs)-1].a.ctx, timeout)
	errs := bj.CompleteAll(dctx, cs)
	cancel()
	for i, r := range recs {
		switch {
		case len(errs) != len(recs) || errs[i] != nil && Retryable(errs[i]):
			r.a.j.complete(r.a, r.ref)
		case errs[i] != nil:
			r.a.j.unrecorded(r.a, r.ref, errs[i])
		}
	}
}
