package postgres_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// TestConformanceGrouped holds the grouped shape of postgres.New (its
// default) to the contract: every Apply the suite makes runs in a group
// of two, with a companion Apply of a key of its own queued just before
// it, so that every round trip of the group is swept (BEGIN with the
// companion's savepoint, the companion's write, its key's INSERT with the
// suite's savepoint, the suite's write, its key's INSERT with COMMIT),
// the duplicate sweep puts a duplicate inside a group, and the concurrent
// scenarios race duplicates across groups in flight together.
func TestConformanceGrouped(t *testing.T) {
	why := []string{
		"one dedup table (effectively_keys) for every shape: key-capacity runs at full size in TestConformance on postgres.New's default shape, whose Applies run alone there",
	}
	left := []string{conformance.ScenarioKeyCapacity}
	if os.Getenv("DATABASE_URL") != "" {
		why = append(why, "DATABASE_URL's server is not the test's to restart or crash")
		left = append(left, conformance.ScenarioRestart, conformance.ScenarioCrashRestart)
	}
	rep := conformance.Run(t, "postgres (grouped)", func(t testing.TB) conformance.Harness[confCharge] { return newGroupedHarness(t) },
		conformance.WithCapacity(1000),
		conformance.WithSuccessorProcess(func(ctx context.Context, url string) (conformance.Harness[confCharge], error) {
			db, err := pgxpool.New(ctx, url)
			return &groupedHarness{confHarness: &confHarness{url: url, db: db}}, err
		}),
		conformance.WithSlowReply(300*time.Millisecond), // the adapter sets no deadline of its own: it waits for the held reply
		conformance.WithSchedules(4),                    // half the default: TestConformance runs 8 on the same retry and fault handling
		conformance.AllowUnverified(strings.Join(why, "; "), left...))
	for _, f := range rep.Fields {
		if f.Status != conformance.Verified && f.Allowed == "" {
			t.Errorf("contract field %s", f)
		}
	}
}

// companionPrefix starts the event ids of companion Applies, whose
// effects go to a table of their own (conf_companion), out of Count and
// Total.
const companionPrefix = "companion-"

// groupedHarness is confHarness whose Make returns the grouped shape
// wrapped so that every Apply runs in a group (groupedEffect).
type groupedHarness struct {
	*confHarness
	seq atomic.Int64
}

// newGroupedHarness returns a groupedHarness on a database of its own,
// with the capabilities (restart, crash) of newConfHarness's.
func newGroupedHarness(t testing.TB) conformance.Harness[confCharge] {
	base := newConfHarness(t, confHarness{})
	var (
		ch      *confHarness
		restart func(g *groupedHarness) conformance.Harness[confCharge]
	)
	switch b := base.(type) {
	case *confHarness:
		ch = b
	case struct {
		*confHarness
		pgtest.RestartFunc
		pgtest.CrashRestartFunc
	}:
		ch = b.confHarness
		restart = func(g *groupedHarness) conformance.Harness[confCharge] {
			return struct {
				*groupedHarness
				pgtest.RestartFunc
				pgtest.CrashRestartFunc
			}{g, b.RestartFunc, b.CrashRestartFunc}
		}
	default:
		t.Fatalf("newConfHarness returned a %T", base)
	}
	if _, err := ch.db.Exec(context.Background(), `CREATE TABLE conf_companion (LIKE conf_ledger INCLUDING ALL)`); err != nil {
		t.Fatal(err)
	}
	g := &groupedHarness{confHarness: ch}
	if restart != nil {
		return restart(g)
	}
	return g
}

// Make builds postgres.New with its defaults, wrapped in a groupedEffect.
func (h *groupedHarness) Make(ctx context.Context, f *conformance.Faults) (effects.Effect[confCharge], func(), error) {
	cfg, err := pgxpool.ParseConfig(h.url)
	if err != nil {
		return nil, nil, err
	}
	cfg.ConnConfig.DialFunc = f.DialContext
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	f.SetAppFaulter(h.appFault) // the server answers the suite's application faults (see confHarness.appFault)
	eff, err := postgres.New(pool, "conformance", func(ctx context.Context, tx pgx.Tx, in confCharge) (id string, err error) {
		table := "conf_ledger"
		if strings.HasPrefix(in.EventID, companionPrefix) {
			table = "conf_companion"
		}
		err = tx.QueryRow(ctx, `INSERT INTO `+table+` (event_id, cents) VALUES ($1, $2) RETURNING id::text`, in.EventID, in.Cents).Scan(&id)
		return id, err
	})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return &groupedEffect{eff: eff, seq: &h.seq}, pool.Close, nil
}

// groupedEffect runs each Apply in a group of two: a companion Apply of
// a new key first, then the Apply the suite asked for, released together
// (postgres.HoldGroup) once both are queued. It returns when both are
// done, the companion retried a few times alone if its group failed, so
// that no round trip of the companion's falls into the suite's next
// Apply.
type groupedEffect struct {
	eff *postgres.Effect[confCharge]
	seq *atomic.Int64
}

func (g *groupedEffect) Contract() effects.Contract { return g.eff.Contract() }

func (g *groupedEffect) Apply(ctx context.Context, key effects.Key, in confCharge) (effects.Result, error) {
	if key.Validate() != nil {
		return g.eff.Apply(ctx, key, in) // refused before any I/O: no group
	}
	queued, release := postgres.HoldGroup(g.eff)
	event := fmt.Sprintf("%s%d", companionPrefix, g.seq.Add(1))
	cin := confCharge{EventID: event, Cents: 1}
	ckey := effects.Key(event)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	var (
		wg    sync.WaitGroup
		cdone atomic.Bool // the companion returned
	)
	wg.Go(func() {
		_, err := g.eff.Apply(cctx, ckey, cin)
		for i := 0; i < 3 && err != nil && effects.ClassOf(err) == effects.Retryable; i++ {
			_, err = g.eff.Apply(cctx, ckey, cin)
		}
		cdone.Store(true)
	})
	// The group of the suite's previous Apply may still be taking calls
	// from the queue as it ends (its results are delivered before it
	// looks for more): it can take the companion, which then runs alone.
	// The waits end then too, rather than at waitFor's limit.
	waitFor(func() bool { return queued() >= 1 || cdone.Load() })
	var (
		res  effects.Result
		err  error
		done atomic.Bool
	)
	wg.Go(func() {
		res, err = g.eff.Apply(ctx, key, in)
		done.Store(true)
	})
	waitFor(func() bool { return queued() >= 2 || done.Load() || cdone.Load() })
	release()
	wg.Wait()
	return res, err
}

// waitFor waits until cond holds, for at most ten seconds (then the group
// runs with what queued: the suite judges the outcome either way).
func waitFor(cond func() bool) {
	for deadline := time.Now().Add(10 * time.Second); !cond() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Microsecond)
	}
}
