package stripe

import (
	"net/http"
	"sync"
	"testing"
	"time"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
	"go.uber.org/goleak"

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

// must returns v and panics on err: for harness closures that have no
// test to fail.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// newPI is NewPaymentIntents for tests.
func newPI(t testing.TB, api *client.API, opts ...Option) *PaymentIntents {
	t.Helper()
	p, err := NewPaymentIntents(api, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// newRefunds is the refunds effect, New(api.Refunds.New) checking with
// api, for tests.
func newRefunds(t testing.TB, api *client.API, opts ...Option) *Effect[*stripego.RefundParams] {
	t.Helper()
	r, err := New(api.Refunds.New, append([]Option{WithCheckClient(api)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
