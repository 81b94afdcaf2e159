package effects

import (
	"bytes"
	"context"
	"sync"
	"time"
)

// heldLeases are the leases one [Plan.Run] holds for later steps: taken by
// an earlier step, in its own transaction, for a key a later step of the
// run applies (see [HoldLease]).
type heldLeases struct {
	mu     sync.Mutex
	leases []heldLease
}

// heldLease is one lease taken ahead of its step.
type heldLease struct {
	journal     Journal
	key         Key
	fingerprint []byte
	attempt     int
	began       time.Time     // no later than the lease began
	lease       time.Duration // how long it runs from then
}

type heldLeasesKey struct{}

// withHeldLeases returns ctx carrying a new, empty set of held leases.
func withHeldLeases(ctx context.Context) (context.Context, *heldLeases) {
	h := &heldLeases{}
	return context.WithValue(ctx, heldLeasesKey{}, h), h
}

// releaseUnused gives up the leases the run took ahead and no step used
// (a step before theirs failed, or the run's context ended): nothing was
// done under them, and a redelivery's Begin takes the key at once instead
// of waiting for the lease to expire. A failed Release leaves the lease
// to expire on its own; none is tried past the lease's end. Run calls it
// as it returns.
func (h *heldLeases) releaseUnused(ctx context.Context) {
	h.mu.Lock()
	unused := h.leases
	h.leases = nil
	h.mu.Unlock()
	for _, l := range unused {
		// Not past the lease's end, which frees it anyway: an
		// unreachable journal does not hold the run up longer.
		left := min(l.lease-time.Since(l.began), DefaultRecordTimeout)
		if left <= 0 {
			continue
		}
		rctx, cancel := Detached(ctx, left)
		_ = l.journal.Release(rctx, l.key, l.attempt)
		cancel()
	}
}

// HoldLease records, inside a [Plan.Run], that the lease on key in journal
// was taken for this run ahead of the step that applies key: an earlier
// step's transaction inserted the key's record, pending, with fingerprint
// and attempt number attempt, leased for lease from the moment it began,
// and has committed. began must be no later than that moment (a time read
// before the transaction's BEGIN was sent). A [Journaled] step of the same
// run that applies key on journal with the same fingerprint then uses the
// lease instead of calling Begin: one round trip and one commit fewer. Its
// call ends at nine tenths of this lease or of its own, whichever ends
// first, counted from began; with no time left it calls Begin. It reports
// whether the lease is held: false outside a plan run, or for a journal
// that is no pointer (leases are matched by journal), and then nothing
// uses the lease: the step's Begin finds it live and reports [ErrInFlight]
// until it expires. A held lease the run does not use (a step failed
// before it) is released when the run returns ([Journal].Release of its
// attempt), so that the redelivery's step takes the key at once.
func HoldLease(ctx context.Context, journal Journal, key Key, fingerprint []byte, attempt int, began time.Time, lease time.Duration) bool {
	h, _ := ctx.Value(heldLeasesKey{}).(*heldLeases)
	if h == nil || !isPointer(journal) || attempt < 1 || lease <= 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leases = append(h.leases, heldLease{journal: journal, key: key, fingerprint: bytes.Clone(fingerprint),
		attempt: attempt, began: began, lease: lease})
	return true
}

// callTime returns how long a call on l may run: until nine tenths of l
// or of own (the Journaled's call timeout for its own leases), whichever
// ends first, counted from when l began.
func (l heldLease) callTime(own time.Duration) time.Duration {
	return min(own, l.lease-l.lease/10) - time.Since(l.began)
}

// takeHeldLease removes and returns the lease ctx's run holds for key on
// journal, if its fingerprint is fingerprint.
func takeHeldLease(ctx context.Context, journal Journal, key Key, fingerprint []byte) (heldLease, bool) {
	h, _ := ctx.Value(heldLeasesKey{}).(*heldLeases)
	if h == nil || !isPointer(journal) {
		return heldLease{}, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, l := range h.leases {
		if l.journal == journal && l.key == key && bytes.Equal(l.fingerprint, fingerprint) {
			h.leases = append(h.leases[:i], h.leases[i+1:]...)
			return l, true
		}
	}
	return heldLease{}, false
}
