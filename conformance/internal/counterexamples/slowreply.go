package counterexamples

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
)

// OwnDeadline is a correct same-transaction dedup that gives each Apply a
// deadline of its own, Timeout, shorter than a slow reply. With Lie set
// it reports running out of that deadline as ErrTransient ("the call
// timed out, nothing happened"), although the request was sent and may
// have committed: the suite's slow-reply scenario holds a COMMIT reply
// past the deadline, the connection up, and finds the effect the
// ErrTransient denied. Without Lie it reports the timeout as an unknown
// outcome, the honest control. pgx retries a read that timed out in the
// background, so the held reply must stay held on every read until the
// hold ends, as on a real network, or the lie is never reached.
type OwnDeadline struct {
	DB      *pgxpool.Pool
	Timeout time.Duration
	Lie     bool
}

// Contract claims EffectivelyOnce. With Lie it is a lie.
func (e OwnDeadline) Contract() effects.Contract {
	return claim("counterexample: same-transaction dedup under a deadline of its own")
}

// Apply claims and writes in one transaction within Timeout.
func (e OwnDeadline) Apply(ctx context.Context, key effects.Key, in Payment) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, e.Timeout)
	defer cancel()
	return dedupTx(cctx, e.DB, key, string(key), in, true, func(key effects.Key, err error) error {
		if e.Lie && cctx.Err() != nil && ctx.Err() == nil {
			return effects.Transient("counterexample", key, err) // the lie: its own deadline "applied nothing"
		}
		return classify(key, err)
	})
}
