package chargehook

import (
	"fmt"
	"math/rand/v2"
	"time"

	"effectively.dev/internal/payment"
)

// Event is a payment webhook: the processor tells the billing pipeline to
// charge Cents to Account. payment.Decode decodes and validates it.
type Event = payment.Event

// Faults is what the schedule does to one event on its way.
type Faults struct {
	// SenderRetry: the reply to the processor's first attempt is lost, and
	// the processor sends the event again after RetryAfter.
	SenderRetry bool
	RetryAfter  time.Duration
	// SiblingRetry: the pod the balancer picks first freezes past the
	// balancer's per-try timeout; the balancer retries on the sibling.
	SiblingRetry bool
	// Crash: the worker crashes after the event's effects committed, before
	// the ack.
	Crash bool
}

// Schedule is the seeded plan of a run: the events, and the faults that
// hit each. Both handlers run the same Schedule.
type Schedule struct {
	Seed   uint64
	Events []Event
	// Faults maps an event id to its faults; events without faults are
	// absent.
	Faults map[string]Faults
	// FailoverAfter is how many events the worker has finished when the
	// primary is killed (0 when the config has no failover).
	FailoverAfter int
}

// NewSchedule draws the schedule of cfg from cfg.Seed.
func NewSchedule(cfg Config) Schedule {
	r := rand.New(rand.NewPCG(cfg.Seed, 0x6368617267656870)) // "chargehp"
	s := Schedule{Seed: cfg.Seed, Faults: map[string]Faults{}}
	for i := range cfg.Events {
		ev := Event{
			ID:    fmt.Sprintf("evt_%06d", i),
			Cents: int64(100 + r.IntN(100000)),
		}
		acct := r.IntN(500)
		ev.Account = fmt.Sprintf("acct_%03d", acct)
		ev.Email = fmt.Sprintf("billing+%03d@customer.example", acct)
		s.Events = append(s.Events, ev)
		// Draw every fault for every event, so that changing one rate does
		// not move the others' draws.
		var f Faults
		f.SenderRetry = r.Float64() < cfg.Sender
		f.RetryAfter = time.Duration(50+r.IntN(250)) * time.Millisecond
		f.SiblingRetry = r.Float64() < cfg.Sibling
		f.Crash = r.Float64() < cfg.Crash
		if f.SenderRetry || f.SiblingRetry || f.Crash {
			s.Faults[ev.ID] = f
		}
	}
	at := r.Float64() // drawn even without a failover, for the same reason
	if cfg.Failover {
		s.FailoverAfter = max(1, int(float64(cfg.Events)*(0.3+0.3*at)))
	}
	return s
}

// Count returns how many events the schedule hits with each fault.
func (s Schedule) Count() (sender, sibling, crash int) {
	for _, f := range s.Faults {
		if f.SenderRetry {
			sender++
		}
		if f.SiblingRetry {
			sibling++
		}
		if f.Crash {
			crash++
		}
	}
	return sender, sibling, crash
}
