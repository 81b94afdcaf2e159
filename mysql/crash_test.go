package mysql_test

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/mysql"
	"effectively.dev/mysql/mysqltest"
)

// TestServerKilledMidCommit kills mysqld (SIGKILL) while Applies of new
// keys are committing, from several goroutines, and starts it again
// (InnoDB crash recovery). Every key whose Apply returned success has its
// effect; every key whose Apply failed (ErrAmbiguous for a COMMIT whose
// reply the kill cut, ErrTransient or a connection error before it) is
// applied by retrying the same key, or replays if its commit had landed:
// each key ends with exactly one effect.
func TestServerKilledMidCommit(t *testing.T) {
	if os.Getenv("MYSQL_DSN") != "" {
		t.Skip("MYSQL_DSN is set: its server is not the test's to kill")
	}
	dsn, _, crash := mysqltest.DedicatedDB(t)
	db := openMigrated(t, dsn)
	db.SetMaxOpenConns(8)
	eff, err := mysql.New(db, "s", writeLedger)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	const workers = 6
	var (
		wg       sync.WaitGroup
		stop     atomic.Bool
		applied  atomic.Int64
		mu       sync.Mutex
		failed   = map[string]error{} // keys whose Apply failed, to retry
		keys     []string
		started  = make(chan struct{})
		startOne sync.Once
	)
	for w := range workers {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				id := fmt.Sprintf("w%d-%d", w, i)
				mu.Lock()
				keys = append(keys, id)
				mu.Unlock()
				_, err := eff.Apply(ctx, effects.MustKey(id), payment{EventID: id, Amount: 1})
				if err != nil {
					mu.Lock()
					failed[id] = err
					mu.Unlock()
					time.Sleep(50 * time.Millisecond) // the server may be down: do not spin
					continue
				}
				if applied.Add(1) == 50 {
					startOne.Do(func() { close(started) })
				}
			}
		})
	}
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("no Applies before the crash")
	}
	if err := crash.CrashRestart(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // Applies against the restarted server
	stop.Store(true)
	wg.Wait()

	ambiguous := 0
	for id, err := range failed {
		if errors.Is(err, effects.ErrAmbiguous) {
			ambiguous++
		}
		if effects.ClassOf(err) != effects.Retryable {
			t.Errorf("key %s: %v, not retryable", id, err)
		}
		for {
			_, err := eff.Apply(ctx, effects.MustKey(id), payment{EventID: id, Amount: 1})
			if err == nil {
				break
			}
			if effects.ClassOf(err) != effects.Retryable || ctx.Err() != nil {
				t.Fatalf("retrying key %s: %v", id, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, id := range keys {
		if n := ledgerRows(t, db, id); n != 1 {
			t.Errorf("key %s: %d ledger rows, want 1 (its Apply failed with %v)", id, n, failed[id])
		}
	}
	t.Logf("%d keys, %d Applies failed across the kill (%d ambiguous), every key applied once", len(keys), len(failed), ambiguous)
}
