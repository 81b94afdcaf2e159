package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// ledgerEffect returns the tests' effect on pool, counting write calls.
func ledgerEffect(t testing.TB, pool *pgxpool.Pool, calls *atomic.Int64, opts ...postgres.EffectOption) *postgres.Effect[payment] {
	t.Helper()
	fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		if calls != nil {
			calls.Add(1)
		}
		return writeLedger(ctx, tx, p)
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return fx
}

func rows(t testing.TB, pool *pgxpool.Pool, eventID string) int {
	t.Helper()
	return count(t, pool, `SELECT count(*) FROM ledger WHERE event_id = $1`, eventID)
}

// keyRowsNaming counts the rows of effectively_keys whose key contains
// eventID, in any scope and for any step (keyRows counts one key's).
func keyRowsNaming(t testing.TB, pool *pgxpool.Pool, eventID string) int {
	t.Helper()
	return count(t, pool, `SELECT count(*) FROM effectively_keys WHERE key LIKE $1`, "%"+eventID+"%")
}

func TestEffectContract(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	c := ledgerEffect(t, pool, nil).Contract()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Guarantee != effects.EffectivelyOnce || !c.DetectsKeyReuse || c.Horizon != 0 {
		t.Fatalf("contract = %v", c)
	}
}

// eventFingerprinted is a payment whose fingerprint is its event id only.
type eventFingerprinted payment

func (p eventFingerprinted) Fingerprint() ([]byte, error) {
	return effects.Fingerprint([]byte(p.EventID)), nil
}

// ptrFingerprinted has a Fingerprint method on its pointer only, which an
// Effect of ptrFingerprinted values would never call.
type ptrFingerprinted struct{}

func (*ptrFingerprinted) Fingerprint() ([]byte, error) { return nil, nil }

func TestNewRefusesBadArguments(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	write := func(ctx context.Context, tx pgx.Tx, p payment) (string, error) { return "", nil }
	for name, tc := range map[string]struct {
		option string
		new    func() error
	}{
		"nil pool":     {"pool", func() error { _, err := postgres.New(nil, "s", write); return err }},
		"nil write":    {"write", func() error { _, err := postgres.New[payment](pool, "s", nil); return err }},
		"empty scope":  {"scope", func() error { _, err := postgres.New(pool, "", write); return err }},
		"NUL in scope": {"scope", func() error { _, err := postgres.New(pool, "a\x00b", write); return err }},
		"Fingerprint declared on *In only": {"Fingerprint", func() error {
			_, err := postgres.New(pool, "s", func(context.Context, pgx.Tx, ptrFingerprinted) (string, error) { return "", nil })
			return err
		}},
		"negative retries": {"WithMaxRetries", func() error {
			_, err := postgres.New(pool, "s", write, postgres.WithMaxRetries(-1))
			return err
		}},
		"unknown isolation level": {"WithIsolation", func() error {
			_, err := postgres.New(pool, "s", write, postgres.WithIsolation("snapshot"))
			return err
		}},
		"NewPipelined without group commit": {"WithoutGroupCommit", func() error {
			_, err := postgres.NewPipelined(pool, "s", func(context.Context, effects.Key, payment) (string, []postgres.Statement, error) {
				return "", nil, nil
			}, postgres.WithoutGroupCommit())
			return err
		}},
		"nil precheck filter": {"WithPrecheck", func() error {
			_, err := postgres.ApplyBatch(testCtx(t), pool, "s", nil, func(context.Context, pgx.Tx, int) (string, error) { return "", nil },
				postgres.WithPrecheck(nil))
			return err
		}},
		"ApplyBatch without a pool": {"pool", func() error {
			_, err := postgres.ApplyBatch(testCtx(t), nil, "s", nil, func(context.Context, pgx.Tx, int) (string, error) { return "", nil })
			return err
		}},
		"NewJournal without a pool": {"pool", func() error { _, err := postgres.NewJournal(nil, "s"); return err }},
		"negative prune batch": {"batchSize", func() error {
			_, err := postgres.Prune(testCtx(t), pool, "s", time.Now(), -1)
			return err
		}},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.new()
			var ce *effects.ConfigError
			if !errors.As(err, &ce) || ce.Option != tc.option || !errors.Is(err, effects.ErrInvalidConfig) {
				t.Fatalf("err = %v, want a ConfigError about %s", err, tc.option)
			}
		})
	}
	// A nil option is ignored, and every option New heeds is accepted.
	if _, err := postgres.New(pool, "s", write, nil, postgres.WithMaxRetries(0), postgres.WithIsolation(pgx.Serializable),
		postgres.AllowAsyncCommit(), postgres.WithLookupFirst(), postgres.WithoutGroupCommit()); err != nil {
		t.Fatalf("New with valid options: %v", err)
	}
}

func TestApply(t *testing.T) {
	url := newDB(t)
	pool := newPool(t, url, func(c *pgxpool.Config) { c.MaxConns = 40 })

	// By default a rare duplicate runs its write in a transaction that
	// rolls back (the key's INSERT finds it); looked up first, it does not.
	for name, tc := range map[string]struct {
		opts   []postgres.EffectOption
		writes int64
	}{
		"":                   {nil, 4},
		" (WithLookupFirst)": {[]postgres.EffectOption{postgres.WithLookupFirst()}, 1},
	} {
		t.Run("redelivery after commit replays with the same ref"+name, func(t *testing.T) {
			ctx := testCtx(t)
			var calls atomic.Int64
			fx := ledgerEffect(t, pool, &calls, tc.opts...)
			id := "evt_redelivery" + strings.ReplaceAll(name, " ", "_")
			key := effects.MustKey(id, "ledger")
			p := payment{EventID: id, Amount: 100}
			first, err := fx.Apply(ctx, key, p)
			if err != nil || first.Status != effects.Applied || !strings.HasPrefix(first.Ref, "ledger:") {
				t.Fatalf("first Apply = %+v, %v; want applied with a ledger ref", first, err)
			}
			for range 3 {
				again, err := fx.Apply(ctx, key, p)
				if err != nil || again != (effects.Result{Status: effects.Replayed, Ref: first.Ref}) {
					t.Fatalf("redelivery = %+v, %v; want replayed %s", again, err, first.Ref)
				}
			}
			if n := rows(t, pool, p.EventID); n != 1 || calls.Load() != tc.writes {
				t.Fatalf("ledger rows = %d, writes = %d; want 1, %d", n, calls.Load(), tc.writes)
			}
		})
	}

	t.Run("a replay storm does not change the shape", func(t *testing.T) {
		ctx := testCtx(t)
		for _, lookupFirst := range []bool{false, true} {
			var calls atomic.Int64
			var opts []postgres.EffectOption
			if lookupFirst {
				opts = append(opts, postgres.WithLookupFirst())
			}
			fx := ledgerEffect(t, pool, &calls, opts...)
			const n = 100
			keys := make([]effects.Key, n)
			for i := range keys {
				keys[i] = effects.MustKey(fmt.Sprintf("evt_storm_%t_%d", lookupFirst, i), "ledger")
				if _, err := fx.Apply(ctx, keys[i], payment{EventID: keys[i].String(), Amount: 1}); err != nil {
					t.Fatal(err)
				}
			}
			for i, k := range keys {
				before := calls.Load()
				res, err := fx.Apply(ctx, k, payment{EventID: k.String(), Amount: 1})
				if err != nil || res.Status != effects.Replayed {
					t.Fatalf("redelivery %d = %+v, %v; want replayed", i, res, err)
				}
				// Looked up first, no duplicate runs its write; by
				// default every one does, the last of the storm too.
				if ran := calls.Load() - before; (ran == 1) == lookupFirst {
					t.Fatalf("lookup first %t: duplicate %d ran %d writes", lookupFirst, i, ran)
				}
			}
		}
	})

	t.Run("32 concurrent duplicates apply once", func(t *testing.T) {
		ctx := testCtx(t)
		fx := ledgerEffect(t, pool, nil)
		key := effects.MustKey("evt_concurrent", "ledger")
		p := payment{EventID: "evt_concurrent", Amount: 100}
		const n = 32
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			results [n]effects.Result
			errs    [n]error
		)
		for i := range n {
			wg.Go(func() {
				<-start
				results[i], errs[i] = fx.Apply(ctx, key, p)
			})
		}
		close(start)
		wg.Wait()
		applied := 0
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("Apply %d: %v", i, errs[i])
			}
			if results[i].Status == effects.Applied {
				applied++
			}
			if results[i].Ref != results[0].Ref {
				t.Errorf("Apply %d ref = %q, Apply 0 ref = %q", i, results[i].Ref, results[0].Ref)
			}
		}
		if applied != 1 {
			t.Errorf("%d Applied results, want 1", applied)
		}
		if got := rows(t, pool, p.EventID); got != 1 {
			t.Errorf("ledger rows = %d, want 1", got)
		}
	})

	t.Run("key reused with another payload is refused", func(t *testing.T) {
		ctx := testCtx(t)
		fx := ledgerEffect(t, pool, nil)
		key := effects.MustKey("evt_reuse", "ledger")
		if _, err := fx.Apply(ctx, key, payment{EventID: "evt_reuse", Amount: 100}); err != nil {
			t.Fatal(err)
		}
		_, err := fx.Apply(ctx, key, payment{EventID: "evt_reuse", Amount: 999})
		if !errors.Is(err, effects.ErrKeyReused) || effects.ClassOf(err) == effects.Retryable {
			t.Fatalf("Apply with another payload = %v; want permanent ErrKeyReused", err)
		}
		if got := count(t, pool, `SELECT count(*) FROM ledger WHERE event_id = 'evt_reuse'`); got != 1 {
			t.Errorf("ledger rows = %d, want 1", got)
		}
	})

	t.Run("custom fingerprint decides what counts as the same payload", func(t *testing.T) {
		ctx := testCtx(t)
		fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p eventFingerprinted) (string, error) {
			return writeLedger(ctx, tx, payment(p))
		})
		if err != nil {
			t.Fatal(err)
		}
		key := effects.MustKey("evt_fp", "ledger")
		if _, err := fx.Apply(ctx, key, eventFingerprinted{EventID: "evt_fp", Amount: 1}); err != nil {
			t.Fatal(err)
		}
		res, err := fx.Apply(ctx, key, eventFingerprinted{EventID: "evt_fp", Amount: 2})
		if err != nil || res.Status != effects.Replayed {
			t.Fatalf("Apply = %+v, %v; want replayed (amount is not fingerprinted)", res, err)
		}
	})

	t.Run("invalid keys are refused before any I/O", func(t *testing.T) {
		fresh := newPool(t, newDB(t), nil)
		var calls atomic.Int64
		fx := ledgerEffect(t, fresh, &calls)
		for name, key := range map[string]effects.Key{
			"empty":        "",
			"10 KB":        effects.Key(strings.Repeat("k", 10<<10)),
			"NUL bytes":    "evt\x00ledger",
			"invalid UTF8": "evt\xff\xfe",
		} {
			t.Run(name, func(t *testing.T) {
				_, err := fx.Apply(testCtx(t), key, payment{EventID: "evt_invalid", Amount: 1})
				if !errors.Is(err, effects.ErrInvalidKey) || effects.ClassOf(err) == effects.Retryable {
					t.Fatalf("Apply = %v; want permanent ErrInvalidKey", err)
				}
			})
		}
		if k, l := count(t, fresh, `SELECT count(*) FROM effectively_keys`), count(t, fresh, `SELECT count(*) FROM ledger`); k != 0 || l != 0 || calls.Load() != 0 {
			t.Fatalf("keys = %d, ledger rows = %d, writes = %d; want 0, 0, 0", k, l, calls.Load())
		}
	})

	t.Run("write error rolls back and is returned unchanged", func(t *testing.T) {
		ctx := testCtx(t)
		errDeclined := errors.New("card declined")
		fail := true
		fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
			ref, err := writeLedger(ctx, tx, p)
			if err == nil && fail {
				return "", errDeclined
			}
			return ref, err
		})
		if err != nil {
			t.Fatal(err)
		}
		key := effects.MustKey("evt_declined", "ledger")
		p := payment{EventID: "evt_declined", Amount: 1}
		_, err = fx.Apply(ctx, key, p)
		if !errors.Is(err, errDeclined) || effects.ClassOf(err) == effects.Retryable {
			t.Fatalf("Apply = %v; want the write's error, not retryable", err)
		}
		if got := rows(t, pool, p.EventID); got != 0 {
			t.Fatalf("ledger rows = %d after a failed write, want 0", got)
		}
		fail = false
		if res, err := fx.Apply(ctx, key, p); err != nil || res.Status != effects.Applied {
			t.Fatalf("retry = %+v, %v; want applied (the key was released)", res, err)
		}
	})

	t.Run("empty ref is not stored", func(t *testing.T) {
		ctx := testCtx(t)
		fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
			_, err := writeLedger(ctx, tx, p)
			return "", err
		})
		if err != nil {
			t.Fatal(err)
		}
		key := effects.MustKey("evt_noref", "ledger")
		for _, want := range []effects.Status{effects.Applied, effects.Replayed} {
			res, err := fx.Apply(ctx, key, payment{EventID: "evt_noref"})
			if err != nil || res != (effects.Result{Status: want}) {
				t.Fatalf("Apply = %+v, %v; want %v with no ref", res, err, want)
			}
		}
	})

	t.Run("backend terminated inside write is transient, retry applies once", func(t *testing.T) {
		ctx := testCtx(t)
		var calls atomic.Int64
		fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
			if calls.Add(1) == 1 {
				pid := tx.Conn().PgConn().PID()
				var ok bool
				if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, int32(pid)).Scan(&ok); err != nil || !ok {
					t.Errorf("pg_terminate_backend = %v, %v", ok, err)
				}
			}
			return writeLedger(ctx, tx, p)
		})
		if err != nil {
			t.Fatal(err)
		}
		key := effects.MustKey("evt_terminated", "ledger")
		p := payment{EventID: "evt_terminated", Amount: 1}
		_, err = fx.Apply(ctx, key, p)
		if effects.ClassOf(err) != effects.Retryable || !errors.Is(err, effects.ErrTransient) {
			t.Fatalf("Apply on a terminated backend = %v; want ErrTransient", err)
		}
		t.Logf("error: %v", err)
		if got := rows(t, pool, p.EventID); got != 0 {
			t.Fatalf("ledger rows = %d, want 0", got)
		}
		res, err := fx.Apply(ctx, key, p)
		if err != nil || res.Status != effects.Applied {
			t.Fatalf("retry = %+v, %v; want applied", res, err)
		}
		if got := rows(t, pool, p.EventID); got != 1 {
			t.Fatalf("ledger rows = %d, want 1", got)
		}
	})

	t.Run("context cancelled inside write returns the context error, retry applies", func(t *testing.T) {
		ctx, cancel := context.WithCancel(testCtx(t))
		fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
			cancel()
			return writeLedger(ctx, tx, p)
		})
		if err != nil {
			t.Fatal(err)
		}
		key := effects.MustKey("evt_cancel", "ledger")
		p := payment{EventID: "evt_cancel", Amount: 1}
		_, err = fx.Apply(ctx, key, p)
		if !errors.Is(err, context.Canceled) || errors.Is(err, effects.ErrAmbiguous) || effects.ClassOf(err) != effects.Retryable {
			t.Fatalf("Apply = %v; want context.Canceled, not ambiguous, retryable", err)
		}
		res, err := ledgerEffect(t, pool, nil).Apply(testCtx(t), key, p)
		if err != nil || res.Status != effects.Applied || rows(t, pool, p.EventID) != 1 {
			t.Fatalf("retry = %+v, %v, %d rows; want applied, 1 row", res, err, rows(t, pool, p.EventID))
		}
	})
}

func TestApplyLostCommitReply(t *testing.T) {
	var f faults
	pool := newPool(t, newDB(t), func(c *pgxpool.Config) {
		f.configure(c)
		// Send SQL text with every statement, so that faultConn sees the
		// COMMIT in Apply's pipelined UPDATE + COMMIT.
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	})
	for i, tc := range []struct {
		name  string
		write func(context.Context, pgx.Tx, payment) (string, error)
	}{
		{"ref pipelined with COMMIT", writeLedger},
		{"plain COMMIT", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
			_, err := writeLedger(ctx, tx, p)
			return "", err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			fx, err := postgres.New(pool, "billing", tc.write)
			if err != nil {
				t.Fatal(err)
			}
			event := "evt_lost_commit_" + strconv.Itoa(i) // no "COMMIT" in it: faultConn looks for that
			key := effects.MustKey(event, "ledger")
			p := payment{EventID: event, Amount: 1}

			before := f.fired.Load()
			f.onCommit.Store(true)
			_, err = fx.Apply(ctx, key, p)
			if f.fired.Load() != before+1 {
				t.Fatalf("the COMMIT reply was not dropped")
			}
			if !errors.Is(err, effects.ErrAmbiguous) || effects.ClassOf(err) != effects.Retryable {
				t.Fatalf("Apply with a lost COMMIT reply = %v; want ErrAmbiguous", err)
			}
			t.Logf("error: %v", err)
			// The server did commit: the retry with the same key must find it.
			res, err := fx.Apply(ctx, key, p)
			if err != nil || res.Status != effects.Replayed {
				t.Fatalf("retry = %+v, %v; want replayed", res, err)
			}
			if got := rows(t, pool, p.EventID); got != 1 {
				t.Fatalf("ledger rows = %d, want 1", got)
			}
			var ref string
			if err := pool.QueryRow(ctx, `SELECT 'ledger:' || id FROM ledger WHERE event_id = $1`, event).Scan(&ref); err != nil {
				t.Fatal(err)
			}
			if i == 0 && res.Ref != ref {
				t.Fatalf("replayed ref = %q, want the committed row's %q", res.Ref, ref)
			}
		})
	}
}

// TestApplyLostReplyAtEveryRoundTrip drops the server's reply to the n-th
// message the client writes, for every n until Apply needs fewer round
// trips, and checks that the failure is retryable and that retrying the
// same key leaves exactly one ledger row: replayed if the failure was
// ambiguous and the commit happened, applied otherwise. It runs Apply as it
// starts (the key's INSERT finds duplicates) and with WithLookupFirst.
func TestApplyLostReplyAtEveryRoundTrip(t *testing.T) {
	t.Run("insert finds duplicates", func(t *testing.T) { testApplyLostReplyAtEveryRoundTrip(t) })
	t.Run("WithLookupFirst", func(t *testing.T) { testApplyLostReplyAtEveryRoundTrip(t, postgres.WithLookupFirst()) })
}

func testApplyLostReplyAtEveryRoundTrip(t *testing.T, opts ...postgres.EffectOption) {
	var f faults
	pool := newPool(t, newDB(t), func(c *pgxpool.Config) { f.configure(c); c.MaxConns = 1 })
	ctx := testCtx(t)
	fx := ledgerEffect(t, pool, nil, opts...)
	kinds := map[string]int{}
	var trace []string
	for n := int64(1); ; n++ {
		if n > 40 {
			t.Fatal("Apply still losing replies after 40 round trips")
		}
		event := "evt_sweep_" + strconv.FormatInt(n, 10)
		key := effects.MustKey(event, "ledger")
		p := payment{EventID: event, Amount: n}
		before := f.fired.Load()
		f.countdown.Store(n)
		_, err := fx.Apply(ctx, key, p)
		f.countdown.Store(0)
		if f.fired.Load() == before {
			if err != nil {
				t.Fatalf("n=%d: Apply without a fault: %v", n, err)
			}
			t.Logf("Apply took %d writes; reply dropped after write n gave: %s", n-1, strings.Join(trace, ", "))
			break
		}
		kind := "success"
		switch {
		case errors.Is(err, effects.ErrAmbiguous):
			kind = "ambiguous"
		case errors.Is(err, effects.ErrTransient):
			kind = "transient"
		case err != nil:
			t.Fatalf("n=%d: Apply = %v; want ErrAmbiguous or ErrTransient", n, err)
		}
		kinds[kind]++
		trace = append(trace, fmt.Sprintf("%d:%s", n, kind))
		committed := rows(t, pool, event)
		if kind == "transient" && committed != 0 {
			t.Errorf("n=%d: transient failure, but %d ledger rows committed", n, committed)
		}
		res, err := fx.Apply(ctx, key, p)
		if err != nil {
			t.Fatalf("n=%d: retry after %s: %v", n, kind, err)
		}
		want := effects.Applied
		if committed == 1 {
			want = effects.Replayed
		}
		if res.Status != want {
			t.Errorf("n=%d: retry after %s = %v, want %v", n, kind, res.Status, want)
		}
		if got := rows(t, pool, event); got != 1 {
			t.Errorf("n=%d: ledger rows = %d after %s and a retry, want 1", n, got, kind)
		}
	}
	if kinds["ambiguous"] == 0 || kinds["transient"] == 0 {
		t.Errorf("outcomes %v: want both ambiguous and transient failures covered", kinds)
	}
}

func TestApplyRefusesAsyncCommit(t *testing.T) {
	url := newDB(t)
	pool := asyncPool(t, url)
	ctx := testCtx(t)
	var calls atomic.Int64
	key := effects.MustKey("evt_async", "ledger")
	p := payment{EventID: "evt_async", Amount: 1}

	_, err := ledgerEffect(t, pool, &calls).Apply(ctx, key, p)
	if !errors.Is(err, postgres.ErrAsyncCommit) || effects.ClassOf(err) == effects.Retryable {
		t.Fatalf("Apply with synchronous_commit=off = %v; want ErrAsyncCommit", err)
	}
	t.Logf("error: %v", err)
	// The write is called and runs (the guard is in the key's INSERT,
	// just before COMMIT, and fails the transaction), but nothing is
	// written.
	if k, l := count(t, pool, `SELECT count(*) FROM effectively_keys`), rows(t, pool, p.EventID); k != 0 || l != 0 || calls.Load() > 1 {
		t.Fatalf("keys = %d, ledger rows = %d, writes = %d; want nothing written", k, l, calls.Load())
	}

	res, err := ledgerEffect(t, pool, nil, postgres.AllowAsyncCommit()).Apply(ctx, key, p)
	if err != nil || res.Status != effects.Applied {
		t.Fatalf("Apply with AllowAsyncCommit = %+v, %v; want applied", res, err)
	}
}

// TestApplyRefusesAsyncCommitSetByTheWrite: a write that turns
// synchronous_commit off for its own transaction is refused too (the
// guard runs in the key's INSERT, after the write), with New and with
// NewPipelined, and nothing is written.
func TestApplyRefusesAsyncCommitSetByTheWrite(t *testing.T) {
	pool := newPool(t, newDB(t), nil)
	const setOff = `SET LOCAL synchronous_commit = off`
	plain, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		if _, err := tx.Exec(ctx, setOff); err != nil {
			return "", err
		}
		return writeLedger(ctx, tx, p)
	})
	if err != nil {
		t.Fatal(err)
	}
	// The ledger row, then SET LOCAL synchronous_commit = off, for a
	// negative amount.
	pipelined := guardEffect(t, pool, "Pipelined")
	ctx := testCtx(t)
	for name, fx := range map[string]*postgres.Effect[payment]{"New": plain, "NewPipelined": pipelined} {
		event := "evt_set_off_" + name
		_, err := fx.Apply(ctx, effects.MustKey(event, "ledger"), payment{EventID: event, Amount: -1})
		if !errors.Is(err, postgres.ErrAsyncCommit) {
			t.Errorf("%s: Apply of a write that sets synchronous_commit off = %v; want ErrAsyncCommit", name, err)
		}
		if k, l := keyRowsNaming(t, pool, event), rows(t, pool, event); k != 0 || l != 0 {
			t.Errorf("%s: keys = %d, ledger rows = %d; want nothing written", name, k, l)
		}
	}
}

// serializationConflict makes the first call of a SERIALIZABLE write fail
// with 40001: the write reads the ledger, a concurrent SERIALIZABLE
// transaction reads it, inserts into it and commits first, then the write
// inserts (write skew, so PostgreSQL aborts the write's transaction).
func serializationConflict(t *testing.T, pool *pgxpool.Pool, calls *atomic.Int64, conflicts int64) func(context.Context, pgx.Tx, payment) (string, error) {
	return func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&n); err != nil {
			return "", err
		}
		if calls.Add(1) <= conflicts {
			other, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
			if err != nil {
				return "", err
			}
			defer other.Rollback(ctx)
			if err := other.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&n); err != nil {
				t.Errorf("other: %v", err)
			}
			if _, err := other.Exec(ctx, `INSERT INTO ledger (event_id, amount) VALUES ('other', 0)`); err != nil {
				t.Errorf("other: %v", err)
			}
			if err := other.Commit(ctx); err != nil {
				t.Errorf("other: %v", err)
			}
		}
		return writeLedger(ctx, tx, p)
	}
}

func TestApplyRetriesSerializationFailure(t *testing.T) {
	t.Run("retried internally, then applied", func(t *testing.T) {
		pool := newPool(t, newDB(t), nil)
		var calls atomic.Int64
		fx, err := postgres.New(pool, "billing", serializationConflict(t, pool, &calls, 2), postgres.WithIsolation(pgx.Serializable))
		if err != nil {
			t.Fatal(err)
		}
		res, err := fx.Apply(testCtx(t), effects.MustKey("evt_40001", "ledger"), payment{EventID: "evt_40001"})
		if err != nil || res.Status != effects.Applied {
			t.Fatalf("Apply = %+v, %v; want applied after retries", res, err)
		}
		if calls.Load() != 3 || rows(t, pool, "evt_40001") != 1 {
			t.Fatalf("writes = %d, ledger rows = %d; want 3 attempts, 1 row", calls.Load(), rows(t, pool, "evt_40001"))
		}
	})
	t.Run("beyond max retries it is transient", func(t *testing.T) {
		pool := newPool(t, newDB(t), nil)
		var calls atomic.Int64
		fx, err := postgres.New(pool, "billing", serializationConflict(t, pool, &calls, 100),
			postgres.WithIsolation(pgx.Serializable), postgres.WithMaxRetries(1))
		if err != nil {
			t.Fatal(err)
		}
		_, err = fx.Apply(testCtx(t), effects.MustKey("evt_40001", "ledger"), payment{EventID: "evt_40001"})
		if !errors.Is(err, effects.ErrTransient) || !strings.Contains(err.Error(), "40001") {
			t.Fatalf("Apply = %v; want ErrTransient wrapping SQLSTATE 40001", err)
		}
		if calls.Load() != 2 || rows(t, pool, "evt_40001") != 0 {
			t.Fatalf("writes = %d, ledger rows = %d; want 2 attempts, 0 rows", calls.Load(), rows(t, pool, "evt_40001"))
		}
	})
}

// claimedElsewhere opens a transaction that claims key for p with Claim,
// as a concurrent duplicate of an Apply would, and leaves it open (rolled
// back at the end of the test unless the test ends it).
func claimedElsewhere(t *testing.T, ctx context.Context, pool *pgxpool.Pool, key effects.Key, p payment) pgx.Tx {
	t.Helper()
	fp, err := effects.FingerprintJSON(p)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Rollback(context.Background()) })
	if res, err := postgres.Claim(ctx, other, "billing", key, fp); err != nil || res.Status != effects.Applied {
		t.Fatalf("Claim = %+v, %v", res, err)
	}
	return other
}

// applyResult is the outcome of one Apply.
type applyResult struct {
	res effects.Result
	err error
}

// applyBehind runs apply while other, an open transaction, holds a lock
// that apply will wait for; once apply waits (watch sees a session waiting
// on a lock), it commits other if commit, or rolls it back, and returns
// apply's outcome.
func applyBehind(t *testing.T, ctx context.Context, watch *pgx.Conn, other pgx.Tx, commit bool, apply func() (effects.Result, error)) applyResult {
	t.Helper()
	done := make(chan applyResult, 1)
	go func() {
		res, err := apply()
		done <- applyResult{res, err}
	}()
	pollUntil(t, ctx, watch, `SELECT count(*)::text FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`, "1")
	var err error
	if commit {
		err = other.Commit(ctx)
	} else {
		err = other.Rollback(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	return <-done
}

// TestApplyKeyTakenConcurrently: a transaction that claimed the key with
// Claim (which takes no advisory lock) and has not committed yet. Apply
// does not see it, runs its write, and its insert of the key waits for
// that transaction: if it commits, Apply's attempt rolls back (its write
// with it) and the retry replays; if it rolls back, Apply commits.
func TestApplyKeyTakenConcurrently(t *testing.T) {
	url := newDB(t)
	pool := newPool(t, url, nil)
	watch, err := pgx.Connect(testCtx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(context.Background())
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "the other commits: replayed", false: "the other rolls back: applied"}[commit], func(t *testing.T) {
			ctx := testCtx(t)
			var calls atomic.Int64
			fx := ledgerEffect(t, pool, &calls)
			event := fmt.Sprintf("evt_taken_%t", commit)
			key := effects.MustKey(event, "ledger")
			p := payment{EventID: event, Amount: 1}
			other := claimedElsewhere(t, ctx, pool, key, p)
			// Apply's INSERT of the key waits on the other transaction.
			r := applyBehind(t, ctx, watch, other, commit, func() (effects.Result, error) { return fx.Apply(ctx, key, p) })
			want, wantRows := effects.Replayed, 0 // the other transaction wrote no ledger row
			if !commit {
				want, wantRows = effects.Applied, 1
			}
			if r.err != nil || r.res.Status != want {
				t.Fatalf("Apply = %+v, %v; want %v", r.res, r.err, want)
			}
			if n := rows(t, pool, event); n != wantRows || calls.Load() != 1 {
				t.Errorf("ledger rows = %d after %d writes, want %d after 1", n, calls.Load(), wantRows)
			}
		})
	}
}

// TestApplyWriteFailsOnConcurrentDuplicate: a concurrent duplicate (here a
// transaction that claimed the key with Claim and wrote the same row) has
// not committed when Apply looks the key up, so Apply runs its write, and
// the write fails on that duplicate's row once it commits (a unique
// violation in the caller's own table, not on the key). Apply must not
// report the write's error: the key committed meanwhile, so it replays.
// If the other transaction rolls back instead, the write goes through.
func TestApplyWriteFailsOnConcurrentDuplicate(t *testing.T) {
	url := newDB(t)
	pool := newPool(t, url, nil)
	mustExec(t, pool, `CREATE TABLE receipts (event_id text PRIMARY KEY)`)
	watch, err := pgx.Connect(testCtx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(context.Background())
	var calls atomic.Int64
	fx, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		calls.Add(1)
		_, err := tx.Exec(ctx, `INSERT INTO receipts (event_id) VALUES ($1)`, p.EventID)
		return "receipt:" + p.EventID, err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "the other commits: replayed", false: "the other rolls back: applied"}[commit], func(t *testing.T) {
			ctx := testCtx(t)
			calls.Store(0)
			event := fmt.Sprintf("evt_write_fails_%t", commit)
			key := effects.MustKey(event, "receipt")
			p := payment{EventID: event, Amount: 1}
			other := claimedElsewhere(t, ctx, pool, key, p)
			mustExec(t, other, `INSERT INTO receipts (event_id) VALUES ($1)`, event)
			if err := postgres.SetRef(ctx, other, "billing", key, "receipt:"+event); err != nil {
				t.Fatal(err)
			}
			// Apply's write waits on the other transaction's receipt row.
			r := applyBehind(t, ctx, watch, other, commit, func() (effects.Result, error) { return fx.Apply(ctx, key, p) })
			want := effects.Replayed
			if !commit {
				want = effects.Applied
			}
			if r.err != nil || r.res.Status != want || r.res.Ref != "receipt:"+event {
				t.Fatalf("Apply = %+v, %v; want %v with ref %q", r.res, r.err, want, "receipt:"+event)
			}
			if n := count(t, pool, `SELECT count(*) FROM receipts WHERE event_id = $1`, event); n != 1 || calls.Load() != 1 {
				t.Errorf("receipts = %d after %d writes, want 1 after 1", n, calls.Load())
			}
		})
	}
}

// TestApplyConcurrentDuplicatesAtEveryIsolationLevel: at REPEATABLE READ
// and SERIALIZABLE a duplicate that commits while Apply waits is not in
// Apply's snapshot; its insert of the key fails and the retry replays.
func TestApplyConcurrentDuplicatesAtEveryIsolationLevel(t *testing.T) {
	pool := newPool(t, newDB(t), func(c *pgxpool.Config) { c.MaxConns = 20 })
	for _, level := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(level), func(t *testing.T) {
			ctx := testCtx(t)
			fx := ledgerEffect(t, pool, nil, postgres.WithIsolation(level), postgres.WithMaxRetries(30))
			event := "evt_iso_" + strings.ReplaceAll(string(level), " ", "_")
			key := effects.MustKey(event, "ledger")
			const n = 16
			var wg sync.WaitGroup
			var applied atomic.Int64
			refs := make([]string, n)
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					res, err := fx.Apply(ctx, key, payment{EventID: event, Amount: 1})
					if err != nil {
						t.Errorf("Apply %d: %v", i, err)
						return
					}
					if res.Status == effects.Applied {
						applied.Add(1)
					}
					refs[i] = res.Ref
				})
			}
			close(start)
			wg.Wait()
			if applied.Load() != 1 || rows(t, pool, event) != 1 {
				t.Errorf("%d applied, %d ledger rows; want 1 and 1", applied.Load(), rows(t, pool, event))
			}
			for i, ref := range refs {
				if ref != refs[0] {
					t.Errorf("Apply %d ref %q, Apply 0 ref %q", i, ref, refs[0])
				}
			}
		})
	}
}
