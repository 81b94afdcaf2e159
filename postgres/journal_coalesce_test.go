package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/postgres"
)

// waitQueued waits until n calls are queued behind postgres.HoldJournal
// or postgres.HoldGroup.
func waitQueued(t *testing.T, queued func() int, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for queued() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued after 10 s, want %d", queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// newCoalesceJournal returns a Journal on a new database, a context and a
// fingerprint for its keys.
func newCoalesceJournal(t *testing.T) (*postgres.Journal, context.Context, []byte) {
	t.Helper()
	j, err := postgres.NewJournal(newPool(t, newDB(t), nil), "coalesce")
	if err != nil {
		t.Fatal(err)
	}
	return j, testCtx(t), effects.Fingerprint([]byte("payload"))
}

// coalesceKey is the test's key for s.
func coalesceKey(s string) effects.Key { return effects.MustKey("evt", s) }

// A coalesced Begin gives every caller what a Begin of its own would have:
// the lease for a new key, an expired lease or a released one; the record
// of a done key; ErrInFlight for a live lease; ErrKeyReused for another
// fingerprint; and a key queued twice is begun once.
func TestJournalCoalescedBegin(t *testing.T) {
	j, ctx, fp := newCoalesceJournal(t)
	must := func(_ journal.Record, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(j.Begin(ctx, coalesceKey("done"), fp, time.Minute))
	if err := j.Complete(ctx, coalesceKey("done"), "ref-done"); err != nil {
		t.Fatal(err)
	}
	must(j.Begin(ctx, coalesceKey("live"), fp, time.Hour))
	must(j.Begin(ctx, coalesceKey("expired"), fp, time.Millisecond))
	rel, err := j.Begin(ctx, coalesceKey("released"), fp, time.Hour)
	must(rel, err)
	if err := j.Release(ctx, coalesceKey("released"), rel.Attempt); err != nil {
		t.Fatal(err)
	}
	must(j.Begin(ctx, coalesceKey("reused"), fp, time.Minute))
	time.Sleep(20 * time.Millisecond) // "expired" expires

	type call struct {
		key  string
		fp   []byte
		want func(journal.Record, error) error
	}
	attempt := func(n int) func(journal.Record, error) error {
		return func(rec journal.Record, err error) error {
			if err != nil || rec != (journal.Record{Attempt: n}) {
				return fmt.Errorf("got %+v, %v; want the lease with attempt %d", rec, err, n)
			}
			return nil
		}
	}
	is := func(kind error) func(journal.Record, error) error {
		return func(rec journal.Record, err error) error {
			if !errors.Is(err, kind) {
				return fmt.Errorf("got %+v, %v; want %v", rec, err, kind)
			}
			return nil
		}
	}
	calls := []call{
		{"new-a", fp, attempt(1)},
		{"new-b", fp, attempt(1)},
		{"new-c", fp, attempt(1)},
		{"done", fp, func(rec journal.Record, err error) error {
			if err != nil || rec != (journal.Record{Done: true, Ref: "ref-done", Attempt: 1}) {
				return fmt.Errorf("got %+v, %v; want the done record", rec, err)
			}
			return nil
		}},
		{"live", fp, is(effects.ErrInFlight)},
		{"expired", fp, attempt(2)},
		{"released", fp, attempt(2)},
		{"reused", effects.Fingerprint([]byte("another payload")), is(effects.ErrKeyReused)},
	}
	beginsBefore, _ := postgres.JournalStatements(j)
	queued, release := postgres.HoldJournal(j)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		results = make(map[string][]error)
		twice   []error // the two calls for one key
	)
	for _, c := range calls {
		wg.Go(func() {
			err := c.want(j.Begin(ctx, coalesceKey(c.key), c.fp, time.Hour))
			mu.Lock()
			results[c.key] = append(results[c.key], err)
			mu.Unlock()
		})
	}
	for range 2 {
		wg.Go(func() {
			_, err := j.Begin(ctx, coalesceKey("twice"), fp, time.Hour)
			mu.Lock()
			twice = append(twice, err)
			mu.Unlock()
		})
	}
	waitQueued(t, queued, len(calls)+2)
	release()
	wg.Wait()
	for _, c := range calls {
		if err := results[c.key][0]; err != nil {
			t.Errorf("Begin %s: %v", c.key, err)
		}
	}
	if (twice[0] == nil) == (twice[1] == nil) || !errors.Is(errors.Join(twice...), effects.ErrInFlight) {
		t.Errorf("a key queued twice: %v; want one lease and one ErrInFlight", twice)
	}
	// One statement for the distinct keys, one for the second "twice".
	if begins, _ := postgres.JournalStatements(j); begins-beginsBefore != 2 {
		t.Errorf("%d statements for %d queued Begins; want 2", begins-beginsBefore, len(calls)+2)
	}
}

// A coalesced Complete records each key, keeps the first reference of a
// key done already, and fails for a key that was never begun.
func TestJournalCoalescedComplete(t *testing.T) {
	j, ctx, fp := newCoalesceJournal(t)
	for _, k := range []string{"a", "b", "done", "twice"} {
		if _, err := j.Begin(ctx, coalesceKey(k), fp, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Complete(ctx, coalesceKey("done"), "first"); err != nil {
		t.Fatal(err)
	}
	_, completesBefore := postgres.JournalStatements(j)
	queued, release := postgres.HoldJournal(j)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs = make(map[string]error)
	)
	complete := func(k, ref string) {
		wg.Go(func() {
			err := j.Complete(ctx, coalesceKey(k), ref)
			mu.Lock()
			errs[k+"/"+ref] = err
			mu.Unlock()
		})
	}
	complete("a", "ref-a")
	complete("b", "ref-b")
	complete("done", "second")
	complete("never", "ref-never")
	complete("twice", "one")
	complete("twice", "two")
	waitQueued(t, queued, 6)
	release()
	wg.Wait()
	for k, err := range errs {
		switch {
		case k == "never/ref-never":
			if err == nil || !strings.Contains(err.Error(), "not begun") {
				t.Errorf("Complete of a key never begun = %v; want an error saying so", err)
			}
		case err != nil:
			t.Errorf("Complete %s = %v", k, err)
		}
	}
	for k, want := range map[string]string{"a": "ref-a", "b": "ref-b", "done": "first"} {
		rec, err := j.Begin(ctx, coalesceKey(k), fp, time.Hour)
		if err != nil || !rec.Done || rec.Ref != want {
			t.Errorf("Begin %s after Complete = %+v, %v; want done with %q", k, rec, err, want)
		}
	}
	if rec, err := j.Begin(ctx, coalesceKey("twice"), fp, time.Hour); err != nil || !rec.Done || (rec.Ref != "one" && rec.Ref != "two") {
		t.Errorf("Begin twice = %+v, %v; want done with one of its refs", rec, err)
	}
	if _, completes := postgres.JournalStatements(j); completes-completesBefore != 2 {
		t.Errorf("%d statements for 6 queued Completes; want 2", completes-completesBefore)
	}
}

// Under load the journal shares statements, and every caller still gets
// its own lease and its own record.
func TestJournalCoalescesUnderLoad(t *testing.T) {
	j, ctx, fp := newCoalesceJournal(t)
	const n = 64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			k := effects.MustKey(fmt.Sprintf("evt_%d", i), "mail")
			rec, err := j.Begin(ctx, k, fp, time.Minute)
			if err != nil || rec != (journal.Record{Attempt: 1}) {
				t.Errorf("Begin %s = %+v, %v", k, rec, err)
				return
			}
			if err := j.Complete(ctx, k, "ref-"+string(k)); err != nil {
				t.Errorf("Complete %s: %v", k, err)
			}
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		k := effects.MustKey(fmt.Sprintf("evt_%d", i), "mail")
		if rec, err := j.Begin(ctx, k, fp, time.Minute); err != nil || !rec.Done || rec.Ref != "ref-"+string(k) {
			t.Errorf("Begin %s after Complete = %+v, %v", k, rec, err)
		}
	}
	begins, completes := postgres.JournalStatements(j)
	t.Logf("%d Begins in %d statements, %d Completes in %d", 2*n, begins, n, completes)
	if begins >= 2*n || completes >= n {
		t.Errorf("no statement was shared: %d Begins in %d statements, %d Completes in %d", 2*n, begins, n, completes)
	}
}

// A call that runs alone keeps its own context: an expired deadline is
// reported as context.DeadlineExceeded, not as the cancellation of a
// shared statement.
func TestJournalLoneCallKeepsItsDeadline(t *testing.T) {
	j, _, fp := newCoalesceJournal(t)
	ctx, cancel := context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	_, err := j.Begin(ctx, coalesceKey("late"), fp, time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Begin with an expired deadline = %v; want context.DeadlineExceeded", err)
	}
	if err := j.Complete(ctx, coalesceKey("late"), "ref"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Complete with an expired deadline = %v; want context.DeadlineExceeded", err)
	}
}
