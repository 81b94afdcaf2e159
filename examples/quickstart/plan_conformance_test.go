package main

import (
	"context"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
	"effectively.dev/stripe/stripetest"
)

// TestPlanConformance holds the quick start's plan (newPlan, as the README
// prints it) to its composite contract under conformance.RunPlan.
func TestPlanConformance(t *testing.T) {
	conformance.RunPlan(t, "quickstart", func(t testing.TB) conformance.PlanHarness[Payment] {
		ctx := context.Background()
		url := pgtest.DB(t)
		db, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		if err := postgres.Migrate(ctx, db); err != nil {
			t.Fatal(err)
		}
		// No unique index: a second row for an event would show.
		if _, err := db.Exec(ctx, `CREATE TABLE ledger (payment_id text, cents bigint)`); err != nil {
			t.Fatal(err)
		}
		return &planHarness{url: url, db: db, stripe: stripetest.Start(t)}
	}, conformance.AllowUnverified("the steps' backends (stripetest, the database) keep their own clocks, which this harness does not age together; "+
		"each step's horizon is verified by its adapter's own suite", conformance.PlanHorizon))
}

type planHarness struct {
	url    string
	db     *pgxpool.Pool
	stripe *stripetest.Server
}

// Make builds the plan as run does. newPlan takes one pool for the ledger
// and the charge's journal, so the pool goes through the ledger step's
// faults and the Stripe client through the charge step's: the ledger's
// sweep faults the journal's round trips too (both steps are
// effectively-once, so no duplicate is excused by where it is counted).
func (h *planHarness) Make(ctx context.Context, f *conformance.PlanFaults) (conformance.PlanRunner[Payment], func(), error) {
	cfg, err := pgxpool.ParseConfig(h.url)
	if err != nil {
		return nil, nil, err
	}
	cfg.ConnConfig.DialFunc = f.Step("ledger").DialContext
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	tr := f.Step("charge").Transport(nil)
	p, err := newPlan(pool, h.stripe.Client(&http.Client{Transport: tr}))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return p, func() { pool.Close(); tr.CloseIdleConnections() }, nil
}

func (h *planHarness) Event(id string) Payment {
	return Payment{ID: id, Customer: "cus_plan", Cents: 1000}
}

// Count reads the ledger rows of the event and the PaymentIntents Stripe
// made under the charge step's key.
func (h *planHarness) Count(ctx context.Context, step, id string) (int, error) {
	if step == "charge" {
		return h.stripe.Created(string(effects.MustKey("billing", id, "charge"))), nil
	}
	var n int
	err := h.db.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE payment_id = $1`, id).Scan(&n)
	return n, err
}
