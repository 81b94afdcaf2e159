package postgres

import (
	"crypto/rand"
	"encoding/hex"
	"slices"
	"sync"
	"time"

	"effectively.dev/effects"
)

// A lease a Journal takes (Begin) carries a holder token,
// random per call, in the record's ref column until the key is done. When
// the reply to the statement that took it is lost (effects.ErrAmbiguous),
// nobody holds the lease: the caller did not do the effect, and no other
// call knows the token. The Journal remembers it (lostLeases), and its
// next Begin of that key takes the lease back at once, as the same
// attempt, instead of failing with effects.ErrInFlight until the lease
// expires (a minute by default: after a database failover, every key
// whose Begin or lease-taking transaction lost its reply held up its
// partition that long). A Begin
// through another Journal, another process, still waits for the lease:
// it cannot tell a lost lease from a live one.

// newLeaseToken returns a holder token: 64 random bits in hex.
func newLeaseToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return hex.EncodeToString(b[:])
}

// maxLostLeases bounds a Journal's lostLeases: the keys, and the leases
// of one key. A lease lost beyond them is not remembered, and its key
// waits for the lease to expire, as it would without them.
const (
	maxLostLeases       = 4096
	maxLostLeasesPerKey = 8
)

// lostLeases are the holder tokens of the leases a Journal's statements
// may have taken when their replies were lost, per key, until those
// leases expire. It is safe for concurrent use; the zero value is empty.
type lostLeases struct {
	mu sync.Mutex
	m  map[effects.Key][]lostLease
}

type lostLease struct {
	token string
	until time.Time // the lease's end by this process's clock, at the latest
}

// remember notes that a statement sent at sent, with token, may have taken
// key's lease for lease.
func (l *lostLeases) remember(key effects.Key, token string, sent time.Time, lease time.Duration) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[effects.Key][]lostLease)
	}
	if len(l.m) >= maxLostLeases {
		for k := range l.m {
			l.liveLocked(k, now)
		}
		if len(l.m) >= maxLostLeases {
			return
		}
	}
	// The lease ends lease after the statement's now(), which comes
	// after sent: until is before the lease's end, whatever the clocks
	// read (both are durations from one statement). It must not be
	// later: past the lease's end another process may take the key over,
	// and code before the holder tokens leaves ref as it was when it
	// does. Past until, the database's own expiry frees the key.
	ls := l.liveLocked(key, now)
	if len(ls) >= maxLostLeasesPerKey {
		ls = append(ls[:0], ls[1:]...)
	}
	l.m[key] = append(ls, lostLease{token: token, until: sent.Add(lease)})
}

// tokens returns the holder tokens of key's lost leases that may still be
// live.
func (l *lostLeases) tokens(key effects.Key) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[key]; !ok {
		return nil // every Begin asks: no clock read, no write for a key with none
	}
	ls := l.liveLocked(key, time.Now())
	if len(ls) == 0 {
		return nil
	}
	out := make([]string, len(ls))
	for i, x := range ls {
		out[i] = x.token
	}
	return out
}

// forget drops key's lost leases with tokens: a Begin that named them
// got the record as it is, so none of them is a lease held by nobody any
// more (taken back, done, or taken over after it expired). Leases lost
// since that Begin read the tokens stay.
func (l *lostLeases) forget(key effects.Key, tokens []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := slices.DeleteFunc(l.m[key], func(x lostLease) bool { return slices.Contains(tokens, x.token) })
	if len(ls) == 0 {
		delete(l.m, key)
		return
	}
	l.m[key] = ls
}

// liveLocked drops key's leases that have ended at now (the key, when
// none is left) and returns the others. l.mu must be held.
func (l *lostLeases) liveLocked(key effects.Key, now time.Time) []lostLease {
	ls := slices.DeleteFunc(l.m[key], func(x lostLease) bool { return !now.Before(x.until) })
	if len(ls) == 0 {
		delete(l.m, key)
		return nil
	}
	l.m[key] = ls
	return ls
}
