package httpkey_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Payment is the input of the effects under test: a charge request whose
// reference names the effect key, so a test can find it in the kit's
// objects.
type Payment struct {
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
	Reference string `json:"reference"`
}

// buildPayment returns the request function for the kit at base: POST
// base/objects with the payment as JSON.
func buildPayment(base string) func(context.Context, Payment) (*http.Request, error) {
	return func(ctx context.Context, p Payment) (*http.Request, error) {
		body, err := json.Marshal(p)
		if err != nil {
			return nil, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/objects", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		return req, nil
	}
}

// buildGraphQL returns the request function for the kit at base in its
// Braintree mode: POST base/graphql with the payment as the mutation's
// variables.input, where the effect puts the key.
func buildGraphQL(base string) func(context.Context, Payment) (*http.Request, error) {
	return func(ctx context.Context, p Payment) (*http.Request, error) {
		body, err := json.Marshal(map[string]any{
			"query":     "mutation Charge($input: ChargePaymentMethodInput!) { chargePaymentMethod(input: $input) { transaction { id } } }",
			"variables": map[string]any{"input": p},
		})
		if err != nil {
			return nil, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/graphql", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		return req, nil
	}
}

// agedClock is the wall clock plus an offset that Age moves forward; the
// kit and the journal read it, so everything that holds keys ages
// together.
type agedClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *agedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *agedClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// newClient returns an http.Client on a transport of its own, closed when
// t ends.
func newClient(t testing.TB) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}
