package torture

import (
	"errors"
	"fmt"
	"slices"

	"effectively.dev/effects"
)

// The rules of the day-two checker ([CheckDayTwo]). Every error it returns
// wraps one of them, so a test can tell which rule a history broke.
var (
	// ErrLost: a record not acked at the end; an event that should have
	// applied without one of its effects; a record of a refused,
	// panicking or poison delivery acked without a dead letter.
	ErrLost = errors.New("lost")
	// ErrDuplicated: more than one ledger row, PaymentIntent or object
	// write for an event, or more copies of its mail than attempts that
	// could have sent them (the mail step's declared window).
	ErrDuplicated = errors.New("duplicated")
	// ErrDeadLetterNotPermanent: a dead letter for an error that is not
	// permanent (its class is not [effects.Permanent]: retryable, unclassified or
	// a configuration error), or for a record whose fault is not the one
	// its error names (a good event's record, a decline dead-lettered as
	// poison).
	ErrDeadLetterNotPermanent = errors.New("dead letter not for a permanent error")
	// ErrDeadLetterInFlight: a dead letter whose error says another
	// attempt held a key ([effects.ErrInFlight] in its chain, whatever
	// wraps it): waiting out the lease would have applied the event.
	ErrDeadLetterInFlight = errors.New("dead letter that waiting out a lease would have applied")
	// ErrConfigNotStopped: a delivery met a configuration error and its
	// worker did not stop with a configuration error, or its partition
	// committed an offset past the delivery's record.
	ErrConfigNotStopped = errors.New("configuration error did not stop the worker")
	// ErrUnexpectedEffect: a receipt or a mail for an event whose charge
	// was refused or whose plan panicked before them.
	ErrUnexpectedEffect = errors.New("effect of an event that should not have applied")
)

// Fault is what an event of the day-two stream is made to meet.
type Fault int

const (
	// FaultNone: a good event; every step must apply, once.
	FaultNone Fault = iota
	// FaultDecline: the card is declined (a permanent refusal, errors.Is
	// [effects.ErrRefused]); the records are dead-lettered, nothing
	// after the charge applies.
	FaultDecline
	// FaultPanic: a step panics ([effects.ErrPanic]); the records are
	// dead-lettered, nothing after the panicking step applies.
	FaultPanic
)

// String names the fault.
func (f Fault) String() string {
	switch f {
	case FaultNone:
		return "none"
	case FaultDecline:
		return "decline"
	case FaultPanic:
		return "panic"
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// DayTwoHistory is what a day-two torture run (a worker fleet running
// Plan(ledger row, Stripe charge, S3 receipt, mail) behind a Kafka
// consumer group) left in the backends, and what its hooks saw.
type DayTwoHistory struct {
	// Events maps every event sent to the fault it carries.
	Events map[string]Fault
	// Input is every record of the input topic; a poison record (a body
	// that does not parse) has an empty EventID.
	Input []InputRecord
	// Committed is the group's committed offset per partition at the end
	// (the next offset to consume; absent: none).
	Committed map[int32]int64
	// Ledger, Charges, Objects and Mails count, per event id, the ledger
	// rows, the PaymentIntents created with the event's charge key, the
	// writes of its receipt object and the copies of its mail the SMTP
	// server accepted.
	Ledger, Charges, Objects, Mails map[string]int
	// MailAttempts is, per event id, the attempts its mail's sent-record
	// counts: each took the key's lease, and only an attempt whose outcome
	// was unknown (a lease that ran out mid-send) lets another send again.
	MailAttempts map[string]int
	// DeadLetters is every call of the dead-letter hook.
	DeadLetters []DeadLetter
	// Stops is every configuration fault the fleet met.
	Stops []ConfigStop
}

// DeadLetter is one call of the dead-letter hook.
type DeadLetter struct {
	Record InputRecord
	// Err is the error the hook was given.
	Err error
}

// ConfigStop is one configuration fault (a missing bucket, a rolled API
// key) and what the fleet did about it.
type ConfigStop struct {
	// Fault names it.
	Fault string
	// Met is every delivery whose handler returned a configuration error.
	Met []ConfigHit
	// Exits is what each worker's Run returned, by worker index.
	Exits []error
	// Committed is the group's committed offset per partition once the
	// fleet had stopped, before it was restarted.
	Committed map[int32]int64
}

// ConfigHit is one delivery that met a configuration error.
type ConfigHit struct {
	// Worker is the index in [ConfigStop].Exits of the worker that ran it.
	Worker int
	Record InputRecord
	Err    error
}

// maxPerRule bounds the errors [CheckDayTwo] returns for one rule; one
// more error says how many were left out.
const maxPerRule = 5

// CheckDayTwo returns every way h breaks the day-two rules, each error
// wrapping its rule's sentinel, or nil:
//
//   - 0 lost ([ErrLost]): every record acked at the end; every good
//     event with its ledger row, its charge, its receipt and its mail;
//     every record of a declined, panicking or poison delivery
//     dead-lettered.
//   - 0 duplicated ([ErrDuplicated]): at most one ledger row, one
//     PaymentIntent and one receipt write per event, and no more copies
//     of its mail than its sent-record counts attempts.
//   - Dead letters only for permanent errors ([ErrDeadLetterNotPermanent]):
//     each dead letter's error is in class [effects.Permanent] and names its
//     record's fault (poison, a refusal, a panic).
//   - No event dead-lettered that waiting out a lease would have applied
//     ([ErrDeadLetterInFlight]): no dead letter with [effects.ErrInFlight]
//     in its error's chain. Such a dead letter is reported by this rule
//     only, not also as not permanent.
//   - Every configuration error stopped its worker, with nothing acked
//     past it ([ErrConfigNotStopped]): the worker that met it returned a
//     configuration error from Run, and its partition's committed offset
//     at the stop is at or below the record's offset.
//
// and, beside them, no receipt or mail for a declined or panicking event
// ([ErrUnexpectedEffect]).
func CheckDayTwo(h *DayTwoHistory) []error {
	var c collector

	// 0 lost.
	dead := map[InputRecord]bool{}
	for _, d := range h.DeadLetters {
		dead[d.Record] = true
	}
	for _, r := range h.Input {
		if committed, ok := h.Committed[r.Partition]; !ok || r.Offset >= committed {
			c.add(ErrLost, "record %s not acked at the end (committed offset %d)", r, committed)
		}
		if (r.EventID == "" || h.Events[r.EventID] != FaultNone) && !dead[r] {
			c.add(ErrLost, "record %s (%s) has no dead letter", r, faultOf(h, r))
		}
	}
	for _, id := range sortedKeys(h.Events) {
		f := h.Events[id]
		if f == FaultNone {
			if h.Ledger[id] == 0 || h.Charges[id] == 0 || h.Objects[id] == 0 || h.Mails[id] == 0 {
				c.add(ErrLost, "%s: %d ledger rows, %d PaymentIntents, %d receipt writes, %d mails; want 1 each",
					id, h.Ledger[id], h.Charges[id], h.Objects[id], h.Mails[id])
			}
		} else if h.Objects[id] != 0 || h.Mails[id] != 0 {
			c.add(ErrUnexpectedEffect, "%s (%s): %d receipt writes, %d mails; want none", id, f, h.Objects[id], h.Mails[id])
		}
	}

	// 0 duplicated.
	for _, id := range sortedKeys(h.Events) {
		if h.Ledger[id] > 1 || h.Charges[id] > 1 || h.Objects[id] > 1 {
			c.add(ErrDuplicated, "%s: %d ledger rows, %d PaymentIntents, %d receipt writes; want at most 1 each",
				id, h.Ledger[id], h.Charges[id], h.Objects[id])
		}
		if h.Mails[id] > max(h.MailAttempts[id], 1) {
			c.add(ErrDuplicated, "%s: %d copies of its mail, but its sent-record counts %d attempts: a copy outside the declared window",
				id, h.Mails[id], h.MailAttempts[id])
		}
	}

	// Dead letters: permanent errors only, and never for a lease.
	for _, d := range h.DeadLetters {
		if errors.Is(d.Err, effects.ErrInFlight) {
			c.add(ErrDeadLetterInFlight, "record %s (%s) dead-lettered for %v", d.Record, faultOf(h, d.Record), d.Err)
			continue
		}
		if effects.ClassOf(d.Err) != effects.Permanent {
			c.add(ErrDeadLetterNotPermanent, "record %s (%s) dead-lettered for a %s error: %v",
				d.Record, faultOf(h, d.Record), effects.ClassOf(d.Err), d.Err)
			continue
		}
		var want error
		switch {
		case d.Record.EventID == "":
			want = effects.ErrPoison
		case h.Events[d.Record.EventID] == FaultDecline:
			want = effects.ErrRefused
		case h.Events[d.Record.EventID] == FaultPanic:
			want = effects.ErrPanic
		}
		if want == nil || !errors.Is(d.Err, want) {
			c.add(ErrDeadLetterNotPermanent, "record %s (%s) dead-lettered for %v, which is not its fault", d.Record, faultOf(h, d.Record), d.Err)
		}
	}

	// Configuration errors stop the worker, nothing acked past them.
	for _, s := range h.Stops {
		for _, hit := range s.Met {
			var exit error
			if hit.Worker >= 0 && hit.Worker < len(s.Exits) {
				exit = s.Exits[hit.Worker]
			}
			if effects.ClassOf(exit) != effects.InvalidConfig {
				c.add(ErrConfigNotStopped, "%s: worker %d met %v at record %s, and its Run returned %v",
					s.Fault, hit.Worker, hit.Err, hit.Record, exit)
			}
			if committed, ok := s.Committed[hit.Record.Partition]; ok && committed > hit.Record.Offset {
				c.add(ErrConfigNotStopped, "%s: partition %d committed offset %d at the stop, past record %s, which met %v",
					s.Fault, hit.Record.Partition, committed, hit.Record, hit.Err)
			}
		}
	}
	return c.errs()
}

// String is "partition/offset event".
func (r InputRecord) String() string {
	id := r.EventID
	if id == "" {
		id = "poison"
	}
	return fmt.Sprintf("%d/%d %s", r.Partition, r.Offset, id)
}

func faultOf(h *DayTwoHistory, r InputRecord) string {
	if r.EventID == "" {
		return "poison"
	}
	f, ok := h.Events[r.EventID]
	if !ok {
		return "never sent"
	}
	return f.String()
}

// collector keeps up to maxPerRule errors per rule, in order.
type collector struct {
	out   []error
	count map[error]int
	rules []error
}

func (c *collector) add(rule error, format string, args ...any) {
	if c.count == nil {
		c.count = map[error]int{}
	}
	if c.count[rule] == 0 {
		c.rules = append(c.rules, rule)
	}
	c.count[rule]++
	if c.count[rule] <= maxPerRule {
		c.out = append(c.out, fmt.Errorf("%w: "+format, append([]any{rule}, args...)...))
	}
}

func (c *collector) errs() []error {
	out := slices.Clone(c.out)
	for _, rule := range c.rules {
		if n := c.count[rule]; n > maxPerRule {
			out = append(out, fmt.Errorf("%w: %d more", rule, n-maxPerRule))
		}
	}
	return out
}
