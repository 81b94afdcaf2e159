// Package counterexamples holds code that claims more than it does, to
// prove the conformance suite: its own tests run the suite on each one and
// fail unless the suite rejects it in a named scenario. A suite that passes
// a counterexample is a failing test. Only the module's tests use it; the
// model of an honest harness for adapter authors is the conformance
// package's Example_harness.
//
// Effects (conformance.Run) claim EffectivelyOnce and write a ledger row
// (the visible effect) into Postgres, in a table without a unique index:
//
//   - [TwoTransactions]: check the dedup table, insert the ledger row, mark
//     the key seen, each in its own transaction. Caught by concurrent
//     duplicates and by a lost reply.
//   - [FreshKeyPerAttempt]: a correct same-transaction dedup, but on a
//     failure it retries internally under a new key per attempt. Caught by a
//     lost reply.
//   - [BlindWrite]: no dedup at all. Caught by redelivery.
//   - [UncheckedFingerprint]: a correct dedup that claims to detect key
//     reuse but never compares payloads. Caught by key reuse.
//
// and one for each lie a scenario exists to catch:
//
//   - [ForgetfulDedup]: dedup records that vanish after two seconds,
//     declared "kept until pruned". Caught by horizon and late-redelivery.
//   - [AppliedOnCutCommit]: reports Applied when its COMMIT was cut and
//     nothing committed. Caught by cut-request, before any retry.
//   - [TransientOnLostReply]: reports a lost COMMIT reply as ErrTransient,
//     whose promise is that nothing was applied. Caught by lost-reply.
//   - [MemoryResolved]: resolves an unknown outcome from state in process
//     memory, which a successor process does not have. Caught by
//     lost-reply, which retries on a new instance, and by the two
//     concurrency scenarios, which race two instances.
//   - [PrefixDedup] and [CaseFoldDedup]: dedup on the first 44 bytes of
//     the key, or on the key folded to lower case. Caught by
//     distinct-keys.
//   - [StormCheat]: sheds writes under a burst of distinct keys and
//     remembers them as applied in memory. Caught by replay-storm, which
//     checks the warm-up and counts every key.
//   - [ChattyConstructor]: makes 70 round trips when it is built, more
//     than the sweep's bound, and lies like TransientOnLostReply. Caught by
//     lost-reply, which sweeps Apply's round trips only.
//   - [HangOnFault]: on a connection failure waits for its context instead
//     of returning. Reported by lost-reply as a hang of that Apply at that
//     round trip.
//   - [LockedCheckThenWrite]: check, write and mark behind a lock in
//     process memory: safe in one process, not in two. Caught by
//     concurrent-duplicates, which spreads its attempts over two
//     instances.
//   - [TrimmedKey]: trims white space off the key before validating it.
//     Caught by invalid-keys.
//   - [MemoryReuseCheck]: compares payloads in process memory. Caught by
//     key-reuse, which reuses the key on a new instance too.
//   - [FreshKeyOnRetry]: applies a call that follows a failed one under a
//     new key, counting failures in process memory (a vendor key per
//     attempt). Caught by lost-reply, which retries on the faulted
//     instance as well as on a new one.
//
// A successor that is a new process, in process.go:
//
//   - [ProcessScopedDedup]: dedups in the write's transaction under a
//     per-process session id and the key (Kafka's idempotent producer's
//     scope): every instance of one process agrees, the next process does
//     not. Caught by successor-process only.
//
// In redteam.go: [PanicOnReplay] (a panic in the code under test: reported
// as a failure by redelivery, without ending the test binary),
// [GroupCommit] (Applied before COMMIT: redelivery), [InvertedConflict]
// (Applied and Replayed swapped: redelivery), [LastRef] (a replay returns
// the instance's last ref: redelivery, distinct-keys), [CancelIsPermanent]
// (a cancelled context called permanent: cancel-mid-apply); journals
// [LookupLeasedDone] (lookup-mark-done) and [AttemptPerLease]
// (lease-expiry, fencing); sources [AckOnNextAck] (acked-stay-acked) and
// [AttemptFromZero] (unacked-after-close).
//
// Journals (conformance.RunJournal), in journals.go: [TwoLeases],
// [UnfencedRelease], [NoExpiry], [LastRefWins], [LookupIgnoresFingerprint],
// [MarkDoneNeedsBegin],
// [CompleteCreates], [FingerprintOnTakeover],
// [ShortLease]. Sources (conformance.RunSource), in sources.go:
// [AckOnNext], [AttemptAlwaysOne], [ReleaseAcks].
//
// Each of the following passes every scenario but the one named for it: [NewestKeysOnly] (key-capacity) and
// [PayloadForgotten] (horizon), in liars_more.go; [InstanceClock]
// (clock-skew), in journals_more.go; [NewestFirst] (publish-order),
// [StopsWhenCaughtUp] (published-while-running) and [AckFetchedOnClose]
// (close-with-prefetched), in sources_more.go; [ResumeAtFetchPosition],
// [CommitFetchedWhenIdle], [StalledIdleCommit] and [AttemptsLostOnRevoke]
// (rebalance-full-buffers), members of a fetch-ahead log ([FetchLog]), in
// round3_sources.go.
// Crash restart, in crash.go: [UnloggedDedup], a dedup table an immediate
// stop empties (crash-restart; backend-restart passes it). Slow replies,
// in slowreply.go: [OwnDeadline], its own deadline reported as
// ErrTransient although COMMIT may have landed (slow-reply). Plans
// (conformance.RunPlan), in plans.go: [SwallowingHandler] (lost-reply,
// cancel-mid-plan, kill-mid-plan), [OverclaimingHandler] (lost-reply) and
// [MisnamedWeakest] (plan-contract), over honest [MemStep] effects.
package counterexamples

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
)

// Schema creates the tables the counterexamples write. The ledger has no
// unique index on the event, so duplicates stay visible (attempt, used by
// MemoryResolved only, is unique where set).
const Schema = `
CREATE TABLE IF NOT EXISTS cx_ledger (id bigserial PRIMARY KEY, event_id text NOT NULL, cents bigint NOT NULL, attempt text UNIQUE);
CREATE INDEX IF NOT EXISTS cx_ledger_event ON cx_ledger (event_id);
CREATE TABLE IF NOT EXISTS cx_seen (key text PRIMARY KEY, cents bigint NOT NULL, seen_at timestamptz NOT NULL DEFAULT now());
`

// CountBatch returns the ledger rows of every event id in one query.
func CountBatch(ctx context.Context, db *pgxpool.Pool, eventIDs []string) ([]int, error) {
	rows, err := db.Query(ctx, `SELECT event_id, count(*) FROM cx_ledger WHERE event_id = ANY($1) GROUP BY event_id`, eventIDs)
	if err != nil {
		return nil, err
	}
	got := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		got[id] = n
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]int, len(eventIDs))
	for i, id := range eventIDs {
		out[i] = got[id]
	}
	return out, nil
}

// Age makes every dedup record d older, as if d had passed.
func Age(ctx context.Context, db *pgxpool.Pool, d time.Duration) error {
	_, err := db.Exec(ctx, `UPDATE cx_seen SET seen_at = seen_at - $1 * interval '1 microsecond'`, d.Microseconds())
	return err
}

// Payment is the input every counterexample applies: one ledger row.
type Payment struct {
	EventID string
	Cents   int64
}

// Count returns the ledger rows for eventID: the visible effects.
func Count(ctx context.Context, db *pgxpool.Pool, eventID string) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM cx_ledger WHERE event_id = $1`, eventID).Scan(&n)
	return n, err
}

// Total returns all ledger rows.
func Total(ctx context.Context, db *pgxpool.Pool) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM cx_ledger`).Scan(&n)
	return n, err
}

// claim is what every counterexample declares: the strongest contract.
func claim(enforcer string) effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: enforcer, DetectsKeyReuse: true}
}

// classify marks every database failure retryable, as an honest adapter
// would mark a failure whose outcome it does not know; the lie is elsewhere.
func classify(key effects.Key, err error) error {
	if err == nil {
		return nil
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return effects.Transient("counterexample", key, err)
	}
	return effects.Ambiguous("counterexample", key, err)
}

// TwoTransactions is a check-then-write handler: seen? insert;
// mark seen, in separate transactions.
type TwoTransactions struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce. It is a lie.
func (e TwoTransactions) Contract() effects.Contract {
	return claim("counterexample: dedup row written in a separate transaction")
}

// Apply checks, inserts and marks in three transactions.
func (e TwoTransactions) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
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
	if _, err := e.DB.Exec(ctx, `INSERT INTO cx_ledger (event_id, cents) VALUES ($1, $2)`, in.EventID, in.Cents); err != nil {
		return effects.Result{}, classify(key, err)
	}
	if _, err := e.DB.Exec(ctx, `INSERT INTO cx_seen (key, cents) VALUES ($1, $2) ON CONFLICT DO NOTHING`, string(key), in.Cents); err != nil {
		return effects.Result{}, classify(key, err)
	}
	return effects.Result{Status: effects.Applied}, nil
}

// dedupInsert is the honest core: claim and write in one transaction.
func dedupInsert(ctx context.Context, db *pgxpool.Pool, key effects.Key, in Payment, checkPayload bool) (effects.Result, error) {
	return dedupTx(ctx, db, key, string(key), in, checkPayload, classify)
}

// dedupTx claims dedupKey and writes in's ledger row in one transaction;
// onErr classifies every failure (the honest classify, or a lie).
func dedupTx(ctx context.Context, db *pgxpool.Pool, key effects.Key, dedupKey string, in Payment, checkPayload bool, onErr func(effects.Key, error) error) (effects.Result, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return effects.Result{}, onErr(key, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	tag, err := tx.Exec(ctx, `INSERT INTO cx_seen (key, cents) VALUES ($1, $2) ON CONFLICT DO NOTHING`, dedupKey, in.Cents)
	if err != nil {
		return effects.Result{}, onErr(key, err)
	}
	if tag.RowsAffected() == 0 {
		var cents int64
		if err := tx.QueryRow(ctx, `SELECT cents FROM cx_seen WHERE key = $1`, dedupKey).Scan(&cents); err != nil {
			return effects.Result{}, onErr(key, err)
		}
		if checkPayload && cents != in.Cents {
			return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Key: key}
		}
		return effects.Result{Status: effects.Replayed}, nil
	}
	if _, err := tx.Exec(ctx, `INSERT INTO cx_ledger (event_id, cents) VALUES ($1, $2)`, in.EventID, in.Cents); err != nil {
		return effects.Result{}, onErr(key, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return effects.Result{}, onErr(key, commitError{err})
	}
	return effects.Result{Status: effects.Applied}, nil
}

// commitError marks a failure of COMMIT itself, for the lies about it.
type commitError struct{ error }

func (e commitError) Unwrap() error { return e.error }

// FreshKeyPerAttempt dedups correctly but retries a failed attempt under a
// new key ("key#2", "key#3"), so a lost COMMIT reply is retried as a new
// effect: the bug of generating an Idempotency-Key per HTTP attempt.
type FreshKeyPerAttempt struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce. It is a lie.
func (e FreshKeyPerAttempt) Contract() effects.Contract {
	return claim("counterexample: same-transaction dedup, fresh key per attempt")
}

// Apply tries up to three attempts, each under its own key.
func (e FreshKeyPerAttempt) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		k := key
		if attempt > 1 {
			k = effects.Key(string(key) + "#" + strconv.Itoa(attempt))
		}
		var res effects.Result
		if res, err = dedupInsert(ctx, e.DB, k, in, true); err == nil {
			return res, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return effects.Result{}, err
}

// BlindWrite inserts the ledger row with no dedup at all.
type BlindWrite struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce. It is a lie.
func (e BlindWrite) Contract() effects.Contract { return claim("counterexample: no dedup") }

// Apply inserts a ledger row every time.
func (e BlindWrite) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	if _, err := e.DB.Exec(ctx, `INSERT INTO cx_ledger (event_id, cents) VALUES ($1, $2)`, in.EventID, in.Cents); err != nil {
		return effects.Result{}, classify(key, err)
	}
	return effects.Result{Status: effects.Applied}, nil
}

// UncheckedFingerprint dedups correctly in one transaction but never
// compares the stored payload, while claiming to detect key reuse.
type UncheckedFingerprint struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce with key-reuse detection. The detection
// is a lie.
func (e UncheckedFingerprint) Contract() effects.Contract {
	return claim("counterexample: same-transaction dedup, payload never compared")
}

// Apply claims and writes in one transaction, replaying any payload.
func (e UncheckedFingerprint) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	return dedupInsert(ctx, e.DB, key, in, false)
}
