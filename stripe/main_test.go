package stripe

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76/client"
	"go.uber.org/goleak"

	"effectively.dev/effects"
	"effectively.dev/stripe/stripetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newAPI returns a stripe-go client for srv whose requests go through rt
// wrapped around a transport of its own (rt may be nil), closed when t
// ends.
func newAPI(t testing.TB, srv *stripetest.Server, wrap func(*http.Transport) *http.Transport) *client.API {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	if wrap != nil {
		tr = wrap(tr)
	}
	return srv.Client(&http.Client{Transport: tr})
}

// memJournal is an in-memory effects.Journal with leases, for tests.
type memJournal struct {
	now func() time.Time

	mu       sync.Mutex
	recs     map[effects.Key]*memRecord
	releases int
}

type memRecord struct {
	fp         []byte
	done       bool
	ref        string
	attempt    int
	leaseUntil time.Time
}

func newMemJournal(now func() time.Time) *memJournal {
	if now == nil {
		now = time.Now
	}
	return &memJournal{now: now, recs: map[effects.Key]*memRecord{}}
}

func (j *memJournal) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (effects.Record, error) {
	if err := ctx.Err(); err != nil {
		return effects.Record{}, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	r := j.recs[key]
	if r == nil {
		r = &memRecord{fp: fp}
		j.recs[key] = r
	}
	if !bytes.Equal(r.fp, fp) {
		return effects.Record{}, &effects.Error{Kind: effects.ErrKeyReused, Op: "memJournal.Begin", Key: key}
	}
	if r.done {
		return effects.Record{Done: true, Ref: r.ref, Attempt: r.attempt}, nil
	}
	if j.now().Before(r.leaseUntil) {
		return effects.Record{}, &effects.Error{Kind: effects.ErrInFlight, Op: "memJournal.Begin", Key: key}
	}
	r.attempt++
	r.leaseUntil = j.now().Add(lease)
	return effects.Record{Attempt: r.attempt}, nil
}

func (j *memJournal) Complete(ctx context.Context, key effects.Key, ref string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	r := j.recs[key]
	if r == nil {
		r = &memRecord{}
		j.recs[key] = r
	}
	if !r.done {
		r.done, r.ref = true, ref
	}
	return nil
}

func (j *memJournal) Release(ctx context.Context, key effects.Key) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if r := j.recs[key]; r != nil && !r.done {
		r.leaseUntil = time.Time{}
	}
	j.releases++
	return nil
}

func (j *memJournal) record(key effects.Key) memRecord {
	j.mu.Lock()
	defer j.mu.Unlock()
	if r := j.recs[key]; r != nil {
		return *r
	}
	return memRecord{}
}

// clock is a settable time source shared by stripetest and the journal.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
