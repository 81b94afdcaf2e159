package journal_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
)

// faultyJournal wraps a memjournal and fails the calls a test schedules.
type faultyJournal struct {
	*memjournal.Journal
	beginErr    error
	completeErr []error // one per Complete call, then success
	releaseErr  error

	mu                            sync.Mutex
	begins, completes, releaseNos []int
}

func (j *faultyJournal) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (journal.Record, error) {
	j.mu.Lock()
	j.begins = append(j.begins, 1)
	j.mu.Unlock()
	if j.beginErr != nil {
		return journal.Record{}, j.beginErr
	}
	return j.Journal.Begin(ctx, key, fp, lease)
}

func (j *faultyJournal) Complete(ctx context.Context, key effects.Key, ref string) error {
	j.mu.Lock()
	n := len(j.completes)
	j.completes = append(j.completes, 1)
	j.mu.Unlock()
	if n < len(j.completeErr) {
		return j.completeErr[n]
	}
	return j.Journal.Complete(ctx, key, ref)
}

func (j *faultyJournal) Release(ctx context.Context, key effects.Key, attempt int) error {
	j.mu.Lock()
	j.releaseNos = append(j.releaseNos, attempt)
	j.mu.Unlock()
	if j.releaseErr != nil {
		return j.releaseErr
	}
	return j.Journal.Release(ctx, key, attempt)
}

func (j *faultyJournal) counts() (begins, completes, releases int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.begins), len(j.completes), len(j.releaseNos)
}

// owner is an effect's owner as the protocol's call sees it: it counts
// the effects it did and answers what the test scheduled.
type owner struct {
	calls   atomic.Int64
	applied atomic.Int64
	fail    error // returned instead of doing the effect
}

func (o *owner) call(_ context.Context, a *journal.Attempt) (effects.Result, error) {
	o.calls.Add(1)
	if o.fail != nil {
		return effects.Result{}, o.fail
	}
	n := o.applied.Add(1)
	return effects.Result{Status: effects.Applied, Ref: fmt.Sprint("ref-", n)}, nil
}

func newJournaled(t *testing.T, j journal.Journal, opts ...journal.Option) *journal.Journaled {
	t.Helper()
	p, err := journal.NewJournaled("test.Apply", j, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var fp = []byte("fingerprint")

func TestJournaledAppliesOnceAndReplaysFromTheRecord(t *testing.T) {
	j := memjournal.New(nil)
	p := newJournaled(t, j)
	o := &owner{}
	key := effects.MustKey("k")
	first, err := p.Apply(context.Background(), key, fp, o.call)
	if err != nil || first.Status != effects.Applied || first.Ref != "ref-1" {
		t.Fatalf("first Apply = %+v, %v", first, err)
	}
	if rec := j.Get(key); !rec.Done || rec.Ref != "ref-1" {
		t.Fatalf("record %+v, want done with ref-1", rec)
	}
	again, err := p.Apply(context.Background(), key, fp, o.call)
	if err != nil || again.Status != effects.Replayed || again.Ref != "ref-1" {
		t.Fatalf("redelivery = %+v, %v, want replayed ref-1", again, err)
	}
	if n := o.calls.Load(); n != 1 {
		t.Errorf("the owner was called %d times, want 1", n)
	}
	if _, err := p.Apply(context.Background(), key, []byte("other"), o.call); !errors.Is(err, effects.ErrKeyReused) || effects.ClassOf(err) == effects.Retryable {
		t.Errorf("other fingerprint: %v, want a permanent ErrKeyReused", err)
	}
}

func TestJournaledBeginErrorsAreTransient(t *testing.T) {
	cause := errors.New("connection reset by peer")
	for name, beginErr := range map[string]error{
		"unclassified":       cause,
		"ambiguous":          effects.Ambiguous("journal.Begin", "k", cause),
		"transient":          effects.Transient("journal.Begin", "k", cause),
		"context cancelled":  fmt.Errorf("journal: %w", context.Canceled),
		"wrapped classified": fmt.Errorf("journal said: %w", effects.Ambiguous("journal.Begin", "k", cause)),
	} {
		t.Run(name, func(t *testing.T) {
			j := &faultyJournal{Journal: memjournal.New(nil), beginErr: beginErr}
			o := &owner{}
			_, err := newJournaled(t, j).Apply(context.Background(), "k", fp, o.call)
			if !errors.Is(err, effects.ErrTransient) || effects.ClassOf(err) != effects.Retryable {
				t.Fatalf("Apply = %v, want a retryable ErrTransient", err)
			}
			if errors.Is(err, effects.ErrAmbiguous) {
				t.Errorf("%v: the journal's kind leaked into the effect's error", err)
			}
			if name == "context cancelled" && !errors.Is(err, context.Canceled) {
				t.Errorf("%v: context.Canceled is not reachable", err)
			}
			if name != "context cancelled" && !errors.Is(err, cause) {
				t.Errorf("%v: the journal's cause is not reachable", err)
			}
			if o.calls.Load() != 0 {
				t.Errorf("the owner was called after Begin failed")
			}
		})
	}
}

func TestJournaledInFlight(t *testing.T) {
	j := memjournal.New(nil)
	key := effects.MustKey("k")
	if _, err := j.Begin(context.Background(), key, fp, time.Hour); err != nil { // another attempt holds the lease
		t.Fatal(err)
	}
	o := &owner{}
	_, err := newJournaled(t, j).Apply(context.Background(), key, fp, o.call)
	if !errors.Is(err, effects.ErrInFlight) || effects.ClassOf(err) != effects.Retryable || o.calls.Load() != 0 {
		t.Fatalf("Apply = %v after %d calls, want ErrInFlight without calling the owner", err, o.calls.Load())
	}

	// An owner that dedups on the key is called anyway, and its success
	// is recorded although this attempt holds no lease.
	var leased []bool
	call := func(ctx context.Context, a *journal.Attempt) (effects.Result, error) {
		leased = append(leased, a.Leased())
		return effects.Result{Status: effects.Replayed, Ref: "owner-ref"}, nil
	}
	// leaseOnly hides memjournal's DoneJournal methods, so that Apply
	// takes the lease path.
	type leaseOnly struct{ journal.Journal }
	res, err := newJournaled(t, leaseOnly{j}, journal.WithOwnerIdempotency()).Apply(context.Background(), key, fp, call)
	if err != nil || res.Status != effects.Replayed || res.Ref != "owner-ref" {
		t.Fatalf("owner-keyed Apply = %+v, %v", res, err)
	}
	if len(leased) != 1 || leased[0] {
		t.Errorf("calls saw leased = %v, want one unleased call", leased)
	}
	if rec := j.Get(key); !rec.Done || rec.Ref != "owner-ref" {
		t.Errorf("record %+v, want done with the owner's ref", rec)
	}
}

func TestJournaledCompleteIsRetriedThenReportsTheTruth(t *testing.T) {
	lost := effects.Ambiguous("journal.Complete", "k", errors.New("reply lost"))
	t.Run("retried until it commits", func(t *testing.T) {
		j := &faultyJournal{Journal: memjournal.New(nil), completeErr: []error{lost, lost, lost}}
		res, err := newJournaled(t, j).Apply(context.Background(), "k", fp, (&owner{}).call)
		if err != nil || res.Status != effects.Applied {
			t.Fatalf("Apply = %+v, %v, want applied", res, err)
		}
		if _, completes, _ := j.counts(); completes != 4 {
			t.Errorf("%d Complete calls, want 4 (three lost, one committed)", completes)
		}
		if rec := j.Get("k"); !rec.Done {
			t.Errorf("record %+v, want done", rec)
		}
	})
	t.Run("still applied when the record never commits", func(t *testing.T) {
		errs := make([]error, 1000)
		for i := range errs {
			errs[i] = lost
		}
		j := &faultyJournal{Journal: memjournal.New(nil), completeErr: errs}
		var logs bytes.Buffer
		p := newJournaled(t, j, journal.WithRecordTimeout(200*time.Millisecond),
			journal.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		o := &owner{}
		res, err := p.Apply(context.Background(), "k", fp, o.call)
		if err != nil || res.Status != effects.Applied || res.Ref != "ref-1" {
			t.Fatalf("Apply = %+v, %v, want applied ref-1: the owner confirmed it", res, err)
		}
		if _, completes, _ := j.counts(); completes < 2 {
			t.Errorf("%d Complete calls, want retries", completes)
		}
		if !strings.Contains(logs.String(), "did not commit") || !strings.Contains(logs.String(), "ref-1") {
			t.Errorf("log %q does not report the unrecorded success", logs.String())
		}
		if rec := j.Get("k"); rec.Done {
			t.Errorf("record %+v, want pending", rec)
		}
		// Within the lease a retry is in flight, not a second effect.
		if _, err := p.Apply(context.Background(), "k", fp, o.call); !errors.Is(err, effects.ErrInFlight) || o.calls.Load() != 1 {
			t.Errorf("retry within the lease = %v after %d calls, want ErrInFlight", err, o.calls.Load())
		}
	})
	t.Run("a permanent error is not retried", func(t *testing.T) {
		j := &faultyJournal{Journal: memjournal.New(nil), completeErr: []error{errors.New("not begun in this scope")}}
		var logs bytes.Buffer
		p := newJournaled(t, j, journal.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		if _, err := p.Apply(context.Background(), "k", fp, (&owner{}).call); err != nil {
			t.Fatal(err)
		}
		if _, completes, _ := j.counts(); completes != 1 || !strings.Contains(logs.String(), "not begun") {
			t.Errorf("%d Complete calls, log %q; want 1 and the error logged", completes, logs.String())
		}
	})
}

func TestJournaledCompleteRunsAfterTheCallerGaveUp(t *testing.T) {
	j := memjournal.New(nil)
	ctx, cancel := context.WithCancel(context.Background())
	call := func(context.Context, *journal.Attempt) (effects.Result, error) {
		cancel() // the caller gives up while the owner confirms
		return effects.Result{Status: effects.Applied, Ref: "r"}, nil
	}
	if _, err := newJournaled(t, j).Apply(ctx, "k", fp, call); err != nil {
		t.Fatal(err)
	}
	if rec := j.Get("k"); !rec.Done || rec.Ref != "r" {
		t.Errorf("record %+v, want done: Complete runs on a detached context", rec)
	}
}

func TestJournaledReleasesOnlyAfterDefiniteFailures(t *testing.T) {
	declined := errors.New("card declined")
	for _, tc := range []struct {
		name    string
		err     error
		release bool
	}{
		{"transient", effects.Transient("owner", "k", errors.New("429")), true},
		{"key reused at the owner", &effects.Error{Kind: effects.ErrKeyReused, Op: "owner"}, true},
		{"in flight at the owner", &effects.Error{Kind: effects.ErrInFlight, Op: "owner"}, true},
		{"config error", &effects.ConfigError{Op: "owner", Option: "endpoint", Reason: "tls"}, true},
		{"refusal the adapter classifies", fmt.Errorf("refused: %w", declined), true},
		{"ambiguous", effects.Ambiguous("owner", "k", errors.New("reply lost")), false},
		{"ambiguous wrapping a refusal", effects.Ambiguous("owner", "k", declined), false},
		{"unclassified", errors.New("who knows"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := &faultyJournal{Journal: memjournal.New(nil)}
			p := newJournaled(t, j, journal.WithNotApplied(func(err error) bool { return errors.Is(err, declined) }))
			o := &owner{fail: tc.err}
			_, err := p.Apply(context.Background(), "k", fp, o.call)
			if err != tc.err {
				t.Fatalf("Apply = %v, want the call's error as it is", err)
			}
			_, _, releases := j.counts()
			if got := releases == 1; got != tc.release {
				t.Fatalf("%d releases, want release %t", releases, tc.release)
			}
			if tc.release && j.releaseNos[0] != 1 {
				t.Errorf("released attempt %d, want 1", j.releaseNos[0])
			}
			// A released key is taken at once; a pending one is in flight.
			o.fail = nil
			_, err = p.Apply(context.Background(), "k", fp, o.call)
			if tc.release && err != nil {
				t.Errorf("retry after a release = %v, want applied at once", err)
			}
			if !tc.release && !errors.Is(err, effects.ErrInFlight) {
				t.Errorf("retry of a pending key = %v, want ErrInFlight", err)
			}
		})
	}
}

func TestJournaledFailedReleaseIsLogged(t *testing.T) {
	j := &faultyJournal{Journal: memjournal.New(nil), releaseErr: errors.New("journal down")}
	var logs bytes.Buffer
	p := newJournaled(t, j, journal.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	o := &owner{fail: effects.Transient("owner", "k", errors.New("refused"))}
	if _, err := p.Apply(context.Background(), "k", fp, o.call); !errors.Is(err, effects.ErrTransient) {
		t.Fatalf("Apply = %v", err)
	}
	if !strings.Contains(logs.String(), "could not release") || !strings.Contains(logs.String(), "journal down") {
		t.Errorf("log %q", logs.String())
	}
}

func TestJournaledContextDoneAfterBeginReleases(t *testing.T) {
	j := &faultyJournal{Journal: memjournal.New(nil)}
	ctx, cancel := context.WithCancel(context.Background())
	beginThenCancel := &cancelAfterBegin{faultyJournal: j, cancel: cancel}
	o := &owner{}
	_, err := newJournaled(t, beginThenCancel).Apply(ctx, "k", fp, o.call)
	if !errors.Is(err, effects.ErrTransient) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Apply = %v, want ErrTransient wrapping context.Canceled", err)
	}
	if _, _, releases := j.counts(); releases != 1 || o.calls.Load() != 0 {
		t.Errorf("%d releases, %d calls; want 1 and 0", releases, o.calls.Load())
	}
}

type cancelAfterBegin struct {
	*faultyJournal
	cancel context.CancelFunc
}

func (j *cancelAfterBegin) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (journal.Record, error) {
	defer j.cancel()
	return j.faultyJournal.Begin(ctx, key, fp, lease)
}

func TestJournaledCallEndsBeforeItsLease(t *testing.T) {
	const lease = 10 * time.Second
	var deadline time.Time
	var ok bool
	call := func(ctx context.Context, a *journal.Attempt) (effects.Result, error) {
		deadline, ok = ctx.Deadline()
		return effects.Result{Status: effects.Applied}, nil
	}
	start := time.Now()
	if _, err := newJournaled(t, memjournal.New(nil), journal.WithLease(lease)).Apply(context.Background(), "k", fp, call); err != nil {
		t.Fatal(err)
	}
	if !ok || deadline.Sub(start) > lease || deadline.Sub(start) < lease/2 {
		t.Errorf("call deadline %v after the start (set %t), want before the %v lease", deadline.Sub(start), ok, lease)
	}
}

func TestJournaledLateSuccessIsRecorded(t *testing.T) {
	j := memjournal.New(nil)
	p := newJournaled(t, j)
	var late *journal.Attempt
	call := func(ctx context.Context, a *journal.Attempt) (effects.Result, error) {
		late = a
		return effects.Result{}, effects.Ambiguous("owner", "k", errors.New("gave up waiting"))
	}
	if _, err := p.Apply(context.Background(), "k", fp, call); !errors.Is(err, effects.ErrAmbiguous) {
		t.Fatalf("Apply = %v", err)
	}
	if rec := j.Get("k"); rec.Done {
		t.Fatalf("record %+v done before the late success", rec)
	}
	late.Late("late-ref")
	res, err := p.Apply(context.Background(), "k", fp, (&owner{}).call)
	if err != nil || res.Status != effects.Replayed || res.Ref != "late-ref" {
		t.Errorf("retry after the late success = %+v, %v, want replayed late-ref", res, err)
	}
}

func TestJournaledWithoutJournal(t *testing.T) {
	p := newJournaled(t, nil)
	o := &owner{}
	var number int
	call := func(ctx context.Context, a *journal.Attempt) (effects.Result, error) {
		number = a.Number()
		return o.call(ctx, a)
	}
	for range 2 {
		if res, err := p.Apply(context.Background(), "k", nil, call); err != nil || res.Status != effects.Applied {
			t.Fatalf("Apply = %+v, %v", res, err)
		}
	}
	if o.calls.Load() != 2 || number != 0 {
		t.Errorf("%d calls, attempt number %d; want every Apply to call the owner, unleased", o.calls.Load(), number)
	}
	if _, err := p.Apply(context.Background(), "", nil, call); !errors.Is(err, effects.ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Apply(ctx, "k", nil, call); !errors.Is(err, effects.ErrTransient) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want ErrTransient wrapping context.Canceled", err)
	}
	if o.calls.Load() != 2 {
		t.Errorf("the owner was called for an invalid key or a cancelled context")
	}
}

func TestJournaledInvalidKeyDoesNoIO(t *testing.T) {
	j := &faultyJournal{Journal: memjournal.New(nil)}
	if _, err := newJournaled(t, j).Apply(context.Background(), "a\x00b", fp, (&owner{}).call); !errors.Is(err, effects.ErrInvalidKey) {
		t.Fatalf("Apply = %v", err)
	}
	if begins, _, _ := j.counts(); begins != 0 {
		t.Errorf("%d Begin calls for an invalid key", begins)
	}
}

func TestNewJournaledRefusesBadConfiguration(t *testing.T) {
	j := memjournal.New(nil)
	for _, tc := range []struct {
		name, op, option string
		opts             []journal.Option
	}{
		{"empty op", "", "op", nil},
		{"zero lease", "x", "WithLease", []journal.Option{journal.WithLease(0)}},
		{"negative lease", "x", "WithLease", []journal.Option{journal.WithLease(-time.Second)}},
		{"zero record timeout", "x", "WithRecordTimeout", []journal.Option{journal.WithRecordTimeout(0)}},
	} {
		_, err := journal.NewJournaled(tc.op, j, tc.opts...)
		var ce *effects.ConfigError
		if !errors.As(err, &ce) || ce.Option != tc.option {
			t.Errorf("%s: %v, want a *ConfigError naming %s", tc.name, err, tc.option)
		}
	}
	p, err := journal.NewJournaled("x", j, nil, journal.WithLease(time.Second), nil)
	if err != nil || p.Lease() != time.Second {
		t.Errorf("nil options: %v, lease %v; want them ignored", err, p.Lease())
	}
	if p, _ := journal.NewJournaled("x", j); p.Lease() != time.Minute || p.Journal() != journal.Journal(j) {
		t.Errorf("default lease %v, want one minute", p.Lease())
	}
}

// An adapter built on Journaled: an in-memory "mailer" whose call is all
// it writes.
func ExampleJournaled() {
	j := memjournal.New(nil) // in production: postgres.NewJournal
	send, err := journal.NewJournaled("mailer.Send", j)
	if err != nil {
		panic(err)
	}
	sent := 0
	call := func(ctx context.Context, a *journal.Attempt) (effects.Result, error) {
		sent++ // the effect: talk to the owner, classify its errors
		return effects.Result{Status: effects.Applied, Ref: fmt.Sprint("queued-", sent)}, nil
	}
	key := effects.MustKey("shop", "order-7", "receipt")
	for range 3 { // a message delivered three times
		res, err := send.Apply(context.Background(), key, []byte("the message's fingerprint"), call)
		fmt.Println(res.Status, res.Ref, err)
	}
	fmt.Println("sent:", sent)
	// Output:
	// applied queued-1 <nil>
	// replayed queued-1 <nil>
	// replayed queued-1 <nil>
	// sent: 1
}

// doneJournal is a faultyJournal that also counts and fails the
// DoneJournal calls.
type doneJournal struct {
	*faultyJournal
	lookupErr      error
	markErrs       []error // one per MarkDone call, then success
	lookups, marks int
}

func (j *doneJournal) Lookup(ctx context.Context, key effects.Key, fp []byte) (journal.Record, error) {
	j.lookups++
	if j.lookupErr != nil {
		return journal.Record{}, j.lookupErr
	}
	return j.Journal.Lookup(ctx, key, fp)
}

func (j *doneJournal) MarkDone(ctx context.Context, key effects.Key, fp []byte, ref string) error {
	n := j.marks
	j.marks++
	if n < len(j.markErrs) {
		return j.markErrs[n]
	}
	return j.Journal.MarkDone(ctx, key, fp, ref)
}

// An owner that dedups on the key, over a DoneJournal: no lease, one
// journal write per effect (MarkDone), replays and key reuse from Lookup,
// nothing recorded or released after a failure, a lost MarkDone retried.
func TestJournaledOwnerKeyedTakesNoLease(t *testing.T) {
	newDone := func() *doneJournal { return &doneJournal{faultyJournal: &faultyJournal{Journal: memjournal.New(nil)}} }
	ctx := context.Background()
	key := effects.MustKey("k")

	j := newDone()
	var leased []bool
	o := &owner{}
	call := func(ctx context.Context, a *journal.Attempt) (effects.Result, error) {
		leased = append(leased, a.Leased() || a.Number() != 0)
		return o.call(ctx, a)
	}
	p := newJournaled(t, j, journal.WithOwnerIdempotency())
	res, err := p.Apply(ctx, key, fp, call)
	if err != nil || res != (effects.Result{Status: effects.Applied, Ref: "ref-1"}) {
		t.Fatalf("Apply = %+v, %v", res, err)
	}
	if rec := j.Get(key); !rec.Done || rec.Ref != "ref-1" || string(rec.Fingerprint) != string(fp) {
		t.Errorf("record %+v, want done with ref-1 and the fingerprint", rec)
	}
	begins, completes, releases := j.counts()
	if begins+completes+releases != 0 || j.lookups != 1 || j.marks != 1 || len(leased) != 1 || leased[0] {
		t.Errorf("%d Begin, %d Complete, %d Release, %d Lookup, %d MarkDone, leased %v; want one Lookup and one MarkDone, no lease",
			begins, completes, releases, j.lookups, j.marks, leased)
	}
	if res, err := p.Apply(ctx, key, fp, call); err != nil || res != (effects.Result{Status: effects.Replayed, Ref: "ref-1"}) || o.calls.Load() != 1 {
		t.Errorf("redelivery = %+v, %v after %d calls; want the record replayed without a call", res, err, o.calls.Load())
	}
	if _, err := p.Apply(ctx, key, []byte("other"), call); !errors.Is(err, effects.ErrKeyReused) || o.calls.Load() != 1 {
		t.Errorf("another payload = %v after %d calls; want ErrKeyReused without a call", err, o.calls.Load())
	}

	t.Run("a failed call records and releases nothing", func(t *testing.T) {
		j := newDone()
		o := &owner{fail: effects.Ambiguous("owner", key, errors.New("reply lost"))}
		if _, err := newJournaled(t, j, journal.WithOwnerIdempotency()).Apply(ctx, key, fp, o.call); !errors.Is(err, effects.ErrAmbiguous) {
			t.Fatalf("Apply = %v, want the call's error", err)
		}
		if _, _, releases := j.counts(); releases != 0 || j.marks != 0 || j.Get(key).Fingerprint != nil {
			t.Errorf("%d Release, %d MarkDone, record %+v; want nothing", releases, j.marks, j.Get(key))
		}
	})
	t.Run("a failed Lookup is transient and calls nobody", func(t *testing.T) {
		j := newDone()
		j.lookupErr = errors.New("connection refused")
		o := &owner{}
		_, err := newJournaled(t, j, journal.WithOwnerIdempotency()).Apply(ctx, key, fp, o.call)
		if !errors.Is(err, effects.ErrTransient) || o.calls.Load() != 0 {
			t.Errorf("Apply = %v after %d calls, want ErrTransient without a call", err, o.calls.Load())
		}
	})
	t.Run("a lost MarkDone is retried", func(t *testing.T) {
		j := newDone()
		lost := effects.Ambiguous("journal.MarkDone", key, errors.New("reply lost"))
		j.markErrs = []error{lost, lost}
		res, err := newJournaled(t, j, journal.WithOwnerIdempotency()).Apply(ctx, key, fp, (&owner{}).call)
		if err != nil || res.Status != effects.Applied || j.marks != 3 || !j.Get(key).Done {
			t.Errorf("Apply = %+v, %v after %d MarkDone calls, record %+v; want applied and recorded on the third", res, err, j.marks, j.Get(key))
		}
	})
	t.Run("without WithOwnerIdempotency the lease is taken", func(t *testing.T) {
		j := newDone()
		if _, err := newJournaled(t, j).Apply(ctx, key, fp, (&owner{}).call); err != nil {
			t.Fatal(err)
		}
		if begins, completes, _ := j.counts(); begins != 1 || completes != 1 || j.lookups+j.marks != 0 {
			t.Errorf("%d Begin, %d Complete, %d Lookup, %d MarkDone; want the lease protocol", begins, completes, j.lookups, j.marks)
		}
	})
}

// TestJournaledReportsToItsObserver: with an observer, a failed release
// is an EventFailed of the journal and a lease held by another attempt an
// EventInFlight, each with the key, and nothing is logged.
func TestJournaledReportsToItsObserver(t *testing.T) {
	j := &faultyJournal{Journal: memjournal.New(nil), releaseErr: errors.New("journal down")}
	var (
		logs   bytes.Buffer
		events []effects.Event
	)
	p := newJournaled(t, j, journal.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		journal.WithObserver(effects.ObserverFunc(func(_ context.Context, ev effects.Event) { events = append(events, ev) })))
	o := &owner{fail: effects.Ambiguous("owner", "k", errors.New("reply lost"))}
	if _, err := p.Apply(context.Background(), "k", fp, o.call); !errors.Is(err, effects.ErrAmbiguous) {
		t.Fatalf("Apply = %v, want the owner's ambiguous error", err)
	}
	if _, err := p.Apply(context.Background(), "k", fp, o.call); !errors.Is(err, effects.ErrInFlight) {
		t.Fatalf("Apply within the lease = %v, want ErrInFlight", err)
	}
	o.fail = effects.Transient("owner", "t", errors.New("refused"))
	if _, err := p.Apply(context.Background(), "t", fp, o.call); !errors.Is(err, effects.ErrTransient) {
		t.Fatalf("Apply = %v, want the owner's transient error", err)
	}
	want := []struct {
		kind effects.EventKind
		key  effects.Key
		err  string
	}{{effects.EventInFlight, "k", "in flight"}, {effects.EventFailed, "t", "journal down"}}
	if len(events) != len(want) {
		t.Fatalf("observed %+v, want %d events", events, len(want))
	}
	for i, w := range want {
		ev := events[i]
		if ev.Kind != w.kind || ev.Key != w.key || ev.Component != "journal" || ev.Err == nil || !strings.Contains(ev.Err.Error(), w.err) {
			t.Errorf("event %d = %+v, want %v of the journal for %s, error containing %q", i, ev, w.kind, w.key, w.err)
		}
	}
	if logs.Len() != 0 {
		t.Errorf("logged %q with an observer; want the events only", logs.String())
	}
}
