package chargehook

import (
	"errors"
	"fmt"
	"time"

	"effectively.dev/effects"
)

// Config sets the size, the fault rates and the environment of a run. The
// zero value is not runnable; start from [DefaultConfig].
type Config struct {
	// Events is how many payment events the processor emits.
	Events int
	// Workers is how many handlers the worker runs at once; the webhook
	// topic gets as many partitions, since the consumer runs one handler per
	// partition at a time.
	Workers int
	// Seed seeds the fault schedule: the same seed gives both handlers, and
	// every run, the same events and the same faults.
	Seed uint64

	// Sender is the probability that the processor does not get the 200 for
	// an event it delivered and sends it again later (a sequential
	// duplicate at hop 1).
	Sender float64
	// Sibling is the probability that the pod the load balancer picked
	// freezes (a GC pause) past the balancer's per-try timeout, so that the
	// balancer retries on the sibling pod while the frozen one still
	// enqueues (a concurrent duplicate at hop 2).
	Sibling float64
	// Crash is the probability that the worker crashes after the handler's
	// effects committed and before the ack, so the message is delivered
	// again (hop 4).
	Crash float64
	// Failover kills the PostgreSQL primary (an immediate shutdown) in the
	// middle of each handler's run, with events in flight, and promotes the
	// synchronous standby; the worker's pool follows with a multi-host URL
	// and target_session_attrs=read-write (hop 5).
	Failover bool
	// Standby keeps a synchronous standby of each run's primary without
	// the failover, which shows what the standby costs each handler. (With
	// Failover there is always one.)
	Standby bool

	// NaiveTwice runs the naive handler on both sides, the second in
	// place of the effectively-once handler: the same schedule, backends
	// made alike and the same order as a normal run. The two throughputs
	// then differ only by what the machine did meanwhile, which shows how
	// far apart a normal run's two sides can land for reasons other than
	// their handlers (cmd/chargehook -noise). It needs the demo's own
	// clusters.
	NaiveTwice bool

	// DatabaseURL, if set, runs on that server instead of throwaway
	// clusters; Failover is then impossible and must be off. The demo
	// creates its own tables there (names starting with chargehook_).
	DatabaseURL string
	// Observer, if not nil, receives every plan step's and every consumer
	// retry's event (see package effectively.dev/observe).
	Observer effects.Observer
	// Progress, if not nil, is called about ten times a second while a
	// handler runs, with the handler's name, the events it has finished and
	// the number of events; and once with done == total at the end.
	Progress func(handler string, done, total int)
	// Log, if not nil, receives one line per phase ("starting PostgreSQL
	// ...", "failover: ...").
	Log func(format string, args ...any)
	// Timeout bounds the whole run; 0 means 10 minutes.
	Timeout time.Duration
}

// DefaultConfig is what `go run ./cmd/chargehook` runs: 1,000 events with
// every kind of fault, including a failover.
func DefaultConfig() Config {
	return Config{
		Events:   1000,
		Workers:  8,
		Seed:     42,
		Sender:   0.05,
		Sibling:  0.05,
		Crash:    0.03,
		Failover: true,
	}
}

// Validate reports a configuration that cannot run.
func (c Config) Validate() error {
	var errs []error
	if c.Events <= 0 {
		errs = append(errs, fmt.Errorf("events must be positive, got %d", c.Events))
	}
	if c.Workers <= 0 || c.Workers > 64 {
		errs = append(errs, fmt.Errorf("workers must be between 1 and 64, got %d", c.Workers))
	}
	for _, p := range []struct {
		name string
		v    float64
	}{{"sender", c.Sender}, {"sibling", c.Sibling}, {"crash", c.Crash}} {
		if !(p.v >= 0 && p.v <= 1) {
			errs = append(errs, fmt.Errorf("%s rate %v is not a probability", p.name, p.v))
		}
	}
	if c.Failover && c.DatabaseURL != "" {
		errs = append(errs, errors.New("a failover needs the demo's own primary and standby: unset DATABASE_URL or turn failover off"))
	}
	if c.Standby && c.DatabaseURL != "" {
		errs = append(errs, errors.New("a standby needs the demo's own primary: unset DATABASE_URL or turn the standby off"))
	}
	if c.NaiveTwice && c.DatabaseURL != "" {
		errs = append(errs, errors.New("running the naive handler twice needs the demo's own clusters (on one server the second run would find the first's rows): unset DATABASE_URL"))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("negative timeout %v", c.Timeout))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("chargehook: %w", errors.Join(errs...))
}

func (c Config) logf(format string, args ...any) {
	if c.Log != nil {
		c.Log(format, args...)
	}
}
