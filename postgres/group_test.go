package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// groupCall is one Apply of a group formed by applyAsGroup.
type groupCall struct {
	key effects.Key
	in  payment
	ctx context.Context // nil: the test's
}

type groupOutcome struct {
	res effects.Result
	err error
}

// applyAsGroup runs calls as one group of fx: it holds fx's transaction
// slots, starts every Apply in order, waits until all of them queued, and
// releases them.
func applyAsGroup(t *testing.T, fx *postgres.Effect[payment], calls []groupCall) []groupOutcome {
	t.Helper()
	queued, release := postgres.HoldGroup(fx)
	out := make([]groupOutcome, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		ctx := c.ctx
		if ctx == nil {
			ctx = testCtx(t)
		}
		wg.Go(func() { out[i].res, out[i].err = fx.Apply(ctx, c.key, c.in) })
		waitQueued(t, queued, i+1) // in this order
	}
	release()
	wg.Wait()
	return out
}

// txidEffect is ledgerEffect whose ledger rows hold, as their amount,
// the id of the transaction that wrote them.
func txidEffect(t *testing.T, pool *pgxpool.Pool) *postgres.Effect[payment] {
	t.Helper()
	fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (ref string, err error) {
		err = tx.QueryRow(ctx, `INSERT INTO ledger (event_id, amount) VALUES ($1, txid_current()) RETURNING 'ledger:' || id`, p.EventID).Scan(&ref)
		return ref, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return fx
}

// transactions reports how many distinct transactions wrote the ledger
// rows of events (see txidEffect).
func transactions(t *testing.T, pool *pgxpool.Pool, events ...string) int {
	t.Helper()
	return count(t, pool, `SELECT count(DISTINCT amount) FROM ledger WHERE event_id = ANY($1)`, events)
}

func paymentCall(event string, amount int64) groupCall {
	return groupCall{key: effects.MustKey(event, "ledger"), in: payment{EventID: event, Amount: amount}}
}

func TestApplyGroupCommitsOnce(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	fx := txidEffect(t, pool)
	before, grouped := postgres.Groups(fx)
	if !grouped {
		t.Fatal("postgres.New without options has no grouped shape")
	}
	events := []string{"g1", "g2", "g3", "g4"}
	var calls []groupCall
	for _, e := range events {
		calls = append(calls, paymentCall(e, 1))
	}
	for i, o := range applyAsGroup(t, fx, calls) {
		if o.err != nil || o.res.Status != effects.Applied || o.res.Ref == "" {
			t.Fatalf("member %d = %+v, %v; want applied with a ref", i, o.res, o.err)
		}
		if got := rows(t, pool, events[i]); got != 1 {
			t.Fatalf("%s: ledger rows = %d, want 1", events[i], got)
		}
	}
	if n := transactions(t, pool, events...); n != 1 {
		t.Fatalf("the group's keys were committed by %d transactions, want 1", n)
	}
	if after, _ := postgres.Groups(fx); after-before != 1 {
		t.Fatalf("%d transactions ran, want 1", after-before)
	}
	// Each replays alone, with its ref.
	for _, c := range calls {
		res, err := fx.Apply(testCtx(t), c.key, c.in)
		if err != nil || res.Status != effects.Replayed {
			t.Fatalf("redelivery of %s = %+v, %v; want replayed", c.key, res, err)
		}
	}
}

func TestApplyWithoutGroupCommit(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	for _, opt := range []postgres.EffectOption{postgres.WithoutGroupCommit(), postgres.WithLookupFirst()} {
		fx := ledgerEffect(t, pool, nil, opt)
		if _, grouped := postgres.Groups(fx); grouped {
			t.Fatalf("an Effect with %T has the grouped shape", opt)
		}
	}
	_, err := postgres.NewPipelined(pool, "billing", func(context.Context, effects.Key, payment) (string, []postgres.Statement, error) {
		return "", nil, nil
	}, postgres.WithoutGroupCommit())
	var cfgErr *effects.ConfigError
	if !errors.As(err, &cfgErr) {
		t.Fatalf("NewPipelined(WithoutGroupCommit) = %v; want a ConfigError", err)
	}
}

// TestApplyGroupDuplicateMember: a member whose key was committed before
// fails its group's transaction and replays; the others run again alone
// and commit, wherever the duplicate is in the group.
func TestApplyGroupDuplicateMember(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	fx := txidEffect(t, pool)
	ctx := testCtx(t)
	for pos := range 3 {
		dup := fmt.Sprintf("dup%d", pos)
		first, err := fx.Apply(ctx, effects.MustKey(dup, "ledger"), payment{EventID: dup, Amount: 1})
		if err != nil {
			t.Fatal(err)
		}
		var calls []groupCall
		var fresh []string
		for i := range 3 {
			if i == pos {
				calls = append(calls, paymentCall(dup, 1))
				continue
			}
			e := fmt.Sprintf("new%d_%d", pos, i)
			fresh = append(fresh, e)
			calls = append(calls, paymentCall(e, 1))
		}
		for i, o := range applyAsGroup(t, fx, calls) {
			want := effects.Applied
			if i == pos {
				want = effects.Replayed
			}
			if o.err != nil || o.res.Status != want {
				t.Fatalf("duplicate at %d: member %d = %+v, %v; want %s", pos, i, o.res, o.err, want)
			}
			if i == pos && o.res.Ref != first.Ref {
				t.Fatalf("replayed ref %q, want %q", o.res.Ref, first.Ref)
			}
		}
		for _, e := range append(fresh, dup) {
			if got := rows(t, pool, e); got != 1 {
				t.Fatalf("%s: ledger rows = %d, want 1", e, got)
			}
		}
		if n := transactions(t, pool, fresh...); n != len(fresh) {
			t.Fatalf("duplicate at %d: the new keys were committed by %d transactions, want %d (each alone)", pos, n, len(fresh))
		}
	}
}

// TestApplyGroupFailingWrite: a member whose write fails (after writing a
// row) fails its group's transaction and gets its error; the others run
// again alone and commit.
func TestApplyGroupFailingWrite(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	errBad := errors.New("bad payment")
	fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		ref, err := writeLedger(ctx, tx, p)
		if err == nil && p.Amount < 0 {
			return "", errBad
		}
		return ref, err
	})
	if err != nil {
		t.Fatal(err)
	}
	checkCulpritGroups(t, pool, fx, "w", "its own error, not retryable", func(o groupOutcome) bool {
		return errors.Is(o.err, errBad) && effects.ClassOf(o.err) != effects.Retryable
	})
}

// TestApplyGroupLostReplyAtEveryRoundTrip drops the server's reply to the
// n-th message of a group of three, for every n until the group needs
// fewer: every member gets the same retryable verdict (ErrAmbiguous for a
// lost COMMIT reply), and each retry under its own key leaves one ledger
// row per key.
func TestApplyGroupLostReplyAtEveryRoundTrip(t *testing.T) {
	var f faults
	pool := newPool(t, newDB(t), func(c *pgxpool.Config) { f.configure(c); c.MaxConns = 2 })
	fx := ledgerEffect(t, pool, nil)
	ambiguous := 0
	for n := int64(1); ; n++ {
		var calls []groupCall
		for i := range 3 {
			calls = append(calls, paymentCall(fmt.Sprintf("lost%d_%d", n, i), 1))
		}
		warm(t, pool, 2) // no connection is dialled while faults count
		before := f.fired.Load()
		f.countdown.Store(n)
		out := applyAsGroup(t, fx, calls)
		f.countdown.Store(0)
		if f.fired.Load() == before {
			if n < 5 { // BEGIN, 3 writes, the keys' INSERTs with COMMIT: n+2
				t.Fatalf("no reply dropped at round trip %d of a group of 3", n)
			}
			break
		}
		for i, o := range out {
			if o.err == nil || effects.ClassOf(o.err) != effects.Retryable {
				t.Fatalf("round trip %d: member %d = %+v, %v; want a retryable error", n, i, o.res, o.err)
			}
			if i > 0 && errors.Is(o.err, effects.ErrAmbiguous) != errors.Is(out[0].err, effects.ErrAmbiguous) {
				t.Fatalf("round trip %d: members got different verdicts: %v and %v", n, out[0].err, o.err)
			}
		}
		if errors.Is(out[0].err, effects.ErrAmbiguous) {
			ambiguous++
		}
		for _, c := range calls {
			res, err := fx.Apply(testCtx(t), c.key, c.in)
			if err != nil {
				t.Fatalf("round trip %d: retry of %s: %v", n, c.key, err)
			}
			if got := rows(t, pool, c.in.EventID); got != 1 {
				t.Fatalf("round trip %d: %s has %d ledger rows after the retry (%s), want 1", n, c.in.EventID, got, res.Status)
			}
		}
	}
	if ambiguous != 1 {
		t.Fatalf("%d round trips made the group ambiguous, want 1 (the COMMIT's)", ambiguous)
	}
}

// TestApplyGroupCanceledWhileQueued: an Apply whose context ends while it
// waits for the next group leaves it: the context's error, nothing
// written; the others commit.
func TestApplyGroupCanceledWhileQueued(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	fx := ledgerEffect(t, pool, nil)
	queued, release := postgres.HoldGroup(fx)
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() {
		_, err := fx.Apply(ctx, effects.MustKey("gone", "ledger"), payment{EventID: "gone", Amount: 1})
		done <- err
	}()
	waitQueued(t, queued, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || errors.Is(err, effects.ErrAmbiguous) {
		t.Fatalf("Apply canceled while queued = %v; want context.Canceled", err)
	}
	release()
	if got := rows(t, pool, "gone"); got != 0 {
		t.Fatalf("ledger rows of a canceled Apply = %d, want 0", got)
	}
}

// TestApplyGroupConcurrentDuplicates applies a few keys from many
// goroutines at once, so that groups in flight together hold the same
// keys: each key's effect exists once, applied by exactly one call.
func TestApplyGroupConcurrentDuplicates(t *testing.T) {
	pool := newPool(t, newDB(t), func(c *pgxpool.Config) { c.MaxConns = 4 })
	fx := ledgerEffect(t, pool, nil)
	const keys, workers, rounds = 6, 12, 5
	for r := range rounds {
		applied := make([]int, keys)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for k := range keys {
					e := fmt.Sprintf("cd%d_%d", r, (k+w)%keys)
					res, err := fx.Apply(testCtx(t), effects.MustKey(e, "ledger"), payment{EventID: e, Amount: 1})
					if err != nil {
						t.Errorf("%s: %v", e, err)
						return
					}
					if res.Status == effects.Applied {
						mu.Lock()
						applied[(k+w)%keys]++
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		for k := range keys {
			e := fmt.Sprintf("cd%d_%d", r, k)
			if got := rows(t, pool, e); got != 1 || applied[k] != 1 {
				t.Fatalf("%s: %d ledger rows, applied %d times; want 1 and 1", e, got, applied[k])
			}
		}
	}
	if n, _ := postgres.Groups(fx); n >= keys*workers*rounds {
		t.Logf("no groups formed: %d transactions for %d Applies", n, keys*workers*rounds)
	}
}

// warm opens n connections of pool, so that what follows dials none.
func warm(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	conns := make([]*pgxpool.Conn, n)
	for i := range conns {
		c, err := pool.Acquire(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Ping(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
}

// TestApplyGroupCommitFails: a member's write that breaks a deferred
// constraint fails its group's COMMIT; each member then runs alone, so
// that the others apply and the error is the culprit's only.
func TestApplyGroupCommitFails(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	mustExec(t, pool, `CREATE TABLE deferred_uniq (v int UNIQUE DEFERRABLE INITIALLY DEFERRED)`)
	fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		if p.Amount < 0 { // breaks the constraint, seen only at COMMIT
			if _, err := tx.Exec(ctx, `INSERT INTO deferred_uniq VALUES (1), (1)`); err != nil {
				return "", err
			}
		}
		return writeLedger(ctx, tx, p)
	})
	if err != nil {
		t.Fatal(err)
	}
	calls := []groupCall{paymentCall("cf0", 1), paymentCall("cf1", -1), paymentCall("cf2", 1)}
	out := applyAsGroup(t, fx, calls)
	for i, o := range out {
		want := 1
		switch {
		case i == 1 && (o.err == nil || effects.ClassOf(o.err) == effects.Retryable):
			t.Fatalf("the culprit = %+v, %v; want its commit's error, not retryable", o.res, o.err)
		case i == 1:
			want = 0
		case o.err != nil || o.res.Status != effects.Applied:
			t.Fatalf("member %d = %+v, %v; want applied (alone, after its group's COMMIT failed)", i, o.res, o.err)
		}
		if got := rows(t, pool, calls[i].in.EventID); got != want {
			t.Fatalf("%s: %d ledger rows, want %d", calls[i].in.EventID, got, want)
		}
	}
}

// TestApplyGroupWriteIgnoresAnError: a member whose write ignores a
// failed statement fails its group's transaction; it gets the error (or
// replays, if its key was committed before), and the others apply.
func TestApplyGroupWriteIgnoresAnError(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	mustExec(t, pool, `CREATE TABLE receipts (event_id text PRIMARY KEY)`)
	mustExec(t, pool, `INSERT INTO receipts VALUES ('taken')`)
	fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		ref, err := writeLedger(ctx, tx, p)
		if err == nil && p.Amount < 0 {
			_, _ = tx.Exec(ctx, `INSERT INTO receipts (event_id) VALUES ('taken')`) // its error ignored
		}
		return ref, err
	})
	if err != nil {
		t.Fatal(err)
	}
	checkCulpritGroups(t, pool, fx, "ig", "an error, not retryable", func(o groupOutcome) bool {
		return o.err != nil && effects.ClassOf(o.err) != effects.Retryable
	})
}

// TestApplyGroupMemberTurnsAsyncCommitOn: a member whose write turns
// synchronous_commit off for the group's transaction gets ErrAsyncCommit
// and writes nothing; the others, whose keys' INSERTs the setting failed
// too, run again alone and apply.
func TestApplyGroupMemberTurnsAsyncCommitOn(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		if p.Amount < 0 {
			if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
				return "", err
			}
		}
		return writeLedger(ctx, tx, p)
	})
	if err != nil {
		t.Fatal(err)
	}
	checkCulpritGroups(t, pool, fx, "ac", "ErrAsyncCommit", func(o groupOutcome) bool {
		return errors.Is(o.err, postgres.ErrAsyncCommit)
	})
}

// checkCulpritGroups applies, for each position in a group of three, a
// group whose member there is the culprit (amount -1), with keys in the
// reverse of arrival order, so that the culprit's key's INSERT is not
// always the first the group sends. The culprit's outcome must satisfy
// culprit (want describes it) and leave no ledger row; every other member
// must apply and leave one.
func checkCulpritGroups(t *testing.T, pool *pgxpool.Pool, fx *postgres.Effect[payment], prefix, want string, culprit func(groupOutcome) bool) {
	t.Helper()
	for pos := range 3 {
		calls := make([]groupCall, 3)
		for i := range calls {
			amount := int64(1)
			if i == pos {
				amount = -1
			}
			calls[i] = paymentCall(fmt.Sprintf("%s%d_%d", prefix, pos, 2-i), amount)
		}
		for i, o := range applyAsGroup(t, fx, calls) {
			rowsWanted := 1
			switch {
			case i == pos && !culprit(o):
				t.Fatalf("culprit at %d = %+v, %v; want %s", pos, o.res, o.err, want)
			case i == pos:
				rowsWanted = 0
			case o.err != nil || o.res.Status != effects.Applied:
				t.Fatalf("culprit at %d: member %d = %+v, %v; want applied", pos, i, o.res, o.err)
			}
			if got := rows(t, pool, calls[i].in.EventID); got != rowsWanted {
				t.Fatalf("culprit at %d: %s has %d ledger rows, want %d", pos, calls[i].in.EventID, got, rowsWanted)
			}
		}
	}
}
