package counterexamples

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
)

// ForgetfulDedup is a same-transaction dedup whose records count only for
// two seconds (a cache TTL someone thought was plenty), declared with
// Horizon 0: "kept until pruned".
type ForgetfulDedup struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce with keys kept until pruned. The horizon
// is a lie.
func (e ForgetfulDedup) Contract() effects.Contract {
	return claim("counterexample: dedup records that expire after 2s, declared kept until pruned")
}

// Apply drops a dedup record older than two seconds, then dedups.
func (e ForgetfulDedup) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	if _, err := e.DB.Exec(ctx, `DELETE FROM cx_seen WHERE key = $1 AND seen_at < now() - interval '2 seconds'`, string(key)); err != nil {
		return effects.Result{}, classify(key, err)
	}
	return dedupInsert(ctx, e.DB, key, in, true)
}

// AppliedOnCutCommit dedups correctly but, when COMMIT fails, reports the
// effect applied: "the write went out, so it happened".
type AppliedOnCutCommit struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce. It is a lie.
func (e AppliedOnCutCommit) Contract() effects.Contract {
	return claim("counterexample: reports Applied when COMMIT fails")
}

// Apply dedups, and turns a failed COMMIT into success.
func (e AppliedOnCutCommit) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	res, err := dedupInsert(ctx, e.DB, key, in, true)
	var ce commitError
	if errors.As(err, &ce) {
		return effects.Result{Status: effects.Applied}, nil
	}
	return res, err
}

// TransientOnLostReply dedups correctly but reports every failure,
// COMMIT's lost reply included, as ErrTransient: "nothing was applied".
// A caller that trusts the promise (releases a lease, skips a
// reconciliation) is misled.
type TransientOnLostReply struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce.
func (e TransientOnLostReply) Contract() effects.Contract {
	return claim("counterexample: every failure reported as ErrTransient")
}

// Apply dedups and calls every failure transient.
func (e TransientOnLostReply) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	return dedupTx(ctx, e.DB, key, string(key), in, true, func(k effects.Key, err error) error {
		return effects.Transient("counterexample", k, err)
	})
}

// MemoryResolved writes the ledger row and the dedup record in separate
// transactions, and bridges the gap with process memory: the row carries
// an attempt id that the process remembers per key until the dedup record
// commits, so a retry in the same process finds its own row (ON CONFLICT
// on the attempt id) instead of writing another. A successor process,
// after a crash or a redeploy, has no memory of the attempt and writes the
// row again. Create it with [NewMemoryResolved], one per process.
type MemoryResolved struct {
	DB *pgxpool.Pool

	locks    keyLocks
	mu       sync.Mutex
	attempts map[effects.Key]string
}

// keyLocks is a lock per key, in process memory.
type keyLocks struct {
	mu sync.Mutex
	m  map[effects.Key]*sync.Mutex
}

// lock locks key's lock, creating it on first use, and returns its
// unlock.
func (k *keyLocks) lock(key effects.Key) (unlock func()) {
	k.mu.Lock()
	l := k.m[key]
	if l == nil {
		if k.m == nil {
			k.m = map[effects.Key]*sync.Mutex{}
		}
		l = &sync.Mutex{}
		k.m[key] = l
	}
	k.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// NewMemoryResolved returns a MemoryResolved with empty memory.
func NewMemoryResolved(db *pgxpool.Pool) *MemoryResolved {
	return &MemoryResolved{DB: db, attempts: map[effects.Key]string{}}
}

// Contract claims EffectivelyOnce. It holds only while the process lives.
func (e *MemoryResolved) Contract() effects.Contract {
	return claim("counterexample: unknown outcomes resolved from process memory")
}

// Apply checks the dedup record, writes the row under the remembered
// attempt id, then records the key.
func (e *MemoryResolved) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	defer e.locks.lock(key)()
	var cents int64
	err := e.DB.QueryRow(ctx, `SELECT cents FROM cx_seen WHERE key = $1`, string(key)).Scan(&cents)
	switch {
	case err == nil && cents != in.Cents:
		return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Key: key}
	case err == nil:
		return effects.Result{Status: effects.Replayed}, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return effects.Result{}, classify(key, err)
	}
	e.mu.Lock()
	id, ok := e.attempts[key]
	if !ok {
		var b [8]byte
		_, _ = rand.Read(b[:])
		id = hex.EncodeToString(b[:])
		e.attempts[key] = id
	}
	e.mu.Unlock()
	if _, err := e.DB.Exec(ctx, `INSERT INTO cx_ledger (event_id, cents, attempt) VALUES ($1, $2, $3) ON CONFLICT (attempt) DO NOTHING`,
		in.EventID, in.Cents, id); err != nil {
		return effects.Result{}, classify(key, err)
	}
	if _, err := e.DB.Exec(ctx, `INSERT INTO cx_seen (key, cents) VALUES ($1, $2) ON CONFLICT DO NOTHING`, string(key), in.Cents); err != nil {
		return effects.Result{}, classify(key, err)
	}
	e.mu.Lock()
	delete(e.attempts, key)
	e.mu.Unlock()
	return effects.Result{Status: effects.Applied}, nil
}

// PrefixDedup dedups on the first 44 bytes of the key (a column someone
// sized to a UUID and a prefix).
type PrefixDedup struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce.
func (e PrefixDedup) Contract() effects.Contract {
	return claim("counterexample: dedup on the key's first 44 bytes")
}

// Apply dedups on key[:44].
func (e PrefixDedup) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	dk := string(key)
	if len(dk) > 44 {
		dk = dk[:44]
	}
	return dedupTx(ctx, e.DB, key, dk, in, true, classify)
}

// CaseFoldDedup dedups on the key folded to lower case (a
// case-insensitive collation, or a lower() in the unique index).
type CaseFoldDedup struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce.
func (e CaseFoldDedup) Contract() effects.Contract {
	return claim("counterexample: dedup on the key folded to lower case")
}

// Apply dedups on strings.ToLower(key).
func (e CaseFoldDedup) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	return dedupTx(ctx, e.DB, key, strings.ToLower(string(key)), in, true, classify)
}

// StormCheat keeps the keys it applied in process memory and replays them
// from there; under a burst (five or more distinct keys in flight at once)
// it sheds one write in twenty, reporting it applied and remembering it,
// to keep up. Create it with [NewStormCheat], one per process.
type StormCheat struct {
	DB *pgxpool.Pool

	mu       sync.Mutex
	seen     map[effects.Key]int64
	inflight map[effects.Key]int
	burst    int
}

// NewStormCheat returns a StormCheat with empty memory.
func NewStormCheat(db *pgxpool.Pool) *StormCheat {
	return &StormCheat{DB: db, seen: map[effects.Key]int64{}, inflight: map[effects.Key]int{}}
}

// Contract claims EffectivelyOnce.
func (e *StormCheat) Contract() effects.Contract {
	return claim("counterexample: sheds writes under a burst, remembers them as applied")
}

// Apply replays from memory, sheds under a burst, else dedups.
func (e *StormCheat) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	e.mu.Lock()
	if cents, ok := e.seen[key]; ok && cents == in.Cents {
		e.mu.Unlock()
		return effects.Result{Status: effects.Replayed}, nil
	}
	e.inflight[key]++
	shed := false
	if len(e.inflight) >= 5 {
		e.burst++
		shed = e.burst%20 == 0
	}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		if e.inflight[key]--; e.inflight[key] == 0 {
			delete(e.inflight, key)
		}
		e.mu.Unlock()
	}()
	res := effects.Result{Status: effects.Applied}
	if !shed {
		var err error
		if res, err = dedupInsert(ctx, e.DB, key, in, true); err != nil {
			return res, err
		}
	}
	e.mu.Lock()
	e.seen[key] = in.Cents
	e.mu.Unlock()
	return res, nil
}

// ChattyConstructorPings is how many round trips [NewChattyConstructor]
// makes: more than the suite's default sweep bound of 64.
const ChattyConstructorPings = 70

// ChattyConstructor is [TransientOnLostReply] behind a constructor that
// makes 70 round trips (a warm-up, a schema check), tolerating their
// failures. A sweep that counted the constructor's round trips would
// fault only those and never reach Apply.
type ChattyConstructor struct{ TransientOnLostReply }

// NewChattyConstructor pings db 70 times, ignoring failures, and returns
// the effect.
func NewChattyConstructor(ctx context.Context, db *pgxpool.Pool) ChattyConstructor {
	for range ChattyConstructorPings {
		_, _ = db.Exec(ctx, `SELECT 1`)
	}
	return ChattyConstructor{TransientOnLostReply{db}}
}

// HangOnFault dedups correctly but, when a call fails, waits for its
// context to end (an internal retry loop with no bound) instead of
// returning the unknown outcome.
type HangOnFault struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce.
func (e HangOnFault) Contract() effects.Contract {
	return claim("counterexample: waits for its context after a failure")
}

// Apply dedups; after a failure it waits until ctx is done.
func (e HangOnFault) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	res, err := dedupInsert(ctx, e.DB, key, in, true)
	if err != nil && ctx.Err() == nil {
		<-ctx.Done()
		return effects.Result{}, effects.Ambiguous("counterexample", key, errors.Join(err, ctx.Err()))
	}
	return res, err
}

// TrimmedKey trims white space off the key before it validates it, as
// some clients do: " order-7" is accepted, and merged with "order-7".
// Caught by invalid-keys.
type TrimmedKey struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce.
func (e TrimmedKey) Contract() effects.Contract {
	return claim("counterexample: same-transaction dedup on the trimmed key")
}

// Apply dedups on strings.TrimSpace(key).
func (e TrimmedKey) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	trimmed := effects.Key(strings.TrimSpace(string(key)))
	if err := trimmed.Validate(); err != nil {
		return effects.Result{}, err
	}
	return dedupTx(ctx, e.DB, key, string(trimmed), in, true, classify)
}

// MemoryReuseCheck claims to detect key reuse but compares payloads it
// remembers in process memory: another process, with another payload,
// gets the first payload's effect replayed. Caught by key-reuse, which
// reuses the key on a new instance too.
type MemoryReuseCheck struct {
	DB *pgxpool.Pool
	mu *sync.Mutex
	in map[effects.Key]int64
}

// NewMemoryReuseCheck returns a MemoryReuseCheck with empty memory.
func NewMemoryReuseCheck(db *pgxpool.Pool) MemoryReuseCheck {
	return MemoryReuseCheck{DB: db, mu: &sync.Mutex{}, in: map[effects.Key]int64{}}
}

// Contract claims EffectivelyOnce with key-reuse detection.
func (e MemoryReuseCheck) Contract() effects.Contract {
	return claim("counterexample: same-transaction dedup, payloads compared in process memory")
}

// Apply refuses a payload that differs from the one this process saw for
// key, and otherwise dedups without comparing payloads.
func (e MemoryReuseCheck) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	e.mu.Lock()
	seen, ok := e.in[key]
	if !ok {
		e.in[key] = in.Cents
	}
	e.mu.Unlock()
	if ok && seen != in.Cents {
		return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Key: key}
	}
	return dedupInsert(ctx, e.DB, key, in, false)
}

// LockedCheckThenWrite is TwoTransactions behind a lock per key in
// process memory: concurrent duplicates in one process wait for each
// other and replay, but two processes both check, both find nothing and
// both write. Caught by concurrent-duplicates, which spreads its attempts
// over two instances.
type LockedCheckThenWrite struct {
	TwoTransactions
	locks *keyLocks
}

// NewLockedCheckThenWrite returns one process's LockedCheckThenWrite.
func NewLockedCheckThenWrite(db *pgxpool.Pool) LockedCheckThenWrite {
	return LockedCheckThenWrite{TwoTransactions: TwoTransactions{DB: db}, locks: &keyLocks{}}
}

// Apply runs TwoTransactions' check, write and mark under key's lock.
func (e LockedCheckThenWrite) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	defer e.locks.lock(key)()
	return e.TwoTransactions.Apply(ctx, key, in)
}

// FreshKeyOnRetry dedups correctly within one call, but counts in process
// memory the calls for a key that failed and applies a later call under a
// new key ("key#2", "key#3"): an application that makes an
// Idempotency-Key per attempt and keeps the count per process. A
// successor process starts the count again and replays. Create it with
// [NewFreshKeyOnRetry], one per process.
type FreshKeyOnRetry struct {
	DB *pgxpool.Pool

	mu     sync.Mutex
	failed map[effects.Key]int
}

// NewFreshKeyOnRetry returns a FreshKeyOnRetry with empty memory.
func NewFreshKeyOnRetry(db *pgxpool.Pool) *FreshKeyOnRetry {
	return &FreshKeyOnRetry{DB: db, failed: map[effects.Key]int{}}
}

// Contract claims EffectivelyOnce. It holds only for a successor process.
func (e *FreshKeyOnRetry) Contract() effects.Contract {
	return claim("counterexample: a new key for a call that follows a failed one, in the same process")
}

// Apply dedups under the key, or under key#n after n-1 failed calls.
func (e *FreshKeyOnRetry) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	e.mu.Lock()
	k := key
	if n := e.failed[key]; n > 0 {
		k = effects.Key(string(key) + "#" + strconv.Itoa(n+1))
	}
	e.mu.Unlock()
	res, err := dedupInsert(ctx, e.DB, k, in, true)
	if err != nil {
		e.mu.Lock()
		e.failed[key]++
		e.mu.Unlock()
	}
	return res, err
}

// EmptyFirstRef dedups correctly, but its first Apply returns no
// reference and each replay a new one: a caller that stores the first
// result and compares it with a replay's sees two different effects.
type EmptyFirstRef struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce, with replays of the first ref.
func (e EmptyFirstRef) Contract() effects.Contract {
	return claim("counterexample: first Apply has an empty ref, each replay a new one")
}

// Apply dedups, drops the first ref and makes one up for each replay.
func (e EmptyFirstRef) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	res, err := dedupInsert(ctx, e.DB, key, in, true)
	switch {
	case err != nil:
	case res.Status == effects.Applied:
		res.Ref = ""
	default:
		var b [6]byte
		_, _ = rand.Read(b[:])
		res.Ref = "replay-" + hex.EncodeToString(b[:])
	}
	return res, err
}

// ShortHashDedup dedups on the CRC-32 of the key (a compact column, "the
// odds of a clash are four billion to one"): two keys whose CRC-32 is the
// same are one key to it, and the second is refused as a reuse.
type ShortHashDedup struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce.
func (e ShortHashDedup) Contract() effects.Contract {
	return claim("counterexample: dedup on the key's CRC-32")
}

// Apply dedups on crc32(key).
func (e ShortHashDedup) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	return dedupTx(ctx, e.DB, key, strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(key))), 16), in, true, classify)
}

// UnescapedPathDedup keys its dedup record as a vendor would that is sent
// the key unescaped in a URL path: whatever follows a '?' or a '#' is not
// part of the path, so "q?x=1" and "q" are one key.
type UnescapedPathDedup struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce.
func (e UnescapedPathDedup) Contract() effects.Contract {
	return claim("counterexample: the key unescaped in a URL path")
}

// Apply dedups on the key as a URL path would carry it.
func (e UnescapedPathDedup) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	dk, _, _ := strings.Cut(string(key), "?")
	dk, _, _ = strings.Cut(dk, "#")
	return dedupTx(ctx, e.DB, key, dk, in, true, classify)
}
