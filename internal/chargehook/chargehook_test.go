package chargehook_test

import (
	"context"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"effectively.dev/internal/chargehook"
	"effectively.dev/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// runDemo runs the demo with cfg and logs its table, which it returns.
func runDemo(t *testing.T, cfg chargehook.Config) (*chargehook.Report, *strings.Builder) {
	t.Helper()
	r, err := chargehook.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	table := new(strings.Builder)
	if err := r.WriteTable(table); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
	return r, table
}

// TestDemo runs the whole demo at a small size with every kind of fault,
// a failover included, and holds both handlers to what the demo claims:
// the effectively-once side charges each event exactly once, writes each
// receipt once and loses nothing; the naive side double-charges.
func TestDemo(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("the demo's failover needs its own throwaway clusters; DATABASE_URL is set")
	}
	cfg := chargehook.Config{
		Events: 200, Workers: 6, Seed: 7,
		Sender: 0.1, Sibling: 0.15, Crash: 0.05, Failover: true,
		Timeout: 5 * time.Minute,
		Log:     t.Logf,
	}
	sender, sibling, crash := chargehook.NewSchedule(cfg).Count()
	if sender == 0 || sibling == 0 || crash == 0 {
		t.Fatalf("seed %d schedules %d sender retries, %d sibling retries, %d crashes: pick a seed with every fault", cfg.Seed, sender, sibling, crash)
	}
	r, table := runDemo(t, cfg)

	eo, naive := r.EffectivelyOnce, r.Naive
	t.Run("every fault happened", func(t *testing.T) {
		for _, s := range []*chargehook.Side{naive, eo} {
			// A slow moment on a loaded machine can add a balancer retry
			// (and a 504 then spares a reply the drop), so these are
			// bounds, not equalities.
			if s.DroppedReplies == 0 || s.SenderRetries < s.DroppedReplies {
				t.Errorf("%s: %d replies dropped, %d resent; the schedule has %d", s.Handler, s.DroppedReplies, s.SenderRetries, sender)
			}
			if s.SiblingRetries < sibling {
				t.Errorf("%s: %d sibling retries; the schedule has %d", s.Handler, s.SiblingRetries, sibling)
			}
			for _, hop := range []string{"sender-retry", "sibling-retry", "redelivery", "after-failover"} {
				if s.Deliveries[hop] == 0 {
					t.Errorf("%s: no delivery from hop %s: %v", s.Handler, hop, s.Deliveries)
				}
			}
			if s.Deliveries["redelivery"] != crash {
				t.Errorf("%s: %d redeliveries after a crash; the schedule has %d crashes", s.Handler, s.Deliveries["redelivery"], crash)
			}
			if s.Failover <= 0 || s.FailoverAt == 0 {
				t.Errorf("%s: no failover happened", s.Handler)
			}
		}
	})
	t.Run("effectively-once side charges each event once and loses none", func(t *testing.T) {
		if eo.DoubleCharged != 0 || eo.Charges != cfg.Events {
			t.Errorf("%d PaymentIntents for %d events, %d events charged more than once", eo.Charges, cfg.Events, eo.DoubleCharged)
		}
		if eo.DoubleLedger != 0 || eo.LedgerRows != cfg.Events {
			t.Errorf("%d ledger rows for %d events, %d events with more than one", eo.LedgerRows, cfg.Events, eo.DoubleLedger)
		}
		if eo.ReceiptDup != 0 || eo.ReceiptWrites != cfg.Events {
			t.Errorf("%d receipt writes for %d events, %d written more than once", eo.ReceiptWrites, cfg.Events, eo.ReceiptDup)
		}
		if eo.Lost != 0 || eo.DeadLettered != 0 {
			t.Errorf("%d events lost (%v), %d deliveries dead-lettered", eo.Lost, eo.LostIDs, eo.DeadLettered)
		}
		if v := r.Violations(); len(v) != 0 {
			t.Errorf("violations: %v", v)
		}
		// At-least-once by contract, so only reported; without a crash
		// inside their windows there are none.
		if eo.EventDup+eo.EmailDup > 0 {
			t.Logf("at-least-once steps duplicated: %d Kafka events, %d emails (%d sends unrecorded)", eo.EventDup, eo.EmailDup, eo.UnrecordedMail)
		}
		if eo.Emails < cfg.Events || eo.EventRecords < cfg.Events {
			t.Errorf("%d emails and %d charged events for %d events: at-least-once means at least one each", eo.Emails, eo.EventRecords, cfg.Events)
		}
	})
	t.Run("naive side double-charges", func(t *testing.T) {
		if naive.DoubleCharged == 0 {
			t.Errorf("the naive handler charged no event twice under %d sibling retries and a failover", sibling)
		}
		if naive.Charges <= cfg.Events {
			t.Errorf("naive: %d PaymentIntents for %d events", naive.Charges, cfg.Events)
		}
		if naive.Lost != 0 {
			t.Errorf("naive: %d events lost (%v)", naive.Lost, naive.LostIDs)
		}
	})
	t.Run("both sides start alike", func(t *testing.T) {
		// Each run gets a primary made for it: neither starts on the
		// standby the other run's failover promoted (timeline 2).
		for _, s := range []*chargehook.Side{naive, eo} {
			if s.Timeline != 1 {
				t.Errorf("%s: the run started on timeline %d; want 1, a primary of its own", s.Handler, s.Timeline)
			}
		}
	})
	t.Run("report measures each side's cost", func(t *testing.T) {
		for _, s := range []*chargehook.Side{naive, eo} {
			if s.MachineCPU <= 0 || s.WAL <= 0 {
				t.Errorf("%s: machine CPU %v, WAL %d bytes; want both measured", s.Handler, s.MachineCPU, s.WAL)
			}
		}
		// The effectively-once side writes more than the naive one: a key
		// row, an outbox row and journal records per event besides the
		// ledger row.
		if eo.WAL <= naive.WAL {
			t.Errorf("WAL: effectively-once %d bytes, naive %d; want more on the effectively-once side", eo.WAL, naive.WAL)
		}
		for _, want := range []string{"machine CPU per event", "PostgreSQL WAL per event"} {
			if !strings.Contains(table.String(), want) {
				t.Errorf("table lacks %q", want)
			}
		}
	})
	t.Run("report names the weakest step", func(t *testing.T) {
		out := table.String()
		for _, want := range []string{r.Contract.Weakest, "effectively-once", "at-least-once", "OK:"} {
			if !strings.Contains(out, want) {
				t.Errorf("table lacks %q", want)
			}
		}
		if r.Contract.Weakest != "receipt-mail" {
			t.Errorf("weakest step %q, want the at-least-once step receipt-mail", r.Contract.Weakest)
		}
		if !strings.Contains(out, "outbox.Relay") {
			t.Errorf("table does not say how the charged event is published:\n%s", out)
		}
	})
}

// TestNaiveTwice runs the naive handler on both sides (cmd/chargehook
// -noise): both runs go through the naive handler on backends of their
// own, and the report compares their throughputs without claiming a
// contract.
func TestNaiveTwice(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("running the naive handler twice needs the demo's own throwaway clusters; DATABASE_URL is set")
	}
	cfg := chargehook.Config{
		Events: 120, Workers: 4, Seed: 7,
		Sender: 0.1, Sibling: 0.15, Crash: 0.05,
		NaiveTwice: true,
		Timeout:    5 * time.Minute,
		Log:        t.Logf,
	}
	r, table := runDemo(t, cfg)
	if r.EffectivelyOnce != nil || r.NaiveAgain == nil {
		t.Fatalf("effectively-once side %v, second naive side %v; want only the second naive side", r.EffectivelyOnce, r.NaiveAgain)
	}
	for _, s := range []*chargehook.Side{r.Naive, r.NaiveAgain} {
		// The naive handler writes a ledger row per attempt that got that
		// far, so at least one per event; its seen-table read absorbs the
		// duplicates that come after the mark.
		if s.LedgerRows < cfg.Events || s.Lost != 0 {
			t.Errorf("%s: %d ledger rows for %d events, %d lost", s.Handler, s.LedgerRows, cfg.Events, s.Lost)
		}
		n := 0
		for _, k := range s.Deliveries {
			n += k
		}
		if n < cfg.Events {
			t.Errorf("%s: %d deliveries for %d events", s.Handler, n, cfg.Events)
		}
		if s.Throughput(cfg.Events) <= 0 || s.Timeline != 1 {
			t.Errorf("%s: throughput %.0f events/s, timeline %d; want a measured run on a primary of its own", s.Handler, s.Throughput(cfg.Events), s.Timeline)
		}
	}
	if r.NaiveAgain.Handler != chargehook.NaiveAgainName || r.Naive.Handler != chargehook.NaiveName {
		t.Errorf("sides %q and %q", r.Naive.Handler, r.NaiveAgain.Handler)
	}
	if v := r.Violations(); v != nil {
		t.Errorf("violations %v: a run without the effectively-once side has no contract to break", v)
	}
	out := table.String()
	for _, want := range []string{"naive again", "throughput (events/s)", "times the first's"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, unwanted := range []string{"effectively-once", "Contract", "OK:"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("table mentions %q, but no effectively-once side ran:\n%s", unwanted, out)
		}
	}
}

func TestScheduleIsSeeded(t *testing.T) {
	cfg := chargehook.DefaultConfig()
	a, b := chargehook.NewSchedule(cfg), chargehook.NewSchedule(cfg)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two schedules from one seed differ")
	}
	cfg.Seed++
	if c := chargehook.NewSchedule(cfg); reflect.DeepEqual(a.Faults, c.Faults) {
		t.Fatal("another seed gave the same faults")
	}
	// Changing one rate keeps the other faults where they were.
	cfg.Seed--
	cfg.Crash = 0
	d := chargehook.NewSchedule(cfg)
	for id, f := range a.Faults {
		if g := d.Faults[id]; f.SenderRetry != g.SenderRetry || f.SiblingRetry != g.SiblingRetry {
			t.Fatalf("event %s: faults %+v became %+v when only the crash rate changed", id, f, g)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []chargehook.Config{
		{Events: 0, Workers: 1},
		{Events: 1, Workers: 0},
		{Events: 1, Workers: 1, Crash: 1.5},
		{Events: 1, Workers: 1, Sender: -0.1},
		{Events: 1, Workers: 1, Failover: true, DatabaseURL: "postgres://elsewhere/db"},
		{Events: 1, Workers: 1, Standby: true, DatabaseURL: "postgres://elsewhere/db"},
		{Events: 1, Workers: 1, NaiveTwice: true, DatabaseURL: "postgres://elsewhere/db"},
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
