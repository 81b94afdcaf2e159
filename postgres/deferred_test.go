package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// writeShape is a write function that uses one way of pgx.Tx to write the
// ledger row, and how many round trips a new key should cost with it on a
// warm connection (0: not checked).
type writeShape struct {
	name  string
	trips int64
	write postgres.WriteFunc[payment]
}

const insertLedgerReturning = `INSERT INTO ledger (event_id, amount) VALUES ($1, $2) RETURNING id`

func ledgerRef(id int64) string { return "ledger:" + strconv.FormatInt(id, 10) }

// writeShapes are the ways a write can use the pgx.Tx Apply gives it. BEGIN
// (and the probe, while duplicates are occasional) goes with the first
// Exec, Query, QueryRow or SendBatch; any other method sends it first, on
// its own. The commit guard is in the key's INSERT, after the write.
var writeShapes = []writeShape{
	{"QueryRow", 2, writeLedger},
	{"Exec", 2, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, p.EventID, p.Amount)
		return "exec", err
	}},
	{"Query with its error ignored, as pgx.CollectRows allows", 2, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		rows, _ := tx.Query(ctx, insertLedgerReturning, p.EventID, p.Amount)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return "", err
		}
		if len(ids) != 1 {
			return "", fmt.Errorf("%d ids, want 1", len(ids))
		}
		return ledgerRef(ids[0]), nil
	}},
	{"Query read by hand", 2, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		rows, err := tx.Query(ctx, insertLedgerReturning, p.EventID, p.Amount)
		if err != nil {
			return "", err
		}
		defer rows.Close()
		var id int64
		for rows.Next() {
			if err := rows.Scan(&id); err != nil {
				return "", err
			}
		}
		return ledgerRef(id), rows.Err()
	}},
	{"SendBatch with callbacks", 2, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		var b pgx.Batch
		var id, n int64
		b.Queue(insertLedgerReturning, p.EventID, p.Amount).QueryRow(func(row pgx.Row) error { return row.Scan(&id) })
		b.Queue(`SELECT count(*) FROM ledger WHERE event_id = $1`, p.EventID).QueryRow(func(row pgx.Row) error { return row.Scan(&n) })
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return "", err
		}
		if n != 1 {
			return "", fmt.Errorf("the batch's second statement saw %d rows, want 1", n)
		}
		return ledgerRef(id), nil
	}},
	{"two statements", 3, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		ref, err := writeLedger(ctx, tx, p)
		if err != nil {
			return "", err
		}
		_, err = tx.Exec(ctx, `UPDATE ledger SET amount = amount WHERE event_id = $1`, p.EventID)
		return ref, err
	}},
	{"no statement", 1, func(context.Context, pgx.Tx, payment) (string, error) {
		return "nothing", nil
	}},
	{"a pgx option argument", 0, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, pgx.QueryExecModeSimpleProtocol, p.EventID, p.Amount)
		return "simple", err
	}},
	{"savepoint", 0, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return "", err
		}
		ref, err := writeLedger(ctx, sp, p)
		if err != nil {
			return "", err
		}
		return ref, sp.Commit(ctx)
	}},
	{"CopyFrom", 0, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"ledger"}, []string{"event_id", "amount"}, pgx.CopyFromRows([][]any{{p.EventID, p.Amount}}))
		return "copied", err
	}},
	{"Conn", 0, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		_, err := tx.Conn().Exec(ctx, `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, p.EventID, p.Amount)
		return "conn", err
	}},
}

// TestApplyWriteShapes runs every write shape through Apply as it starts
// (BEGIN deferred to the write's first statement) and with
// WithLookupFirst: each applies once, in the round trips it should, and
// replays its ref; each, failing after its writes, commits nothing; each
// is refused, writing nothing, under synchronous_commit = off.
func TestApplyWriteShapes(t *testing.T) {
	url := newDB(t)
	pool, sends := countingPool(t, url, 1) // one connection, warmed by the first Apply of each shape
	async := asyncPool(t, url)
	errAfter := errors.New("the write fails after its statements")
	for i, shape := range writeShapes {
		for _, lookup := range []bool{false, true} {
			name := shape.name
			var opts []postgres.Option
			if lookup {
				name += "/WithLookupFirst"
				opts = append(opts, postgres.WithLookupFirst())
			}
			t.Run(name, func(t *testing.T) {
				ctx := testCtx(t)
				fx, err := postgres.New(pool, "billing", shape.write, opts...)
				if err != nil {
					t.Fatal(err)
				}
				event := fmt.Sprintf("evt_shape_%d_%t", i, lookup)
				p := payment{EventID: event, Amount: 7}
				if _, err := fx.Apply(ctx, effects.MustKey(event+"_warm", "ledger"), payment{EventID: event + "_warm", Amount: 1}); err != nil {
					t.Fatalf("warm-up Apply: %v", err)
				}
				key := effects.MustKey(event, "ledger")
				before := sends.Load()
				first, err := fx.Apply(ctx, key, p)
				if err != nil || first.Status != effects.Applied || first.Ref == "" {
					t.Fatalf("Apply = %+v, %v; want applied with a ref", first, err)
				}
				trips := sends.Load() - before
				if want := shape.trips; !lookup && want != 0 && trips != want {
					t.Errorf("a new key took %d round trips, want %d", trips, want)
				}
				again, err := fx.Apply(ctx, key, p)
				if err != nil || again != (effects.Result{Status: effects.Replayed, Ref: first.Ref}) {
					t.Fatalf("redelivery = %+v, %v; want replayed %q", again, err, first.Ref)
				}
				if shape.name != "no statement" {
					if n := rows(t, pool, event); n != 1 {
						t.Fatalf("ledger rows = %d, want 1", n)
					}
				}

				failing, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
					if _, err := shape.write(ctx, tx, p); err != nil {
						return "", err
					}
					return "", errAfter
				}, opts...)
				if err != nil {
					t.Fatal(err)
				}
				failed := payment{EventID: event + "_failed", Amount: 7}
				failedKey := effects.MustKey(event+"_failed", "ledger")
				if _, err := failing.Apply(ctx, failedKey, failed); !errors.Is(err, errAfter) {
					t.Fatalf("Apply of a failing write = %v, want its error", err)
				}
				if n := rows(t, pool, failed.EventID); n != 0 {
					t.Fatalf("ledger rows = %d after the write failed, want 0", n)
				}
				if n := count(t, pool, `SELECT count(*) FROM effectively_keys WHERE key = $1`, string(failedKey)); n != 0 {
					t.Fatalf("key rows = %d after the write failed, want 0", n)
				}

				refused, err := postgres.New(async, "billing", shape.write, opts...)
				if err != nil {
					t.Fatal(err)
				}
				asyncKey := effects.MustKey(event+"_async", "ledger")
				if _, err := refused.Apply(ctx, asyncKey, payment{EventID: event + "_async", Amount: 7}); !errors.Is(err, postgres.ErrAsyncCommit) {
					t.Fatalf("Apply with synchronous_commit=off = %v, want ErrAsyncCommit", err)
				}
				if n := rows(t, pool, event+"_async"); n != 0 {
					t.Fatalf("ledger rows = %d after ErrAsyncCommit, want 0", n)
				}
				if n := count(t, pool, `SELECT count(*) FROM effectively_keys WHERE key = $1`, string(asyncKey)); n != 0 {
					t.Fatalf("key rows = %d after ErrAsyncCommit, want 0", n)
				}
			})
		}
	}
}

// bothShapes runs f as Apply starts (BEGIN deferred to the write's first
// statement) and with WithLookupFirst (BEGIN sent with the lookup).
func bothShapes(t *testing.T, f func(t *testing.T, tag string, opts ...postgres.Option)) {
	t.Run("deferred BEGIN", func(t *testing.T) { f(t, "deferred") })
	t.Run("WithLookupFirst", func(t *testing.T) { f(t, "lookup", postgres.WithLookupFirst()) })
}

func keyRows(t *testing.T, pool *pgxpool.Pool, key effects.Key) int {
	t.Helper()
	return count(t, pool, `SELECT count(*) FROM effectively_keys WHERE key = $1`, string(key))
}

// TestApplyWriteMisuse: what a write does wrong or unusually with its
// pgx.Tx never commits the key without the write's statements, nor a
// statement outside the transaction, in either shape of Apply.
func TestApplyWriteMisuse(t *testing.T) {
	url := newDB(t)
	pool := newPool(t, url, nil)
	errAfter := errors.New("the write fails after its statements")
	apply := func(t *testing.T, write postgres.WriteFunc[payment], event string, opts ...postgres.Option) (effects.Result, error) {
		t.Helper()
		fx, err := postgres.New(pool, "billing", write, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return fx.Apply(testCtx(t), effects.MustKey(event, "ledger"), payment{EventID: event, Amount: 1})
	}

	t.Run("an ignored failure of a statement fails the attempt", func(t *testing.T) {
		bothShapes(t, func(t *testing.T, tag string, opts ...postgres.Option) {
			event := "evt_ignored_" + tag
			_, err := apply(t, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
				_, _ = tx.Exec(ctx, `INSERT INTO no_such_table (x) VALUES ($1)`, 1) // its error ignored
				_, _ = tx.Exec(ctx, `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, p.EventID, p.Amount)
				return "ref", nil
			}, event, opts...)
			if err == nil || effects.Retryable(err) {
				t.Fatalf("Apply = %v; want the failed statement's error, not retryable", err)
			}
			if k, l := keyRows(t, pool, effects.MustKey(event, "ledger")), rows(t, pool, event); k != 0 || l != 0 {
				t.Fatalf("key rows = %d, ledger rows = %d; want nothing committed", k, l)
			}
		})
	})

	t.Run("tx.Conn after a failed statement stays in the transaction", func(t *testing.T) {
		bothShapes(t, func(t *testing.T, tag string, opts ...postgres.Option) {
			event := "evt_conn_after_failure_" + tag
			_, err := apply(t, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
				_, _ = tx.Exec(ctx, `SELEC $1::int`, 1)
				if _, err := tx.Conn().Exec(ctx, `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, p.EventID, p.Amount); err != nil {
					return "", err
				}
				return "", errAfter
			}, event, opts...)
			if err == nil {
				t.Fatal("Apply succeeded")
			}
			if n := rows(t, pool, event); n != 0 {
				t.Fatalf("ledger rows = %d: a statement ran outside the transaction", n)
			}
		})
	})

	t.Run("a batch's Tx is nil, and a batch that begins is refused", func(t *testing.T) {
		bothShapes(t, func(t *testing.T, tag string, opts ...postgres.Option) {
			for _, begins := range []bool{false, true} {
				event := fmt.Sprintf("evt_batch_tx_%s_%t", tag, begins)
				var inner pgx.Tx
				_, err := apply(t, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
					var b pgx.Batch
					if begins {
						b.BeginTx(pgx.TxOptions{})
					}
					b.Queue(`INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, p.EventID, p.Amount)
					br := tx.SendBatch(ctx, &b)
					if err := br.Close(); err != nil {
						return "", err
					}
					inner = br.Tx()
					return "", errAfter
				}, event, opts...)
				switch {
				case inner != nil:
					t.Fatalf("BeginTx %t: the batch's Tx is %T, want nil", begins, inner)
				case begins && (err == nil || errors.Is(err, errAfter)):
					t.Fatalf("BeginTx %t: Apply = %v, want the batch refused", begins, err)
				case !begins && !errors.Is(err, errAfter):
					t.Fatalf("BeginTx %t: Apply = %v, want the write's error", begins, err)
				}
				if n := rows(t, pool, event); n != 0 {
					t.Fatalf("BeginTx %t: ledger rows = %d after Apply failed", begins, n)
				}
			}
		})
	})

	t.Run("several statements in one Exec without arguments", func(t *testing.T) {
		bothShapes(t, func(t *testing.T, tag string, opts ...postgres.Option) {
			event := "evt_multi_" + tag
			res, err := apply(t, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
				_, err := tx.Exec(ctx, `INSERT INTO ledger (event_id, amount) VALUES ('`+event+`', 1); INSERT INTO ledger (event_id, amount) VALUES ('`+event+`', 2)`)
				return "multi", err
			}, event, opts...)
			if err != nil || res.Status != effects.Applied {
				t.Fatalf("Apply = %+v, %v; want applied", res, err)
			}
			if n := rows(t, pool, event); n != 2 {
				t.Fatalf("ledger rows = %d, want 2", n)
			}
		})
	})

	t.Run("QueryRow with no row, then a write", func(t *testing.T) {
		bothShapes(t, func(t *testing.T, tag string, opts ...postgres.Option) {
			event := "evt_norows_" + tag
			var scanErr error
			res, err := apply(t, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
				var id int64
				scanErr = tx.QueryRow(ctx, `SELECT id FROM ledger WHERE event_id = $1`, "none").Scan(&id)
				return writeLedger(ctx, tx, p)
			}, event, opts...)
			if err != nil || res.Status != effects.Applied || !errors.Is(scanErr, pgx.ErrNoRows) {
				t.Fatalf("Apply = %+v, %v, scan = %v; want applied after pgx.ErrNoRows", res, err, scanErr)
			}
		})
	})

	for name, end := range map[string]func(pgx.Tx, context.Context) error{
		"Commit":   pgx.Tx.Commit,
		"Rollback": pgx.Tx.Rollback,
		"COMMIT as SQL": func(tx pgx.Tx, ctx context.Context) error {
			_, err := tx.Conn().Exec(ctx, "COMMIT")
			return err
		},
	} {
		t.Run("a write that runs "+name, func(t *testing.T) {
			bothShapes(t, func(t *testing.T, tag string, opts ...postgres.Option) {
				event := "evt_end_" + tag + "_" + strings.ReplaceAll(name, " ", "_")
				var endErr error
				_, err := apply(t, func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
					ref, err := writeLedger(ctx, tx, p)
					if err != nil {
						return "", err
					}
					endErr = end(tx, ctx)
					return ref, endErr
				}, event, opts...)
				if err == nil || effects.Retryable(err) {
					t.Fatalf("Apply = %v; want a permanent error", err)
				}
				if n := keyRows(t, pool, effects.MustKey(event, "ledger")); n != 0 {
					t.Fatalf("key rows = %d, want 0", n)
				}
				if name != "COMMIT as SQL" {
					// Refused: nothing was committed.
					if endErr == nil {
						t.Fatalf("%s returned nil, want it refused", name)
					}
					if n := rows(t, pool, event); n != 0 {
						t.Fatalf("ledger rows = %d, want 0", n)
					}
				}
			})
		})
	}

	// A write that reads its batch's rows ignoring their error, under
	// unsafe settings: the refusal comes at the key's INSERT, after the
	// write, and nothing is written.
	t.Run("a write that ignores its batch's error is refused at the key's row", func(t *testing.T) {
		async := asyncPool(t, url)
		fx, err := postgres.New(async, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
			var b pgx.Batch
			b.Queue(insertLedgerReturning, p.EventID, p.Amount)
			br := tx.SendBatch(ctx, &b)
			defer br.Close()
			rows, _ := br.Query() // its error ignored, as pgx.CollectRows allows
			ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			return fmt.Sprint(ids), err
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fx.Apply(testCtx(t), effects.MustKey("evt_batch_refused", "ledger"), payment{EventID: "evt_batch_refused", Amount: 1}); !errors.Is(err, postgres.ErrAsyncCommit) {
			t.Fatalf("Apply = %v, want ErrAsyncCommit", err)
		}
		if n := rows(t, async, "evt_batch_refused"); n != 0 {
			t.Fatalf("ledger rows = %d after ErrAsyncCommit, want 0", n)
		}
	})
}
