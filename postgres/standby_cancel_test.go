package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// TestApplyCancelledStandbyWaitIsAmbiguous: with pgx's
// CancelRequestContextWatcherHandler, a caller's timeout while the replay
// barrier's COMMIT waits for a stalled standby makes PostgreSQL end the
// wait with a warning and answer COMMIT; Apply must report ErrAmbiguous,
// not Replayed, in every shape.
func TestApplyCancelledStandbyWaitIsAmbiguous(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fp := startFailoverPair(t, ctx, true)
	pool := newPool(t, fp.primary.URL(failoverDB), func(c *pgxpool.Config) {
		c.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, CancelRequestDelay: 0, DeadlineDelay: 5 * time.Second}
		}
	})
	for name, mk := range map[string]func() (*postgres.Effect[payment], error){
		"New": func() (*postgres.Effect[payment], error) { return postgres.New(pool, failoverScope, writeLedger) },
		"NewPipelined": func() (*postgres.Effect[payment], error) {
			return postgres.NewPipelined(pool, failoverScope, func(_ context.Context, k effects.Key, p payment) (string, []postgres.Statement, error) {
				return "ledger:" + p.EventID, []postgres.Statement{{SQL: `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, Args: []any{p.EventID, p.Amount}}}, nil
			})
		},
		"New lookup-first": func() (*postgres.Effect[payment], error) {
			return postgres.New(pool, failoverScope, writeLedger, postgres.WithLookupFirst())
		},
	} {
		t.Run(name, func(t *testing.T) {
			eff, err := mk()
			if err != nil {
				t.Fatal(err)
			}
			ev := payment{EventID: "evt_cr_" + name, Amount: 1}
			key := failoverKey(ev.EventID)
			if _, err := eff.Apply(ctx, key, ev); err != nil {
				t.Fatal(err)
			}
			fp.link.Stall()
			defer fp.link.Resume()
			actx, acancel := context.WithTimeout(ctx, 500*time.Millisecond)
			res, err := eff.Apply(actx, key, ev)
			acancel()
			t.Logf("duplicate while the standby stalls: %+v, %v", res, err)
			if err == nil {
				t.Errorf("reported %v while the standby had not confirmed the barrier", res.Status)
			}
		})
	}
}
