// Package payment is the payment event of the chargehook demo and of its
// stand-alone worker (internal/cmd/chargehook-worker), and the one place
// that decodes and validates it: what cannot be a payment is poison
// (effects.ErrPoison), dead-lettered at its first attempt instead of
// holding its partition.
package payment

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"effectively.dev/effects"
)

// MaxCents is the largest amount an event may charge: one million dollars.
// Larger amounts are not payments this pipeline books; they are bugs
// upstream (a unit mix-up, an overflow).
const MaxCents = 100_000_000

// Event is a payment webhook: the processor tells the billing pipeline to
// charge Cents to Account.
type Event struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Email   string `json:"email"`
	Cents   int64  `json:"cents"`
}

// Decode parses body as an Event and validates it. Every error wraps
// effects.ErrPoison and says what is wrong: body is not a JSON object of
// the event's fields with their types (a string amount, an amount past
// int64), the id is empty or damaged (effects.CheckID: invalid UTF-8, which
// encoding/json would merge with other ids), the account is empty, or the
// amount is not in 1..MaxCents.
func Decode(body []byte) (Event, error) {
	var ev Event
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&ev); err != nil {
		return Event{}, fmt.Errorf("%w: not a payment event: %w", effects.ErrPoison, err)
	}
	if dec.More() {
		return Event{}, fmt.Errorf("%w: not a payment event: data after the JSON object", effects.ErrPoison)
	}
	if err := effects.CheckID(ev.ID); err != nil {
		return Event{}, fmt.Errorf("payment event: %w", err)
	}
	var bad error
	switch {
	case ev.Account == "":
		bad = errors.New("no account")
	case ev.Cents <= 0:
		bad = fmt.Errorf("amount %d cents is not positive", ev.Cents)
	case ev.Cents > MaxCents:
		bad = fmt.Errorf("amount %d cents is over the limit of %d", ev.Cents, MaxCents)
	}
	if bad != nil {
		return Event{}, fmt.Errorf("%w: payment event %q: %w", effects.ErrPoison, ev.ID, bad)
	}
	return ev, nil
}
