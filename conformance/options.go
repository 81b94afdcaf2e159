package conformance

import (
	"context"
	"slices"
	"strings"
	"time"

	"effectively.dev/effects"
)

// Defaults of the suite's options.
const (
	// raceAttempts is how many goroutines apply one key at once in the
	// concurrency scenarios, and begin one key at once in the journal suite.
	raceAttempts = 16
	// defaultStormKeys and defaultStormSeen size the replay storm: keys in
	// all, and the fraction applied before the storm ([WithStorm]).
	defaultStormKeys = 1000
	defaultStormSeen = 0.99
	// defaultMaxSweep bounds how many round trips of one Apply the fault
	// sweeps visit ([WithMaxSweep]).
	defaultMaxSweep = 64
	// defaultTimeout bounds one scenario ([WithTimeout]).
	defaultTimeout = 3 * time.Minute
	// defaultRetryFor bounds how long the suite retries a key whose Apply
	// failed with a retryable error ([WithRetryFor]).
	defaultRetryFor = 30 * time.Second
	// defaultApplyTimeout bounds one call of Apply, Begin, Next or Ack; a
	// call that takes longer is reported as a hang ([WithApplyTimeout]).
	defaultApplyTimeout = 30 * time.Second
	// defaultLateRedelivery is how long the late-redelivery scenario waits,
	// on the wall clock, before it redelivers ([WithLateRedelivery]).
	defaultLateRedelivery = 5 * time.Second
	// longAge is how far the horizon scenario ages the backend for a
	// contract whose Horizon is 0, "kept until pruned".
	longAge = 400 * 24 * time.Hour
	// defaultLease is the lease the journal suite asks for when it waits
	// for leases to expire ([WithLease]).
	defaultLease = 500 * time.Millisecond
	// defaultRedeliveryWait bounds how long the source suite waits for a
	// delivery to come back after a close, a crash or a rebalance
	// ([WithRedeliveryWait]).
	defaultRedeliveryWait = 60 * time.Second
	// sourceMessages is how many messages each source scenario
	// publishes.
	sourceMessages = 24
	// defaultQuietPeriod is how long the fault sweeps wait, after an Apply
	// returned ErrTransient and before its retry, to count the key's
	// effects again ([WithQuietPeriod]).
	defaultQuietPeriod = 500 * time.Millisecond
	// defaultCapacity is how many keys the key-capacity scenario applies
	// between a key and its redelivery ([WithCapacity]).
	defaultCapacity = 5000
)

// Option is an option every suite takes: [Only], [AllowUnverified],
// [ReportOnly], [WithTimeout] and [WithApplyTimeout]. The other options
// are scoped to the suites they tune, by type: an [EffectOption] is taken
// by [Run], a [JournalOption] by [RunJournal], a [SourceOption] by
// [RunSource], a [PlanOption] by [RunPlan], so an option given to a suite
// it does not tune does not compile. Options record a value; the Run
// functions validate them once, before any scenario, and fail the test
// with an *[effects.ConfigError] naming the first bad one. A nil option is
// ignored.
type Option interface {
	EffectOption
	JournalOption
	SourceOption
	PlanOption
}

// EffectOption tunes the effect suite ([Run]).
type EffectOption interface{ effectOption(*config) }

// JournalOption tunes the journal suite ([RunJournal]).
type JournalOption interface{ journalOption(*config) }

// SourceOption tunes the source suite ([RunSource]).
type SourceOption interface{ sourceOption(*config) }

// PlanOption tunes the plan suite ([RunPlan]).
type PlanOption interface{ planOption(*config) }

// SweepOption tunes the suites that sweep faults over round trips and
// retry: effects and plans ([WithRetryFor], [WithMaxSweep]).
type SweepOption interface {
	EffectOption
	PlanOption
}

// opt is every option's value; the constructor's result type says which
// suites take it.
type opt func(*config)

func (o opt) effectOption(c *config)  { o(c) }
func (o opt) journalOption(c *config) { o(c) }
func (o opt) sourceOption(c *config)  { o(c) }
func (o opt) planOption(c *config)    { o(c) }

type config struct {
	stormKeys      int
	stormSeen      float64
	maxSweep       int
	timeout        time.Duration
	retryFor       time.Duration
	applyTimeout   time.Duration
	lateRedelivery time.Duration
	lease          time.Duration
	redeliveryWait time.Duration
	sourceBacklog  int // WithSourceBacklog; 0: defaultSourceBacklog
	slowReply      time.Duration
	slowReplySet   bool // WithSlowReply was given: the slow-reply scenario runs
	quietPeriod    time.Duration
	capacity       int
	only           []string
	unverified     string   // AllowUnverified's reason
	unverifiedFor  []string // the scenarios it covers; nil: every one
	successor      any      // WithSuccessorProcess's attach function
	reportOnly     bool     // ReportOnly: failures do not fail the test
	gen            genConfig

	op  string // the suite's function, for errors: "conformance.Run"
	err error  // the first bad option's error
}

// bad records the error of a bad option; the first one wins.
func (c *config) bad(option, format string, args ...any) {
	if c.err == nil {
		c.err = effects.ConfigErrorf(c.op, option, format, args...)
	}
}

func defaults() config {
	return config{
		stormKeys:      defaultStormKeys,
		stormSeen:      defaultStormSeen,
		maxSweep:       defaultMaxSweep,
		timeout:        defaultTimeout,
		retryFor:       defaultRetryFor,
		applyTimeout:   defaultApplyTimeout,
		lateRedelivery: defaultLateRedelivery,
		lease:          defaultLease,
		redeliveryWait: defaultRedeliveryWait,
		slowReply:      defaultSlowReply,
		quietPeriod:    defaultQuietPeriod,
		capacity:       defaultCapacity,
	}
}

// WithStorm sets the replay storm's size: keys in all, and the fraction of
// them applied before the storm (defaults 1,000 and 0.99). keys must be at
// least 10 and seen in (0, 1), leaving at least one key new and one seen.
func WithStorm(keys int, seen float64) EffectOption {
	return opt(func(c *config) {
		switch n := int(float64(keys) * seen); {
		case keys < 10:
			c.bad("WithStorm", "%d keys: at least 10", keys)
		case !(seen > 0 && seen < 1):
			c.bad("WithStorm", "seen fraction %v: must be in (0, 1)", seen)
		case n < 1 || n >= keys:
			c.bad("WithStorm", "%d keys with %v seen leaves no seen or no new key", keys, seen)
		}
		c.stormKeys, c.stormSeen = keys, seen
	})
}

// WithMaxSweep bounds how many round trips of one Apply the fault sweeps
// visit (default 64, at least 1); an Apply with more round trips is swept
// up to this bound and the report says so.
func WithMaxSweep(n int) SweepOption {
	return opt(func(c *config) {
		if n < 1 {
			c.bad("WithMaxSweep", "%d: at least 1", n)
		}
		c.maxSweep = n
	})
}

// WithRetryFor bounds how long the suite keeps retrying a key whose Apply
// failed with a retryable error (default 30s). Adapters with leases (a
// Journal) need it longer than their lease.
func WithRetryFor(d time.Duration) SweepOption {
	return opt(func(c *config) {
		if d < 0 {
			c.bad("WithRetryFor", "%v: must not be negative", d)
		}
		c.retryFor = d
	})
}

// WithTimeout bounds each scenario (default 3m).
func WithTimeout(d time.Duration) Option {
	return opt(func(c *config) {
		if d <= 0 {
			c.bad("WithTimeout", "%v: must be positive", d)
		}
		c.timeout = d
	})
}

// WithApplyTimeout bounds each single call the suite makes into the code
// under test: an Apply, a journal's Begin/Complete/Release, a source's Ack
// (default 30s). A call still running then is reported as a hang, naming
// the call and the round trip it was on; its context is cancelled and its
// connections cut so the scenario can go on. A source's Next is bounded by
// [WithRedeliveryWait] instead.
func WithApplyTimeout(d time.Duration) Option {
	return opt(func(c *config) {
		if d <= 0 {
			c.bad("WithApplyTimeout", "%v: must be positive", d)
		}
		c.applyTimeout = d
	})
}

// WithLateRedelivery sets how long the late-redelivery scenario waits on
// the wall clock between an Apply and its redelivery (default 5s).
func WithLateRedelivery(d time.Duration) EffectOption {
	return opt(func(c *config) {
		if d <= 0 {
			c.bad("WithLateRedelivery", "%v: must be positive", d)
		}
		c.lateRedelivery = d
	})
}

// WithLease sets the lease the journal suite takes when it needs one to
// expire (default 500ms, at least 10ms); the suite waits a little longer
// than it.
func WithLease(d time.Duration) JournalOption {
	return opt(func(c *config) {
		if d < 10*time.Millisecond {
			c.bad("WithLease", "%v: at least 10ms, or the suite cannot hold a lease while it checks it", d)
		}
		c.lease = d
	})
}

// WithRedeliveryWait bounds how long the source suite waits for deliveries
// to come back after a close, a crash or a rebalance (default 60s). A
// source that redelivers only after a lock or session expires needs it
// longer than that expiry.
func WithRedeliveryWait(d time.Duration) SourceOption {
	return opt(func(c *config) {
		if d <= 0 {
			c.bad("WithRedeliveryWait", "%v: must be positive", d)
		}
		c.redeliveryWait = d
	})
}

// WithSlowReply runs the slow-reply scenario, which holds each reply of
// an Apply in turn for d (see [SlowReply]); without it the scenario does
// not run, and the guarantee it verifies is not verified (so [Run] fails
// unless [AllowUnverified] says why). Make d longer than the adapter's own
// per-call deadline, if it has one, for the scenario to hold a reply past
// it: an adapter that gives up waits at most its deadline, one
// that waits gets the reply d late, so the scenario takes about d for
// each faulted Apply.
func WithSlowReply(d time.Duration) EffectOption {
	return opt(func(c *config) {
		if d <= 0 {
			c.bad("WithSlowReply", "%v: must be positive", d)
		}
		c.slowReply, c.slowReplySet = d, true
	})
}

// WithQuietPeriod sets how long the fault sweeps wait after an Apply
// returned ErrTransient before they count the key's effects again and
// retry it (default 500ms): an adapter that handed the work to something
// that applies it later broke ErrTransient's promise just as one that
// applied it at once. Make it at least the adapter's own per-call
// deadline.
func WithQuietPeriod(d time.Duration) EffectOption {
	return opt(func(c *config) {
		if d < 0 {
			c.bad("WithQuietPeriod", "%v: must not be negative", d)
		}
		c.quietPeriod = d
	})
}

// WithSuccessorProcess lets the successor-process scenario run: the suite
// redelivers keys in a child process (the test binary, run again for just
// the test that called [Run]), which shares no memory with the instances
// of the test process, so a dedup whose authority is process memory (a
// package-level cache, a per-process session id) is caught. The harness
// must implement [Attacher]; in the child, Run calls attach with the
// harness's Attachment instead of mk, makes one instance, applies
// the key and returns without running any scenario. attach must not start
// a backend: it connects to the one the attachment names. attach's In must
// be Run's.
func WithSuccessorProcess[In any](attach func(ctx context.Context, attachment string) (Harness[In], error)) EffectOption {
	return opt(func(c *config) {
		if attach == nil {
			c.bad("WithSuccessorProcess", "nil attach function")
			return
		}
		c.successor = attach
	})
}

// AllowUnverified lets [Run], [RunJournal], [RunSource] or [RunPlan] pass
// when a field cannot be verified (a scenario that verifies it did not
// run for want of a capability, was left out by [Only], or ran reduced),
// for the reason given, which the report and the matrix show beside each
// such field. Without it such a run fails the test, naming each scenario
// left out, why, and what the harness must give: a contract the suite
// could not check is a claim, not a guarantee. The reason must say why
// the harness cannot do better ("the backend's clock cannot be moved and
// its horizon is a year"); it cannot be empty.
//
// With scenarios named, the reason covers only those: a field that a
// scenario not named leaves unverified still fails the run, so a harness
// states exactly what it cannot do, and a capability it loses later is
// not excused by an old reason. Each name must be one of the suite's
// scenarios.
func AllowUnverified(reason string, scenarios ...string) Option {
	return opt(func(c *config) {
		if strings.TrimSpace(reason) == "" {
			c.bad("AllowUnverified", "empty reason: say why the harness cannot run what the unverified fields rest on")
		}
		c.unverified, c.unverifiedFor = reason, append([]string(nil), scenarios...)
	})
}

// ReportOnly makes [Run], [RunJournal], [RunSource] or [RunPlan] only
// report: a failed check, and a field that cannot be verified, do not fail
// the test; the returned [Report] (Evaluated set) says what the suite
// found, and the log shows each failing scenario's verdict. The suite's
// own tests use it to prove that counterexamples are caught; an adapter's
// test leaves it out. A harness that cannot be built, and an invalid
// option, still fail the test.
func ReportOnly() Option { return opt(func(c *config) { c.reportOnly = true }) }

// Only runs just the named scenarios; the others are reported as not run
// ("not selected (Only)"). Only never turns a field that cannot be
// verified into a pass: a field whose scenarios it leaves out is not
// verified, and the Run functions fail unless [AllowUnverified] says why.
// Every name must be one of the suite's scenarios ([Scenarios],
// [JournalScenarios], [SourceScenarios], [PlanScenarios]); an unknown
// name fails the run before any scenario starts.
func Only(names ...string) Option {
	return opt(func(c *config) {
		if len(names) == 0 {
			c.bad("Only", "no scenario named: leave Only out to run every scenario")
		}
		c.only = append([]string(nil), names...)
	})
}

// configure returns the defaults with opts applied, nil ones ignored, for
// the suite function op; apply is the scope's method (EffectOption.effectOption).
// The options' own checks are in the result's err ([config.check] adds
// the suite's).
func configure[O any](op string, opts []O, apply func(O, *config)) config {
	c := defaults()
	c.op = op
	for _, o := range opts {
		if any(o) != nil {
			apply(o, &c)
		}
	}
	return c
}

// check returns the first bad option's error, or the error of a scenario
// named in Only or AllowUnverified that is not one of table's.
func (c *config) check(suite string, table []scenarioRecord) error {
	if c.err != nil {
		return c.err
	}
	var scenarios []string
	for _, r := range table {
		scenarios = append(scenarios, r.Name)
	}
	for _, n := range c.only {
		if !slices.Contains(scenarios, n) {
			return effects.ConfigErrorf(c.op, "Only", "unknown scenario %q for the %s suite (its scenarios: %s)", n, suite, strings.Join(scenarios, ", "))
		}
	}
	for _, n := range c.unverifiedFor {
		if !slices.Contains(scenarios, n) {
			return effects.ConfigErrorf(c.op, "AllowUnverified", "unknown scenario %q for the %s suite (its scenarios: %s)", n, suite, strings.Join(scenarios, ", "))
		}
	}
	return nil
}

// selected reports whether scenario name runs.
func (c *config) selected(name string) bool {
	return c.only == nil || slices.Contains(c.only, name)
}
