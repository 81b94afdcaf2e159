package torture_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"effectively.dev/effects"
	"effectively.dev/internal/torture"
)

// cleanDayTwo is a day-two history a correct fleet could have left: a
// good event sent twice (its mail sent twice after a lease that ran out
// mid-send, within the window its sent-record's two attempts allow), a
// declined event, a panicking one and a poison record, each dead-lettered
// for its own permanent error; a missing bucket that stopped both
// workers, with partition 0 committed up to the record that met it.
func cleanDayTwo() *torture.DayTwoHistory {
	rec := func(p int32, o int64, id string) torture.InputRecord {
		return torture.InputRecord{Partition: p, Offset: o, EventID: id}
	}
	missingBucket := &effects.ConfigError{Op: "s3.Apply", Option: "bucket", Reason: "no such bucket"}
	return &torture.DayTwoHistory{
		Events: map[string]torture.Fault{"ok": torture.FaultNone, "declined": torture.FaultDecline, "panics": torture.FaultPanic},
		Input: []torture.InputRecord{
			rec(0, 0, "ok"), rec(0, 1, "declined"), rec(1, 0, "panics"), rec(1, 1, ""), rec(1, 2, "ok"),
		},
		Committed:    map[int32]int64{0: 2, 1: 3},
		Ledger:       map[string]int{"ok": 1, "declined": 1, "panics": 1},
		Charges:      map[string]int{"ok": 1, "declined": 1},
		Objects:      map[string]int{"ok": 1},
		Mails:        map[string]int{"ok": 2},
		MailAttempts: map[string]int{"ok": 2},
		DeadLetters: []torture.DeadLetter{
			{Record: rec(0, 1, "declined"), Err: effects.Refused("stripe.Apply", "k", errors.New("card_declined"))},
			{Record: rec(1, 0, "panics"), Err: &effects.PanicError{Where: "plan step", Value: "bug"}},
			{Record: rec(1, 1, ""), Err: fmt.Errorf("%w: bad json", effects.ErrPoison)},
		},
		Stops: []torture.ConfigStop{{
			Fault:     "missing bucket",
			Met:       []torture.ConfigHit{{Worker: 0, Record: rec(0, 0, "ok"), Err: missingBucket}, {Worker: 1, Record: rec(1, 0, "panics"), Err: missingBucket}},
			Exits:     []error{fmt.Errorf("consume: %w", missingBucket), missingBucket},
			Committed: map[int32]int64{0: 0},
		}},
	}
}

// TestCheckDayTwo holds CheckDayTwo to each of its rules: a clean history
// passes, and each damage is reported under its rule, and under no other.
// A checker that cannot fail proves nothing about the torture it judges.
func TestCheckDayTwo(t *testing.T) {
	if errs := torture.CheckDayTwo(cleanDayTwo()); len(errs) != 0 {
		t.Fatalf("clean history: %v", errs)
	}
	inFlight := &effects.Error{Kind: effects.ErrInFlight, Op: "email.Apply", Key: "k"}
	cases := []struct {
		name   string
		damage func(h *torture.DayTwoHistory)
		want   []error
	}{
		{"a record not acked at the end", func(h *torture.DayTwoHistory) { h.Committed[1] = 2 }, []error{torture.ErrLost}},
		{"a partition never committed", func(h *torture.DayTwoHistory) { delete(h.Committed, 0) }, []error{torture.ErrLost}},
		{"a good event without its mail", func(h *torture.DayTwoHistory) { delete(h.Mails, "ok") }, []error{torture.ErrLost}},
		{"a good event without its ledger row", func(h *torture.DayTwoHistory) { delete(h.Ledger, "ok") }, []error{torture.ErrLost}},
		{"a poison record acked without a dead letter", func(h *torture.DayTwoHistory) { h.DeadLetters = h.DeadLetters[:2] }, []error{torture.ErrLost}},
		{"a decline acked without a dead letter", func(h *torture.DayTwoHistory) { h.DeadLetters = h.DeadLetters[1:] }, []error{torture.ErrLost}},

		{"two ledger rows", func(h *torture.DayTwoHistory) { h.Ledger["ok"] = 2 }, []error{torture.ErrDuplicated}},
		{"two charges", func(h *torture.DayTwoHistory) { h.Charges["declined"] = 2 }, []error{torture.ErrDuplicated}},
		{"two receipt writes", func(h *torture.DayTwoHistory) { h.Objects["ok"] = 2 }, []error{torture.ErrDuplicated}},
		{"a mail copy outside the window", func(h *torture.DayTwoHistory) { h.MailAttempts["ok"] = 1 }, []error{torture.ErrDuplicated}},

		{"a dead letter for a retryable error", func(h *torture.DayTwoHistory) {
			h.DeadLetters[0].Err = effects.Ambiguous("stripe.Apply", "k", errors.New("lost reply"))
		}, []error{torture.ErrDeadLetterNotPermanent}},
		{"a dead letter for a configuration error", func(h *torture.DayTwoHistory) {
			h.DeadLetters[1].Err = &effects.ConfigError{Op: "stripe.Apply", Option: "API key", Reason: "401"}
		}, []error{torture.ErrDeadLetterNotPermanent}},
		{"a dead letter for an unclassified error", func(h *torture.DayTwoHistory) {
			h.DeadLetters[2].Err = errors.New("something")
		}, []error{torture.ErrDeadLetterNotPermanent}},
		{"a dead letter for a context error", func(h *torture.DayTwoHistory) {
			h.DeadLetters[2].Err = context.DeadlineExceeded
		}, []error{torture.ErrDeadLetterNotPermanent}},
		{"a good event's record dead-lettered as poison", func(h *torture.DayTwoHistory) {
			h.DeadLetters = append(h.DeadLetters, torture.DeadLetter{Record: h.Input[4], Err: effects.ErrPoison})
		}, []error{torture.ErrDeadLetterNotPermanent}},
		{"a decline dead-lettered as a panic", func(h *torture.DayTwoHistory) {
			h.DeadLetters[0].Err = &effects.PanicError{Where: "handler", Value: "x"}
		}, []error{torture.ErrDeadLetterNotPermanent}},

		{"a dead letter for another attempt's lease", func(h *torture.DayTwoHistory) {
			h.DeadLetters = append(h.DeadLetters, torture.DeadLetter{Record: h.Input[4], Err: inFlight})
		}, []error{torture.ErrDeadLetterInFlight}},
		{"a lease wrapped as poison", func(h *torture.DayTwoHistory) {
			h.DeadLetters[2].Err = fmt.Errorf("%w: gave up: %w", effects.ErrPoison, inFlight)
		}, []error{torture.ErrDeadLetterInFlight}},

		{"a worker that went on after a configuration error", func(h *torture.DayTwoHistory) {
			h.Stops[0].Exits[1] = nil
		}, []error{torture.ErrConfigNotStopped}},
		{"a worker that stopped for another reason", func(h *torture.DayTwoHistory) {
			h.Stops[0].Exits[0] = context.Canceled
		}, []error{torture.ErrConfigNotStopped}},
		{"an ack past a configuration error", func(h *torture.DayTwoHistory) {
			h.Stops[0].Committed[0] = 1
		}, []error{torture.ErrConfigNotStopped}},
		{"a hit by a worker the stop does not know", func(h *torture.DayTwoHistory) {
			h.Stops[0].Met[0].Worker = 2
		}, []error{torture.ErrConfigNotStopped}},

		{"a receipt for a declined event", func(h *torture.DayTwoHistory) { h.Objects["declined"] = 1 }, []error{torture.ErrUnexpectedEffect}},
		{"a mail for a panicking event", func(h *torture.DayTwoHistory) {
			h.Mails["panics"], h.MailAttempts["panics"] = 1, 1
		}, []error{torture.ErrUnexpectedEffect}},
	}
	rules := []error{torture.ErrLost, torture.ErrDuplicated, torture.ErrDeadLetterNotPermanent,
		torture.ErrDeadLetterInFlight, torture.ErrConfigNotStopped, torture.ErrUnexpectedEffect}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := cleanDayTwo()
			tc.damage(h)
			errs := torture.CheckDayTwo(h)
			if len(errs) == 0 {
				t.Fatal("CheckDayTwo reported nothing")
			}
			for _, rule := range rules {
				broke := slices.ContainsFunc(errs, func(err error) bool { return errors.Is(err, rule) })
				if want := slices.Contains(tc.want, rule); broke != want {
					t.Errorf("rule %q reported %t, want %t; errors: %v", rule, broke, want, errs)
				}
			}
		})
	}

	// Many violations of one rule: a few are named, the rest counted.
	h := cleanDayTwo()
	h.Committed = map[int32]int64{}
	for i := range 10 {
		h.Input = append(h.Input, torture.InputRecord{Partition: 2, Offset: int64(i), EventID: "ok"})
	}
	errs := torture.CheckDayTwo(h)
	if len(errs) != 6 || !errors.Is(errs[5], torture.ErrLost) {
		t.Errorf("15 unacked records: %d errors %v, want 5 named and one that counts the other 10", len(errs), errs)
	}
}
