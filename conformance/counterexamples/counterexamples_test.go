package counterexamples_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/conformance"
	"effectively.dev/conformance/counterexamples"
	"effectively.dev/effects"
	"effectively.dev/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// harness runs a counterexample against a fresh Postgres database.
type harness struct {
	url   string
	db    *pgxpool.Pool
	build func(*pgxpool.Pool) effects.Effect[counterexamples.Payment]
}

func maker(build func(*pgxpool.Pool) effects.Effect[counterexamples.Payment]) conformance.Maker[counterexamples.Payment] {
	return func(t testing.TB) conformance.Harness[counterexamples.Payment] {
		url := pgtest.DB(t)
		db, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		if _, err := db.Exec(context.Background(), counterexamples.Schema); err != nil {
			t.Fatal(err)
		}
		return &harness{url: url, db: db, build: build}
	}
}

func (h *harness) Make(ctx context.Context, f *conformance.Faults) (effects.Effect[counterexamples.Payment], func(), error) {
	cfg, err := pgxpool.ParseConfig(h.url)
	if err != nil {
		return nil, nil, err
	}
	cfg.ConnConfig.DialFunc = f.DialContext
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return h.build(pool), pool.Close, nil
}

func (h *harness) Input(key effects.Key, variant int) counterexamples.Payment {
	return counterexamples.Payment{EventID: string(key), Cents: int64(1000 + variant)}
}

func (h *harness) Count(ctx context.Context, key effects.Key) (int, error) {
	return counterexamples.Count(ctx, h.db, string(key))
}

func (h *harness) Total(ctx context.Context) (int, error) { return counterexamples.Total(ctx, h.db) }

// TestSuiteCatchesCounterexamples is the suite's proof: each lying adapter
// must fail the scenarios named for it. A counterexample that passes means
// the suite cannot tell a lie from the truth.
func TestSuiteCatchesCounterexamples(t *testing.T) {
	cases := []struct {
		name   string
		build  func(*pgxpool.Pool) effects.Effect[counterexamples.Payment]
		caught []string // scenarios that must fail
	}{
		{
			name: "two-transactions",
			build: func(p *pgxpool.Pool) effects.Effect[counterexamples.Payment] {
				return counterexamples.TwoTransactions{DB: p}
			},
			caught: []string{conformance.ScenarioConcurrent, conformance.ScenarioLostReply},
		},
		{
			name: "fresh-key-per-attempt",
			build: func(p *pgxpool.Pool) effects.Effect[counterexamples.Payment] {
				return counterexamples.FreshKeyPerAttempt{DB: p}
			},
			caught: []string{conformance.ScenarioLostReply},
		},
		{
			name: "blind-write",
			build: func(p *pgxpool.Pool) effects.Effect[counterexamples.Payment] {
				return counterexamples.BlindWrite{DB: p}
			},
			caught: []string{conformance.ScenarioRedelivery, conformance.ScenarioConcurrent, conformance.ScenarioStorm},
		},
		{
			name: "unchecked-fingerprint",
			build: func(p *pgxpool.Pool) effects.Effect[counterexamples.Payment] {
				return counterexamples.UncheckedFingerprint{DB: p}
			},
			caught: []string{conformance.ScenarioKeyReuse},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := conformance.Evaluate(t, "counterexample/"+c.name, maker(c.build))
			failed := rep.Failed()
			for _, want := range c.caught {
				if !slices.Contains(failed, want) {
					row, _ := rep.Row(want)
					t.Errorf("the suite passed %s in scenario %s (verdict %s, effects %s); it must fail it", c.name, want, row.Verdict, row.Effects())
				}
			}
			if len(failed) == 0 {
				t.Fatalf("the suite passed counterexample %s in every scenario", c.name)
			}
			fmt.Printf("counterexample %s caught by: %v\n", c.name, failed)
		})
	}
}
