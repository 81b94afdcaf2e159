package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/internal/sqlkeys"
)

// statementsInFlight is how many statements of one kind (Begin,
// Complete) a Journal on pool runs at once before calls start to share
// them: half the pool's connections, so that journal calls alone never
// queue for a connection (they wait for a statement to share instead,
// which costs no more and commits them together), and a pool large
// enough for every handler keeps one statement per call.
func statementsInFlight(pool *pgxpool.Pool) int {
	return max(1, int(pool.Config().MaxConns)/2)
}

// Journal is an [journal.Journal] in the effectively_journal table: the
// sent-record for effects outside the database (an email, a message to a
// broker without transactions, a call to an API past its key horizon). Each
// call is one autocommit statement (two when Begin finds the key taken or
// Complete finds it done). It is safe for concurrent use.
//
// Concurrent calls share statements (group commit): a Begin or Complete
// that arrives while statements of its kind hold half the pool's
// connections waits for one of them, and then every call that waited runs
// as one statement, so N handlers recording at once cost one round trip
// and one commit, not N, and the journal never holds the whole pool. A
// call that finds a free slot runs at once, alone; each call still waits
// only as long as its own context, and each gets its own result.
//
// A journal does not make an outside effect effectively once: a crash
// between the effect and Complete leaves the record pending, and once the
// lease expires the next attempt (Record.Attempt > 1) repeats the effect.
// Adapters that use it declare AtLeastOnce with that window.
type Journal struct {
	pool      *pgxpool.Pool
	scope     string
	begins    coalescer[beginReq, beginRes]
	completes coalescer[completeReq, error]
	lost      lostLeases // leases whose statements lost their replies
}

var _ journal.DoneJournal = (*Journal)(nil)

// NewJournal returns a Journal for keys in scope. The table must exist: see
// [Migrate]. It returns an [*effects.ConfigError] if pool is nil or scope
// is empty, not UTF-8 or contains NUL.
func NewJournal(pool *pgxpool.Pool, scope string) (*Journal, error) {
	const op = "postgres.NewJournal"
	if pool == nil {
		return nil, effects.ConfigErrorf(op, "pool", "nil")
	}
	if err := validateScope(op, scope); err != nil {
		return nil, err
	}
	j := &Journal{pool: pool, scope: scope}
	j.begins = coalescer[beginReq, beginRes]{limit: statementsInFlight(pool), key: func(r beginReq) string { return string(r.key) }, exec: j.beginBatch}
	j.completes = coalescer[completeReq, error]{limit: statementsInFlight(pool), key: func(r completeReq) string { return string(r.key) }, exec: j.completeBatch}
	return j, nil
}

// Begin claims key for one attempt lasting at most lease (at least 1 µs),
// measured by the database's clock. See [journal.Journal]: it returns a
// done Record, [effects.ErrInFlight] (whose [effects.RetryAfter] is what
// is left of the holder's lease), [effects.ErrKeyReused], or a Record
// whose lease the caller now holds, with Attempt 1 for a new key and one
// more for each takeover of an expired or released lease. A failure whose
// reply was lost is [effects.ErrAmbiguous]: the lease may have been taken,
// and the caller must not do the effect. The Journal remembers such a
// lease, at most until it expires: its next
// Begin of key takes it back at once, as the same attempt, where a Begin
// through another Journal, in another process, sees ErrInFlight until the
// lease expires.
func (j *Journal) Begin(ctx context.Context, key effects.Key, fingerprint []byte, lease time.Duration) (journal.Record, error) {
	if err := key.Validate(); err != nil {
		return journal.Record{}, err
	}
	if lease <= 0 {
		return journal.Record{}, fmt.Errorf("%s key %q: lease %v is not positive", opBegin, key, lease)
	}
	req := beginReq{key: key, fp: nonNil(fingerprint), micros: max(lease.Microseconds(), 1),
		token: newLeaseToken(), lost: j.lost.tokens(key)}
	sent := time.Now()
	var (
		rec journal.Record
		err error
	)
	switch res, end := j.begins.do(ctx, req); {
	case end != callDone:
		err = ended(ctx, opBegin, key, end)
	case res.again:
		rec, err = j.beginAlone(ctx, req)
	default:
		rec, err = res.rec, res.err
	}
	switch {
	case errors.Is(err, effects.ErrAmbiguous):
		j.lost.remember(key, req.token, sent, lease)
	case req.lost != nil && (err == nil || errors.Is(err, effects.ErrInFlight)):
		// The database answered with the record as it is: the tokens
		// named were taken back, or match nothing any more. (Not after
		// ErrKeyReused: that Begin had another payload, and a lost lease
		// of the key's own stays lost.)
		j.lost.forget(key, req.lost)
	}
	return rec, err
}

// ended is the error of a call whose caller's context ended before its
// result was known: nothing was sent for it, or its statement may have
// done it.
func ended(ctx context.Context, op string, key effects.Key, end callEnd) error {
	if end == callNotSent {
		return sqlkeys.Canceled(ctx, op, key, ctx.Err())
	}
	return effects.Ambiguous(op, key, fmt.Errorf("gave up waiting for the statement: %w", ctx.Err()))
}

const (
	opBegin    = "postgres.Journal.Begin"
	opComplete = "postgres.Journal.Complete"
)

type beginReq struct {
	key    effects.Key
	fp     []byte
	micros int64
	token  string   // the lease's holder token
	lost   []string // holder tokens of key's lost leases (nil: none)
}

type beginRes struct {
	rec   journal.Record
	err   error
	again bool // the record changed between the statements: begin again alone
}

// beginBatch runs the Begins of one coalesced statement. A Begin that
// would take a lost lease back runs alone (beginBatchSQL takes only
// leases that are free), at the same time as the statement.
func (j *Journal) beginBatch(ctx context.Context, reqs []beginReq) []beginRes {
	out := make([]beginRes, len(reqs))
	if len(reqs) == 1 {
		out[0].rec, out[0].err = j.beginAlone(ctx, reqs[0])
		return out
	}
	var (
		many  []int // indexes into reqs of the Begins that share a statement
		alone sync.WaitGroup
	)
	for i, r := range reqs {
		if r.lost != nil {
			alone.Go(func() { out[i].rec, out[i].err = j.beginAlone(ctx, r) })
		} else {
			many = append(many, i)
		}
	}
	switch len(many) {
	case 0:
	case 1:
		out[many[0]].rec, out[many[0]].err = j.beginAlone(ctx, reqs[many[0]])
	default:
		sub := make([]beginReq, len(many))
		for k, i := range many {
			sub[k] = reqs[i]
		}
		for k, res := range j.beginMany(ctx, sub) {
			out[many[k]] = res
		}
	}
	alone.Wait()
	return out
}

// beginMany runs Begins of distinct keys, none with lost leases, in one
// statement.
func (j *Journal) beginMany(ctx context.Context, reqs []beginReq) []beginRes {
	out := make([]beginRes, len(reqs))
	keys := make([]string, len(reqs))
	fps := make([][]byte, len(reqs))
	micros := make([]int64, len(reqs))
	tokens := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i], fps[i], micros[i], tokens[i] = string(r.key), r.fp, r.micros, r.token
	}
	taken := make(map[string]int, len(reqs))
	rows, err := j.pool.Query(ctx, beginBatchSQL, j.scope, keys, fps, micros, tokens)
	if err == nil {
		var (
			k string
			a int
		)
		_, err = pgx.ForEachRow(rows, []any{&k, &a}, func() error { taken[k] = a; return nil })
	}
	if err != nil {
		for i, r := range reqs {
			out[i].err = classify(ctx, opBegin, r.key, err, true, false).err
		}
		return out
	}
	var missing []string
	for i, r := range reqs {
		if a, ok := taken[string(r.key)]; ok {
			out[i].rec = journal.Record{Attempt: a}
		} else {
			missing = append(missing, string(r.key))
		}
	}
	if len(missing) == 0 {
		return out
	}
	found := make(map[string]journalRow, len(missing))
	rows, err = j.pool.Query(ctx, journalLookupManySQL, j.scope, missing)
	if err == nil {
		var row journalRow
		_, err = pgx.ForEachRow(rows, []any{&row.key, &row.fp, &row.rec.Done, &row.rec.Ref, &row.rec.Attempt, &row.leftMicros},
			func() error { found[row.key] = row; return nil })
	}
	for i, r := range reqs {
		if _, ok := taken[string(r.key)]; ok {
			continue
		}
		if err != nil {
			out[i].err = classify(ctx, opBegin, r.key, err, false, false).err
			continue
		}
		row, ok := found[string(r.key)]
		if !ok {
			out[i].again = true // deleted in between
			continue
		}
		out[i].rec, out[i].err, out[i].again = row.verdict(r)
	}
	return out
}

// journalRow is a record as journalLookupManySQL reads it.
type journalRow struct {
	key string
	fp  []byte
	rec journal.Record
	// leftMicros is what is left of its lease: positive while it is live.
	leftMicros int64
}

// verdict explains why a Begin for r took nothing: the key is done, in
// flight, begun with another fingerprint, or its lease expired since
// (again: begin once more).
func (row journalRow) verdict(r beginReq) (rec journal.Record, err error, again bool) {
	switch {
	case !bytes.Equal(row.fp, r.fp):
		return journal.Record{}, reused(opBegin, r.key), false
	case row.rec.Done:
		return row.rec, nil, false
	case row.leftMicros > 0:
		return journal.Record{}, &effects.Error{Kind: effects.ErrInFlight, Op: opBegin, Key: r.key,
			RetryAfter: time.Duration(row.leftMicros) * time.Microsecond,
			Err:        fmt.Errorf("attempt %d holds the lease", row.rec.Attempt)}, false
	}
	return journal.Record{}, nil, true
}

// beginAlone is Begin in statements of its own.
func (j *Journal) beginAlone(ctx context.Context, r beginReq) (journal.Record, error) {
	for range beginTries {
		var attempt int
		err := j.pool.QueryRow(ctx, beginSQL, j.scope, string(r.key), r.fp, r.micros, r.token, nonNil(r.lost)).Scan(&attempt)
		if err == nil {
			return journal.Record{Attempt: attempt}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return journal.Record{}, classify(ctx, opBegin, r.key, err, true, false).err
		}
		row, err := j.readRow(ctx, r.key)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // deleted in between: try again
		case err != nil:
			return journal.Record{}, classify(ctx, opBegin, r.key, err, false, false).err
		}
		if rec, err, again := row.verdict(r); !again {
			return rec, err
		}
		// The lease expired between the two statements: try again.
	}
	return journal.Record{}, &effects.Error{Kind: effects.ErrInFlight, Op: opBegin, Key: r.key,
		Err: errors.New("the record kept changing under concurrent attempts")}
}

// Complete marks key done with ref, the backend's reference to the effect,
// and drops the lease. Completing a done key again succeeds and keeps the
// first reference. It fails if key was never begun. A lost reply is
// [effects.ErrAmbiguous]; Complete is idempotent, so retry it.
func (j *Journal) Complete(ctx context.Context, key effects.Key, ref string) error {
	if err := key.Validate(); err != nil {
		return err
	}
	err, end := j.completes.do(ctx, completeReq{key: key, ref: ref})
	if end != callDone {
		return ended(ctx, opComplete, key, end)
	}
	return err
}

type completeReq struct {
	key effects.Key
	ref string
}

// completeBatch runs the Completes of one coalesced statement.
func (j *Journal) completeBatch(ctx context.Context, reqs []completeReq) []error {
	out := make([]error, len(reqs))
	if len(reqs) == 1 {
		out[0] = j.completeAlone(ctx, reqs[0])
		return out
	}
	// In key order, as beginBatchSQL locks its rows.
	byKey := slices.SortedFunc(slices.Values(reqs), func(a, b completeReq) int { return strings.Compare(string(a.key), string(b.key)) })
	keys := make([]string, len(reqs))
	refs := make([]string, len(reqs))
	for i, r := range byKey {
		keys[i], refs[i] = string(r.key), r.ref
	}
	updated := make(map[string]bool, len(reqs))
	rows, err := j.pool.Query(ctx, completeBatchSQL, j.scope, keys, refs)
	if err == nil {
		var k string
		_, err = pgx.ForEachRow(rows, []any{&k}, func() error { updated[k] = true; return nil })
	}
	if err != nil {
		for i, r := range reqs {
			out[i] = classify(ctx, opComplete, r.key, err, true, false).err
		}
		return out
	}
	var missing []string
	for _, k := range keys {
		if !updated[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return out
	}
	done := make(map[string]bool, len(missing))
	rows, err = j.pool.Query(ctx, journalDoneManySQL, j.scope, missing)
	if err == nil {
		var (
			k string
			d bool
		)
		_, err = pgx.ForEachRow(rows, []any{&k, &d}, func() error { done[k] = d; return nil })
	}
	for i, r := range reqs {
		if updated[string(r.key)] {
			continue
		}
		d, ok := done[string(r.key)]
		out[i] = j.completeVerdict(ctx, r.key, d, ok, err)
	}
	return out
}

// completeVerdict explains why a Complete updated nothing, from the
// record's done flag (found false: no record) or the error reading it.
func (j *Journal) completeVerdict(ctx context.Context, key effects.Key, done, found bool, err error) error {
	switch {
	case err != nil:
		return classify(ctx, opComplete, key, err, false, false).err
	case !found:
		return fmt.Errorf("%s key %q: not begun in scope %q", opComplete, key, j.scope)
	case !done: // released and re-begun concurrently? should not happen: the UPDATE saw it
		return effects.Transient(opComplete, key, errors.New("record changed concurrently"))
	}
	return nil
}

// completeAlone is Complete in statements of its own.
func (j *Journal) completeAlone(ctx context.Context, r completeReq) error {
	tag, err := j.pool.Exec(ctx, completeSQL, j.scope, string(r.key), r.ref)
	if err != nil {
		return classify(ctx, opComplete, r.key, err, true, false).err
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var done bool
	err = j.pool.QueryRow(ctx, journalDoneSQL, j.scope, string(r.key)).Scan(&done)
	if errors.Is(err, pgx.ErrNoRows) {
		return j.completeVerdict(ctx, r.key, false, false, nil)
	}
	return j.completeVerdict(ctx, r.key, done, true, err)
}

// Lookup reads key without writing: a done Record with its first ref, a
// zero Record when key is unknown or pending (begun, not done), or
// [effects.ErrKeyReused] when key was recorded with another fingerprint.
// One SELECT, no WAL. See [journal.DoneJournal].
func (j *Journal) Lookup(ctx context.Context, key effects.Key, fingerprint []byte) (journal.Record, error) {
	const op = "postgres.Journal.Lookup"
	if err := key.Validate(); err != nil {
		return journal.Record{}, err
	}
	row, err := j.readRow(ctx, key)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return journal.Record{}, nil
	case err != nil:
		return journal.Record{}, classify(ctx, op, key, err, false, false).err
	case !bytes.Equal(row.fp, nonNil(fingerprint)):
		return journal.Record{}, reused(op, key)
	case row.rec.Done:
		return row.rec, nil
	}
	return journal.Record{}, nil
}

// MarkDone records key done with ref in one statement, whether or not it
// was begun: a new record is created with fingerprint, a pending one is
// completed and its lease dropped. A key already done keeps its first ref
// and MarkDone returns nil; a key recorded with another fingerprint is
// [effects.ErrKeyReused] and stays as it was. A lost reply is
// [effects.ErrAmbiguous]; MarkDone is idempotent, so retry it. See
// [journal.DoneJournal].
func (j *Journal) MarkDone(ctx context.Context, key effects.Key, fingerprint []byte, ref string) error {
	const op = "postgres.Journal.MarkDone"
	if err := key.Validate(); err != nil {
		return err
	}
	fp := nonNil(fingerprint)
	for range beginTries {
		var wrote bool
		err := j.pool.QueryRow(ctx, markDoneSQL, j.scope, string(key), fp, ref).Scan(&wrote)
		if err == nil {
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return classify(ctx, op, key, err, true, false).err
		}
		row, err := j.readRow(ctx, key)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // pruned in between: insert it again
		case err != nil:
			return classify(ctx, op, key, err, false, false).err
		case !bytes.Equal(row.fp, fp):
			return reused(op, key)
		case row.rec.Done:
			return nil
		}
	}
	return effects.Transient(op, key, errors.New("the record kept changing under concurrent calls"))
}

// readRow reads key's record with journalLookupSQL; pgx.ErrNoRows when
// there is none.
func (j *Journal) readRow(ctx context.Context, key effects.Key) (journalRow, error) {
	row := journalRow{key: string(key)}
	err := j.pool.QueryRow(ctx, journalLookupSQL, j.scope, string(key)).Scan(&row.fp, &row.rec.Done, &row.rec.Ref, &row.rec.Attempt, &row.leftMicros)
	return row, err
}

// Release drops attempt's lease on key if it is not done, so the next Begin
// takes over at once (with Attempt one higher) instead of waiting for the
// lease to expire. Call it only after a failure that definitely did not do
// the effect. Releasing a done or unknown key, or with an attempt that is
// not the latest (its lease expired and another attempt took over),
// does nothing.
func (j *Journal) Release(ctx context.Context, key effects.Key, attempt int) error {
	const op = "postgres.Journal.Release"
	if err := key.Validate(); err != nil {
		return err
	}
	if _, err := j.pool.Exec(ctx, releaseSQL, j.scope, string(key), attempt); err != nil {
		return classify(ctx, op, key, err, true, false).err
	}
	return nil
}

// beginTries bounds Begin's retries when the record changes between its
// statement and the follow-up read (a lease expiring, a record pruned).
const beginTries = 3
