package counterexamples

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
)

// NewestKeysOnly is a same-transaction dedup whose table is capped by a
// sweep that keeps only the newest 2,000 keys ("sized for any plausible
// redelivery window"), declared with Horizon 0: "kept until pruned". A
// key redelivered after more than 2,000 others is applied again. It
// passes the replay storm (1,000 keys). Caught by key-capacity.
type NewestKeysOnly struct {
	DB *pgxpool.Pool
	n  *atomic.Int64
}

// NewestKeysOnlyCap is how many keys NewestKeysOnly keeps.
const NewestKeysOnlyCap = 2000

// NewNewestKeysOnly returns a NewestKeysOnly over db.
func NewNewestKeysOnly(db *pgxpool.Pool) NewestKeysOnly {
	return NewestKeysOnly{DB: db, n: new(atomic.Int64)}
}

// Contract claims EffectivelyOnce with keys kept until pruned. It is a lie.
func (e NewestKeysOnly) Contract() effects.Contract {
	return claim("counterexample: dedup table capped at the newest 2,000 keys, declared kept until pruned")
}

// Apply dedups, and every 100th Apply deletes all but the newest keys.
func (e NewestKeysOnly) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	if e.n.Add(1)%100 == 0 {
		if _, err := e.DB.Exec(ctx, `DELETE FROM cx_seen WHERE seen_at < (SELECT seen_at FROM cx_seen ORDER BY seen_at DESC OFFSET $1 LIMIT 1)`, NewestKeysOnlyCap); err != nil {
			return effects.Result{}, classify(key, err)
		}
	}
	return dedupInsert(ctx, e.DB, key, in, true)
}

// PayloadForgotten keeps every key but compares payloads only for a day:
// a record older than that replays whatever payload comes with its key
// (the fingerprint column was "only needed for the retry window").
// Declared with key-reuse detection and Horizon 0. Caught by horizon,
// which reuses the key with another payload after aging the backend.
type PayloadForgotten struct{ DB *pgxpool.Pool }

// Contract claims EffectivelyOnce, key reuse detected, keys kept until
// pruned. The reuse detection is a lie after a day.
func (e PayloadForgotten) Contract() effects.Contract {
	return claim("counterexample: payload compared only for a day, declared key reuse detected")
}

// Apply replays a key older than a day without comparing payloads.
func (e PayloadForgotten) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	var old bool
	err := e.DB.QueryRow(ctx, `SELECT seen_at < now() - interval '1 day' FROM cx_seen WHERE key = $1`, string(key)).Scan(&old)
	switch {
	case err == nil && old:
		return effects.Result{Status: effects.Replayed}, nil
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return effects.Result{}, classify(key, err)
	}
	return dedupInsert(ctx, e.DB, key, in, true)
}
