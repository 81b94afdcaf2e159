package counterexamples

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"path"
	"strings"
	"sync"
	"time"
	"unicode"

	"effectively.dev/effects"
)

// The third round: an in-process vendor API with an idempotency-key store
// ([Vendor]) and a client for it ([VendorClient]), honest as built by
// [Honest], and each liar one plausible production bug in the vendor's key
// store or in the client. Every call to the vendor is a round trip through
// the suite's Faults (Trip), so network and application faults reach it.
//
// Key identity, in the vendor's key store:
//   - [StripInvisible]: strips format runes (zero-width space, joiners,
//     soft hyphen, a BOM) from keys, as a sanitiser of user input does.
//   - [WidthFold]: folds fullwidth letters to ASCII (NFKC's width part).
//   - [LikeLookup]: looks keys up with SQL LIKE, unescaped.
//   - [GlobLookup]: looks keys up with a glob (path.Match).
//   - [SlashCollapse]: cleans keys as URL paths do: a backslash is a
//     slash, doubled slashes and a trailing one are dropped.
//   - [LongKeyCRC]: stores keys longer than 128 bytes as their CRC-32.
//
// Application failures with the connection up, in the client:
//   - [TransientOn5xx]: calls a 5xx reply ErrTransient, though the vendor
//     may have done the work.
//   - [ReplayedOnSerialization]: takes a serialization failure (40001) for
//     a concurrent duplicate that won, and reports a replay.
//   - [DeadlockPermanent]: calls a deadlock (40P01) a permanent refusal.
//   - [BusySkipsLookup]: when the key lookup fails with a lock timeout or
//     a busy database, creates without the key.
//
// Several failures in a row, in the client:
//   - [RotateAfterTwoFailures]: after two failed attempts on a key in a
//     row, retries under a new key, taking the key for poisoned.
//   - [BreakerAssumesDone]: after two failed attempts on a key in a row,
//     its breaker opens and reports the key done.
//
// A slow backend, a scope and a size:
//   - [ShortVendorLock]: the vendor locks a key for 300ms while it works, and
//     does the work of a claim that was taken over: work that takes longer
//     than the lock lets a duplicate in.
//   - [AccountScoped]: the vendor scopes keys per account, so one key
//     reused for another account applies again.
//   - [ByteBudget]: the vendor keeps stored responses up to 1 MiB and
//     evicts the oldest past it.
type Vendor struct {
	mu      sync.Mutex
	effects map[string]int // by order id
	total   int
	keys    map[string]*vendorRec
	order   []string // stored keys, oldest first
	bytes   int
	seq     int

	keyOf    func(string) string          // how the store keys a request's key
	match    func(pattern, k string) bool // a lookup by pattern, if set
	scoped   bool                         // keys are per account
	budget   int                          // bytes of stored responses kept; 0: no bound
	lease    time.Duration                // how long a key is locked while the vendor works
	workTrip bool                         // a create is two round trips: claim the key, then work
	fenced   bool                         // work checks that its claim still holds the key
}

type vendorRec struct {
	fp      string
	ref     string
	done    bool
	until   time.Time // the lock of a key being worked on
	token   int       // the claim that holds the lock
	size    int
	account string
}

// Order is what the round 3 effects apply: one order, counted by ID.
type Order struct {
	ID      string
	Cents   int64
	Account string
	Note    string // padding: a stored response's size follows it
}

// NewVendor returns an honest vendor: keys stored as given, kept forever,
// global across accounts, one round trip per create.
func NewVendor() *Vendor {
	return &Vendor{effects: map[string]int{}, keys: map[string]*vendorRec{}, keyOf: func(k string) string { return k }}
}

// Count returns the effects done for order id.
func (v *Vendor) Count(id string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.effects[id]
}

// Total returns every effect done.
func (v *Vendor) Total() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.total
}

// Bytes returns the bytes of stored responses the vendor holds.
func (v *Vendor) Bytes() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.bytes
}

func fingerprint(o Order) string {
	return fmt.Sprintf("%s/%d/%s/%d", o.ID, o.Cents, o.Account, len(o.Note))
}

// storeKey is the key under which the vendor stores a request's key.
func (v *Vendor) storeKey(key string, o Order) string {
	k := v.keyOf(key)
	if v.scoped {
		k = o.Account + "\x00" + k
	}
	return k
}

// findLocked returns the record the vendor finds for key.
func (v *Vendor) findLocked(key string, o Order) (string, *vendorRec) {
	k := v.storeKey(key, o)
	if r, ok := v.keys[k]; ok {
		return k, r
	}
	if v.match != nil {
		for _, sk := range v.order {
			if v.match(k, sk) {
				return sk, v.keys[sk]
			}
		}
	}
	return k, nil
}

// errVendorInFlight is the vendor's 409: the key is being worked on.
var errVendorInFlight = errors.New("vendor: 409 a request with this key is in progress")

// errVendorReused is the vendor's 422: the key was used with another payload.
var errVendorReused = errors.New("vendor: 422 key reused with another payload")

// lookup is the read of a key: its record's ref, whether it is done.
func (v *Vendor) lookup(key string, o Order) (ref string, found bool, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, r := v.findLocked(key, o)
	switch {
	case r == nil || !r.done && time.Now().After(r.until):
		return "", false, nil
	case r.fp != fingerprint(o):
		return "", false, errVendorReused
	case !r.done:
		return "", false, errVendorInFlight
	}
	return r.ref, true, nil
}

// create does the order under key, or replays the stored response.
func (v *Vendor) create(key string, o Order) (ref string, replayed bool, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k, r := v.findLocked(key, o)
	if r != nil {
		if r.fp != fingerprint(o) {
			return "", false, errVendorReused
		}
		return r.ref, true, nil
	}
	ref = v.doLocked(o)
	v.storeLocked(k, &vendorRec{fp: fingerprint(o), ref: ref, done: true, size: len(key) + len(o.Note) + 64, account: o.Account})
	return ref, false, nil
}

// createBlind does the order with no key at all.
func (v *Vendor) createBlind(o Order) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.doLocked(o)
}

func (v *Vendor) doLocked(o Order) string {
	v.seq++
	v.effects[o.ID]++
	v.total++
	return fmt.Sprintf("ord_%d", v.seq)
}

func (v *Vendor) storeLocked(k string, r *vendorRec) {
	if _, ok := v.keys[k]; !ok {
		v.order = append(v.order, k)
	}
	v.keys[k] = r
	v.bytes += r.size
	for v.budget > 0 && v.bytes > v.budget && len(v.order) > 1 {
		old := v.order[0]
		v.order = v.order[1:]
		v.bytes -= v.keys[old].size
		delete(v.keys, old)
	}
}

// claim locks key for the vendor's lease, for a create in two round
// trips (claim, then work). A key locked by a claim whose lease ran out is
// claimed again. It returns the claim's token, or the ref of a key done.
func (v *Vendor) claim(key string, o Order) (token int, ref string, done bool, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k, r := v.findLocked(key, o)
	switch {
	case r == nil || !r.done && time.Now().After(r.until):
		v.seq++
		v.storeLocked(k, &vendorRec{fp: fingerprint(o), until: time.Now().Add(v.lease), token: v.seq, size: len(key) + 64})
		return v.seq, "", false, nil
	case r.fp != fingerprint(o):
		return 0, "", false, errVendorReused
	case !r.done:
		return 0, "", false, errVendorInFlight
	}
	return 0, r.ref, true, nil
}

// work does the order under the claim token and records the key done,
// at once; a key done meanwhile replays. The honest vendor refuses work
// whose claim was taken over (fenced); the one with a short lease does
// it anyway.
func (v *Vendor) work(key string, o Order, token int) (ref string, replayed bool, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k, r := v.findLocked(key, o)
	switch {
	case !v.fenced:
		// The work was dispatched under the claim; it runs whatever
		// happened to the claim since, and the first to finish is kept.
		ref = v.doLocked(o)
		if r != nil && r.done {
			return ref, false, nil
		}
	case r != nil && r.done:
		return r.ref, true, nil
	case r == nil || r.token != token:
		return "", false, errVendorInFlight
	default:
		ref = v.doLocked(o)
	}
	v.storeLocked(k, &vendorRec{fp: fingerprint(o), ref: ref, done: true, size: len(key) + len(o.Note) + 64, account: o.Account})
	return ref, false, nil
}

// VendorClient is the effect over a Vendor. Trip runs one call to the
// vendor as a round trip (the suite's Faults.RoundTrip).
type VendorClient struct {
	V    *Vendor
	Trip func(ctx context.Context, fn func() error) error
	Name string

	lie   clientLie
	mu    sync.Mutex
	fails map[effects.Key]int // failed attempts in a row, per key (the liars of failures in a row)
}

// clientLie is what a lying client does differently.
type clientLie int

const (
	honestClient clientLie = iota
	lieTransientOn5xx
	lieReplayedOnSerialization
	lieDeadlockPermanent
	lieBusySkipsLookup
	lieRotateAfterTwo
	lieBreakerAfterTwo
)

// Contract claims effectively-once with key-reuse detection, kept until
// pruned.
func (c *VendorClient) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "vendor idempotency-key store (" + c.Name + ")", DetectsKeyReuse: true}
}

// statusOf is the SQLSTATE or HTTP status of an application error.
func statusOf(err error) (sqlstate string, http int, busy bool) {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		sqlstate = s.SQLState()
	}
	var h interface{ HTTPStatus() int }
	if errors.As(err, &h) {
		http = h.HTTPStatus()
	}
	var b interface{ Busy() bool }
	if errors.As(err, &b) {
		busy = b.Busy()
	}
	return
}

// classify is the honest classification of a failed round trip: a
// refusal the backend made before doing anything (a serialization failure,
// a deadlock, a lock timeout, a busy database, a 503) is transient; a 409
// is in flight; a 422 is key reuse; anything else (a lost reply, a 5xx)
// is an unknown outcome.
func (c *VendorClient) classify(key effects.Key, err error) error {
	sqlstate, status, busy := statusOf(err)
	switch {
	case errors.Is(err, errVendorReused):
		return &effects.Error{Kind: effects.ErrKeyReused, Op: c.Name, Key: key, Err: err}
	case errors.Is(err, errVendorInFlight) || status == 409:
		return &effects.Error{Kind: effects.ErrInFlight, Op: c.Name, Key: key, Err: err}
	case c.lie == lieTransientOn5xx && status >= 500:
		return effects.Transient(c.Name, key, err)
	case c.lie == lieDeadlockPermanent && sqlstate == "40P01":
		return effects.Refused(c.Name, key, err)
	case sqlstate == "40001" || sqlstate == "40P01" || sqlstate == "55P03" || busy || status == 503:
		return effects.Transient(c.Name, key, err)
	}
	return effects.Ambiguous(c.Name, key, err)
}

func (c *VendorClient) trip(ctx context.Context, fn func() error) error {
	if c.Trip == nil {
		return fn()
	}
	return c.Trip(ctx, fn)
}

// Apply creates the order under key: a lookup of the key, then a create
// (or, for a vendor that works slowly, a claim, the work and a finish).
func (c *VendorClient) Apply(ctx context.Context, key effects.Key, o Order) (res effects.Result, err error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	sendKey := string(key)
	if c.lie == lieRotateAfterTwo || c.lie == lieBreakerAfterTwo {
		c.mu.Lock()
		n := c.fails[key]
		c.mu.Unlock()
		switch {
		case n >= 2 && c.lie == lieRotateAfterTwo:
			sendKey += "~retry" // the key is taken for poisoned
		case n >= 2:
			return effects.Result{Status: effects.Replayed}, nil // the breaker is open: assume done
		}
		defer func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.fails == nil {
				c.fails = map[effects.Key]int{}
			}
			if err != nil {
				c.fails[key]++
			} else {
				delete(c.fails, key)
			}
		}()
	}
	var ref string
	var found bool
	if err := c.trip(ctx, func() error {
		var e error
		ref, found, e = c.V.lookup(sendKey, o)
		return e
	}); err != nil {
		sqlstate, _, busy := statusOf(err)
		if !(c.lie == lieBusySkipsLookup && (busy || sqlstate == "55P03")) {
			return effects.Result{}, c.classify(key, err)
		}
		// The key store is locked: create without the key, "the lookup
		// found nothing it could read".
		err := c.trip(ctx, func() error { ref = c.V.createBlind(o); return nil })
		if err != nil {
			return effects.Result{}, c.classify(key, err)
		}
		return effects.Result{Status: effects.Applied, Ref: ref}, nil
	}
	if found {
		return effects.Result{Status: effects.Replayed, Ref: ref}, nil
	}
	if c.V.workTrip {
		return c.applySlow(ctx, key, sendKey, o)
	}
	var replayed bool
	if err := c.trip(ctx, func() error {
		var e error
		ref, replayed, e = c.V.create(sendKey, o)
		return e
	}); err != nil {
		if sqlstate, _, _ := statusOf(err); c.lie == lieReplayedOnSerialization && sqlstate == "40001" {
			return effects.Result{Status: effects.Replayed}, nil // "a concurrent duplicate won"
		}
		return effects.Result{}, c.classify(key, err)
	}
	if replayed {
		return effects.Result{Status: effects.Replayed, Ref: ref}, nil
	}
	return effects.Result{Status: effects.Applied, Ref: ref}, nil
}

// applySlow creates in two round trips: claim the key, then do the work
// under the claim.
func (c *VendorClient) applySlow(ctx context.Context, key effects.Key, sendKey string, o Order) (effects.Result, error) {
	var token int
	var ref string
	var done bool
	if err := c.trip(ctx, func() error {
		var e error
		token, ref, done, e = c.V.claim(sendKey, o)
		return e
	}); err != nil {
		return effects.Result{}, c.classify(key, err)
	}
	if done {
		return effects.Result{Status: effects.Replayed, Ref: ref}, nil
	}
	var replayed bool
	if err := c.trip(ctx, func() error {
		var e error
		ref, replayed, e = c.V.work(sendKey, o, token)
		return e
	}); err != nil {
		return effects.Result{}, c.classify(key, err)
	}
	if replayed {
		return effects.Result{Status: effects.Replayed, Ref: ref}, nil
	}
	return effects.Result{Status: effects.Applied, Ref: ref}, nil
}

// VendorLiar names one vendor or client of round 3 and builds it.
type VendorLiar struct {
	Name   string
	Vendor func() *Vendor
	Client clientLie
}

// Build returns the client of l over v, its round trips through trip.
func (l VendorLiar) Build(v *Vendor, trip func(context.Context, func() error) error) *VendorClient {
	return &VendorClient{V: v, Trip: trip, Name: l.Name, lie: l.Client}
}

func vendorWith(fn func(v *Vendor)) func() *Vendor {
	return func() *Vendor { v := NewVendor(); fn(v); return v }
}

// The honest vendor and client, and the liars of round 3.
var (
	// Honest is the honest vendor and client: keys stored as given, one
	// round trip per create, every failure classified by when it happened.
	Honest = VendorLiar{Name: "honest", Vendor: NewVendor}
	// HonestSlow is the honest vendor that claims a key for 300ms, then
	// works under the claim, fenced: work whose claim was taken over is
	// refused.
	HonestSlow = VendorLiar{Name: "honest-slow", Vendor: vendorWith(func(v *Vendor) { v.workTrip, v.fenced, v.lease = true, true, 300*time.Millisecond })}

	// StripInvisible strips format runes and joiners from keys.
	StripInvisible = VendorLiar{Name: "strip-invisible", Vendor: vendorWith(func(v *Vendor) {
		v.keyOf = func(k string) string {
			return strings.Map(func(r rune) rune {
				if unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Mn, r) && (r == '\u034f' || r >= '\ufe00' && r <= '\ufe0f') {
					return -1
				}
				return r
			}, k)
		}
	})}
	// WidthFold folds fullwidth forms to ASCII in keys.
	WidthFold = VendorLiar{Name: "width-fold", Vendor: vendorWith(func(v *Vendor) {
		v.keyOf = func(k string) string {
			return strings.Map(func(r rune) rune {
				if r >= 0xff01 && r <= 0xff5e {
					return r - 0xff01 + '!'
				}
				return r
			}, k)
		}
	})}
	// LikeLookup finds a key with SQL LIKE, the new key the pattern.
	LikeLookup = VendorLiar{Name: "like-lookup", Vendor: vendorWith(func(v *Vendor) { v.match = like })}
	// GlobLookup finds a key with a glob, the new key the pattern.
	GlobLookup = VendorLiar{Name: "glob-lookup", Vendor: vendorWith(func(v *Vendor) { v.match = glob })}
	// SlashCollapse cleans keys as a URL path: backslashes, doubled and
	// trailing slashes.
	SlashCollapse = VendorLiar{Name: "slash-collapse", Vendor: vendorWith(func(v *Vendor) {
		v.keyOf = func(k string) string {
			k = strings.ReplaceAll(k, "\\", "/")
			for strings.Contains(k, "//") {
				k = strings.ReplaceAll(k, "//", "/")
			}
			return strings.TrimSuffix(k, "/")
		}
	})}
	// LongKeyCRC stores keys longer than 128 bytes as their CRC-32.
	LongKeyCRC = VendorLiar{Name: "long-key-crc", Vendor: vendorWith(func(v *Vendor) {
		v.keyOf = func(k string) string {
			if len(k) > 128 {
				return fmt.Sprintf("crc32:%08x", crc32.ChecksumIEEE([]byte(k)))
			}
			return k
		}
	})}

	// TransientOn5xx calls a 5xx ErrTransient.
	TransientOn5xx = VendorLiar{Name: "transient-on-5xx", Vendor: NewVendor, Client: lieTransientOn5xx}
	// ReplayedOnSerialization reports a serialization failure as a replay.
	ReplayedOnSerialization = VendorLiar{Name: "replayed-on-serialization", Vendor: NewVendor, Client: lieReplayedOnSerialization}
	// DeadlockPermanent calls a deadlock a permanent refusal.
	DeadlockPermanent = VendorLiar{Name: "deadlock-permanent", Vendor: NewVendor, Client: lieDeadlockPermanent}
	// BusySkipsLookup creates without the key when the lookup meets a lock
	// timeout or a busy database.
	BusySkipsLookup = VendorLiar{Name: "busy-skips-lookup", Vendor: NewVendor, Client: lieBusySkipsLookup}

	// RotateAfterTwoFailures retries under a new key after two failed
	// attempts in a row.
	RotateAfterTwoFailures = VendorLiar{Name: "rotate-after-two-failures", Vendor: NewVendor, Client: lieRotateAfterTwo}
	// BreakerAssumesDone reports a key done after two failed attempts in a
	// row.
	BreakerAssumesDone = VendorLiar{Name: "breaker-assumes-done", Vendor: NewVendor, Client: lieBreakerAfterTwo}

	// ShortVendorLock locks a key for 300ms and does the work of a claim
	// taken over.
	ShortVendorLock = VendorLiar{Name: "short-lease", Vendor: vendorWith(func(v *Vendor) { v.workTrip, v.lease = true, 300*time.Millisecond })}
	// AccountScoped keys its store by account and key.
	AccountScoped = VendorLiar{Name: "account-scoped", Vendor: vendorWith(func(v *Vendor) { v.scoped = true })}
	// ByteBudget evicts the oldest stored responses past 1 MiB.
	ByteBudget = VendorLiar{Name: "byte-budget", Vendor: vendorWith(func(v *Vendor) { v.budget = 1 << 20 })}
)

// VendorLiars lists the liars of round 3 over a Vendor.
var VendorLiars = []VendorLiar{StripInvisible, WidthFold, LikeLookup, GlobLookup, SlashCollapse, LongKeyCRC,
	TransientOn5xx, ReplayedOnSerialization, DeadlockPermanent, BusySkipsLookup,
	RotateAfterTwoFailures, BreakerAssumesDone, ShortVendorLock, AccountScoped, ByteBudget}

// like reports whether k matches pattern under SQL LIKE (_ one rune, %
// any run), with no escape.
func like(pattern, k string) bool {
	p, s := []rune(pattern), []rune(k)
	var m func(i, j int) bool
	m = func(i, j int) bool {
		for i < len(p) {
			switch p[i] {
			case '%':
				for ; j <= len(s); j++ {
					if m(i+1, j) {
						return true
					}
				}
				return false
			case '_':
				if j >= len(s) {
					return false
				}
			default:
				if j >= len(s) || s[j] != p[i] {
					return false
				}
			}
			i++
			j++
		}
		return j == len(s)
	}
	return m(0, 0)
}

// glob reports whether k matches pattern as path.Match does.
func glob(pattern, k string) bool {
	ok, err := path.Match(pattern, k)
	return err == nil && ok
}
