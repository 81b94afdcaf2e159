package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// Parked is a row a relay parked: refused by the broker for good, or
// failed its attempt limit (see [Relay]). It stays in the outbox,
// unpublished, until [ParkedFilter.Retry] or [ParkedFilter.Drop].
type Parked struct {
	// ID is the row's id.
	ID int64
	// MessageID, Topic, Key, Value and Headers are the message's (Key as
	// published: the message id when the message had none; Headers
	// without the id header).
	MessageID  effects.Key
	Topic      string
	Key, Value []byte
	Headers    []kgo.RecordHeader
	// CreatedAt is when the row was enqueued; ParkedAt when it was parked.
	CreatedAt, ParkedAt time.Time
	// Attempts is the row's counted failed attempts.
	Attempts int
	// Error is the last produce error's text.
	Error string
	// Class is "permanent" (the broker refused the row) or "retryable"
	// (it failed the attempt limit).
	Class string
}

// ParkedFilter selects parked rows, which its methods list, count, return
// to the relays or delete. Its zero value selects every parked row; each
// field that is set narrows the selection. A negative Limit, or a To
// before From, is an *[effects.ConfigError], as is a nil db.
type ParkedFilter struct {
	// IDs selects rows by id; MessageIDs by message id.
	IDs        []int64
	MessageIDs []effects.Key
	// Topic selects the rows of one topic.
	Topic string
	// Class selects "permanent" or "retryable" rows.
	Class string
	// From and To select rows parked in [From, To); a zero time leaves
	// that side open.
	From, To time.Time
	// AfterID selects rows whose id is greater, to page through a long
	// list: pass the last ID of the previous page.
	AfterID int64
	// Limit is the most rows to select, in id order; 0 means no limit.
	Limit int
}

// args returns the filter as sqlParkedWhere's and sqlParkedIDs' arguments.
func (f ParkedFilter) args(op string) ([]any, error) {
	if f.Limit < 0 {
		return nil, &effects.ConfigError{Op: op, Option: "Limit", Reason: fmt.Sprintf("%d rows; need 0 (no limit) or more", f.Limit)}
	}
	if !f.From.IsZero() && !f.To.IsZero() && f.To.Before(f.From) {
		return nil, &effects.ConfigError{Op: op, Option: "To", Reason: fmt.Sprintf("%v is before From %v", f.To, f.From)}
	}
	args := []any{nil, nil, nil, nil, nil, nil, f.AfterID, nil}
	if len(f.IDs) > 0 {
		args[0] = f.IDs
	}
	if len(f.MessageIDs) > 0 {
		ids := make([]string, len(f.MessageIDs))
		for i, id := range f.MessageIDs {
			ids[i] = string(id)
		}
		args[1] = ids
	}
	if f.Topic != "" {
		args[2] = f.Topic
	}
	if f.Class != "" {
		args[3] = f.Class
	}
	if !f.From.IsZero() {
		args[4] = f.From
	}
	if !f.To.IsZero() {
		args[5] = f.To
	}
	if f.Limit > 0 {
		args[7] = f.Limit
	}
	return args, nil
}

// List returns the parked rows f selects, in id order.
func (f ParkedFilter) List(ctx context.Context, db postgres.DB) ([]Parked, error) {
	const op = "outbox.ParkedFilter.List"
	args, err := parkedArgs(op, db, f)
	if err != nil {
		return nil, err
	}
	var out []Parked
	err = inTx(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlListParked, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				p     Parked
				msgID string
				hk    []string
				hv    [][]byte
			)
			if err := rows.Scan(&p.ID, &msgID, &p.Topic, &p.Key, &p.Value, &hk, &hv,
				&p.CreatedAt, &p.ParkedAt, &p.Attempts, &p.Error, &p.Class); err != nil {
				return err
			}
			p.MessageID, p.Headers = effects.Key(msgID), joinHeaders(hk, hv)
			out = append(out, p)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// Count returns how many parked rows f selects (up to its Limit): a
// number to alert on.
func (f ParkedFilter) Count(ctx context.Context, db postgres.DB) (int64, error) {
	return parkedExec(ctx, "outbox.ParkedFilter.Count", db, f, sqlCountParked, true)
}

// Retry returns the parked rows f selects to the relays, with a fresh
// attempt budget, and returns how many. They are published like
// new rows (after the rows ahead of them in id order that are pending),
// at least once. Fix the cause first: a row the broker refused is
// refused again, and parked again.
func (f ParkedFilter) Retry(ctx context.Context, db postgres.DB) (int64, error) {
	return parkedExec(ctx, "outbox.ParkedFilter.Retry", db, f, sqlRetryParked, false)
}

// Drop deletes the parked rows f selects, and returns how many: they are
// never published. A dropped row's message id can be enqueued again.
func (f ParkedFilter) Drop(ctx context.Context, db postgres.DB) (int64, error) {
	return parkedExec(ctx, "outbox.ParkedFilter.Drop", db, f, sqlDropParked, false)
}

// parkedExec runs a statement over the parked rows f selects, in a
// transaction: a count (query) or an update (rows affected).
func parkedExec(ctx context.Context, op string, db postgres.DB, f ParkedFilter, sql string, query bool) (int64, error) {
	args, err := parkedArgs(op, db, f)
	if err != nil {
		return 0, err
	}
	var n int64
	err = inTx(ctx, db, func(tx pgx.Tx) error {
		if query {
			return tx.QueryRow(ctx, sql, args...).Scan(&n)
		}
		tag, err := tx.Exec(ctx, sql, args...)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	return n, nil
}

func parkedArgs(op string, db postgres.DB, f ParkedFilter) ([]any, error) {
	if db == nil {
		return nil, &effects.ConfigError{Op: op, Option: "db", Reason: "nil"}
	}
	return f.args(op)
}
