package chargehook_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/internal/chargehook"
	"effectively.dev/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestDemoInvariants(t *testing.T) {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, pgtest.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cfg := chargehook.Config{Events: 300, Workers: 6, Seed: 7, Sender: 0.1, Sibling: 0.1, Crash: 0.05}
	crashes := chargehook.NewSchedule(cfg).Crashes()
	if crashes == 0 {
		t.Fatal("schedule has no crash: pick another seed")
	}
	res, err := chargehook.Demo(ctx, db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f, n := res.Fixed, res.Naive
	if f.DoubleCharged != 0 || f.Lost != 0 || f.LedgerRows != cfg.Events {
		t.Errorf("effectively-once side: %d double-charged, %d lost, %d ledger rows for %d events", f.DoubleCharged, f.Lost, f.LedgerRows, cfg.Events)
	}
	if f.Deliveries <= cfg.Events {
		t.Errorf("the schedule delivered %d times for %d events: no duplicates were injected", f.Deliveries, cfg.Events)
	}
	// Every crash between the naive handler's insert and its mark is a
	// double charge on redelivery.
	if n.ExtraRows < crashes {
		t.Errorf("naive side: %d extra charges, want at least the %d crashes", n.ExtraRows, crashes)
	}
	if n.Lost != 0 {
		t.Errorf("naive side lost %d events", n.Lost)
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []chargehook.Config{
		{Events: 0, Workers: 1},
		{Events: 1, Workers: 0},
		{Events: 1, Workers: 1, Crash: 1.5},
		{Events: 1, Workers: 1, Sender: -0.1},
	}
	for _, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: Validate() = nil", c)
		}
	}
	if err := chargehook.DefaultConfig().Validate(); err != nil {
		t.Error(err)
	}
}
