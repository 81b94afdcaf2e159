package payment_test

import (
	"errors"
	"strings"
	"testing"

	"effectively.dev/effects"
	"effectively.dev/internal/payment"
)

// TestDecode: what cannot be a payment is poison with a message that says
// why; a good event decodes.
func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name, body, says string
	}{
		{"bad JSON", `{"id":`, "not a payment event"},
		{"not an object", `[1,2]`, "not a payment event"},
		{"string amount", `{"id":"e1","account":"a","cents":"100"}`, "cannot unmarshal string"},
		{"amount past int64", `{"id":"e1","account":"a","cents":99999999999999999999}`, "cannot unmarshal number"},
		{"trailing data", `{"id":"e1","account":"a","cents":1} {}`, "data after"},
		{"no id", `{"account":"a","cents":100}`, "message id \"\": empty"},
		{"empty id", `{"id":"","account":"a","cents":100}`, "empty"},
		{"invalid UTF-8 id", "{\"id\":\"evt-\xff\",\"account\":\"a\",\"cents\":100}", "U+FFFD"},
		{"lone surrogate id", `{"id":"evt-\ud800","account":"a","cents":100}`, "U+FFFD"},
		{"no account", `{"id":"e1","cents":100}`, "no account"},
		{"zero amount", `{"id":"e1","account":"a","cents":0}`, "not positive"},
		{"negative amount", `{"id":"e1","account":"a","cents":-5}`, "not positive"},
		{"absurd amount", `{"id":"e1","account":"a","cents":100000000000}`, "over the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := payment.Decode([]byte(tc.body))
			if !errors.Is(err, effects.ErrPoison) {
				t.Fatalf("Decode(%s) = %+v, %v; want ErrPoison", tc.body, ev, err)
			}
			if !strings.Contains(err.Error(), tc.says) || strings.Contains(err.Error(), "<nil>") {
				t.Errorf("Decode(%s): %q, want it to say %q", tc.body, err, tc.says)
			}
		})
	}
	ev, err := payment.Decode([]byte(`{"id":"evt_42","account":"acct_1","email":"a@example.com","cents":1250}`))
	if err != nil || ev != (payment.Event{ID: "evt_42", Account: "acct_1", Email: "a@example.com", Cents: 1250}) {
		t.Fatalf("Decode of a good event: %+v, %v", ev, err)
	}
}
