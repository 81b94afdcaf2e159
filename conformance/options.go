package conformance

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"effectively.dev/effects"
)

// Defaults of the suite's options.
const (
	// DefaultConcurrency is how many goroutines apply one key at once in the
	// concurrency scenarios ([WithConcurrency]).
	DefaultConcurrency = 16
	// DefaultStormKeys and DefaultStormSeen size the replay storm: keys in
	// all, and the fraction applied before the storm ([WithStorm]).
	DefaultStormKeys = 1000
	DefaultStormSeen = 0.99
	// DefaultMaxSweep bounds how many round trips of one Apply the fault
	// sweeps visit ([WithMaxSweep]).
	DefaultMaxSweep = 64
	// DefaultTimeout bounds one scenario ([WithTimeout]).
	DefaultTimeout = 3 * time.Minute
	// DefaultRetryFor bounds how long the suite retries a key whose Apply
	// failed with a retryable error ([WithRetryFor]).
	DefaultRetryFor = 30 * time.Second
	// DefaultApplyTimeout bounds one call of Apply, Begin, Next or Ack; a
	// call that takes longer is reported as a hang ([WithApplyTimeout]).
	DefaultApplyTimeout = 30 * time.Second
	// DefaultLateRedelivery is how long the late-redelivery scenario waits,
	// on the wall clock, before it redelivers ([WithLateRedelivery]).
	DefaultLateRedelivery = 5 * time.Second
	// DefaultLongAge is how far the horizon scenario ages the backend for a
	// contract whose Horizon is 0, "kept until pruned" ([WithLongAge]).
	DefaultLongAge = 400 * 24 * time.Hour
	// DefaultLease is the lease the journal suite asks for when it waits
	// for leases to expire ([WithLease]).
	DefaultLease = 500 * time.Millisecond
	// DefaultRedeliveryWait bounds how long the source suite waits for a
	// delivery to come back after a close, a crash or a rebalance
	// ([WithRedeliveryWait]).
	DefaultRedeliveryWait = 60 * time.Second
	// DefaultSourceMessages is how many messages each source scenario
	// publishes ([WithSourceMessages]).
	DefaultSourceMessages = 24
	// DefaultQuietPeriod is how long the fault sweeps wait, after an Apply
	// returned ErrTransient and before its retry, to count the key's
	// effects again ([WithQuietPeriod]).
	DefaultQuietPeriod = 500 * time.Millisecond
	// DefaultCapacity is how many keys the key-capacity scenario applies
	// between a key and its redelivery ([WithCapacity]).
	DefaultCapacity = 5000
)

// Option changes how a suite runs. Options record a value; [Run],
// [RunJournal] and [RunSource] (and their Evaluate forms) validate them
// once, before any scenario, and fail the test with an
// *[effects.ConfigError] naming the first bad one. A nil Option is ignored.
// An option that does not apply to the suite it is given to (WithStorm to
// RunJournal) is refused the same way, so a mistake does not pass silently.
type Option func(*config)

type config struct {
	concurrency    int
	stormKeys      int
	stormSeen      float64
	maxSweep       int
	timeout        time.Duration
	retryFor       time.Duration
	applyTimeout   time.Duration
	lateRedelivery time.Duration
	longAge        time.Duration
	lease          time.Duration
	redeliveryWait time.Duration
	sourceMessages int
	slowReply      time.Duration
	slowReplySet   bool // WithSlowReply was given: the slow-reply scenario runs
	quietPeriod    time.Duration
	capacity       int
	only           []string
	unverified     string   // AllowUnverified's reason
	unverifiedFor  []string // the scenarios it covers; nil: every one
	successor      any      // WithSuccessorProcess's attach function
	gen            genConfig

	set []string // names of the options given, to refuse those a suite does not take
}

func (c *config) mark(name string) {
	if !slices.Contains(c.set, name) {
		c.set = append(c.set, name)
	}
}

func defaults() config {
	return config{
		concurrency:    DefaultConcurrency,
		stormKeys:      DefaultStormKeys,
		stormSeen:      DefaultStormSeen,
		maxSweep:       DefaultMaxSweep,
		timeout:        DefaultTimeout,
		retryFor:       DefaultRetryFor,
		applyTimeout:   DefaultApplyTimeout,
		lateRedelivery: DefaultLateRedelivery,
		longAge:        DefaultLongAge,
		lease:          DefaultLease,
		redeliveryWait: DefaultRedeliveryWait,
		sourceMessages: DefaultSourceMessages,
		slowReply:      DefaultSlowReply,
		quietPeriod:    DefaultQuietPeriod,
		capacity:       DefaultCapacity,
	}
}

// WithConcurrency sets how many goroutines apply one key at once in the
// concurrent-duplicates and concurrent-key-reuse scenarios, and begin one
// key at once in the journal suite (default [DefaultConcurrency]; at least
// 2, and fewer than 16 is noted in the report as a reduced scenario).
func WithConcurrency(n int) Option {
	return func(c *config) { c.concurrency = n; c.mark("WithConcurrency") }
}

// WithStorm sets the replay storm's size: keys in all, and the fraction of
// them applied before the storm (defaults [DefaultStormKeys] and
// [DefaultStormSeen]). keys must be at least 10 and seen in (0, 1), leaving
// at least one key new and one seen.
func WithStorm(keys int, seen float64) Option {
	return func(c *config) { c.stormKeys, c.stormSeen = keys, seen; c.mark("WithStorm") }
}

// WithMaxSweep bounds how many round trips of one Apply the fault sweeps
// visit (default [DefaultMaxSweep]); an Apply with more round trips is
// swept up to this bound and the report says so.
func WithMaxSweep(n int) Option {
	return func(c *config) { c.maxSweep = n; c.mark("WithMaxSweep") }
}

// WithRetryFor bounds how long the suite keeps retrying a key whose Apply
// failed with a retryable error (default [DefaultRetryFor]). Adapters with
// leases (a Journal) need it longer than their lease.
func WithRetryFor(d time.Duration) Option {
	return func(c *config) { c.retryFor = d; c.mark("WithRetryFor") }
}

// WithTimeout bounds each scenario (default [DefaultTimeout]).
func WithTimeout(d time.Duration) Option {
	return func(c *config) { c.timeout = d; c.mark("WithTimeout") }
}

// WithApplyTimeout bounds each single call the suite makes into the code
// under test: an Apply, a journal's Begin/Complete/Release, a source's Ack
// (default [DefaultApplyTimeout]). A call still running then is reported
// as a hang, naming the call and the round trip it was on; its context is
// cancelled and its connections cut so the scenario can go on. A source's
// Next is bounded by [WithRedeliveryWait] instead.
func WithApplyTimeout(d time.Duration) Option {
	return func(c *config) { c.applyTimeout = d; c.mark("WithApplyTimeout") }
}

// WithLateRedelivery sets how long the late-redelivery scenario waits on
// the wall clock between an Apply and its redelivery (default
// [DefaultLateRedelivery]).
func WithLateRedelivery(d time.Duration) Option {
	return func(c *config) { c.lateRedelivery = d; c.mark("WithLateRedelivery") }
}

// WithLongAge sets how far the horizon scenario ages the backend for a
// contract that keeps keys until pruned (Horizon 0) before it redelivers
// (default [DefaultLongAge], 400 days).
func WithLongAge(d time.Duration) Option {
	return func(c *config) { c.longAge = d; c.mark("WithLongAge") }
}

// WithLease sets the lease the journal suite takes when it needs one to
// expire (default [DefaultLease]); the suite waits a little longer than it.
func WithLease(d time.Duration) Option {
	return func(c *config) { c.lease = d; c.mark("WithLease") }
}

// WithRedeliveryWait bounds how long the source suite waits for deliveries
// to come back after a close, a crash or a rebalance (default
// [DefaultRedeliveryWait]). A source that redelivers only after a lock or
// session expires needs it longer than that expiry.
func WithRedeliveryWait(d time.Duration) Option {
	return func(c *config) { c.redeliveryWait = d; c.mark("WithRedeliveryWait") }
}

// WithSourceMessages sets how many messages each source scenario publishes
// (default [DefaultSourceMessages], at least 4).
func WithSourceMessages(n int) Option {
	return func(c *config) { c.sourceMessages = n; c.mark("WithSourceMessages") }
}

// WithSlowReply runs the slow-reply scenario, which holds each reply of
// an Apply in turn for d (see [SlowReply]); without it the scenario does
// not run, and the guarantee it verifies is not verified (so [Run] fails
// unless [AllowUnverified] says why). Make d longer than the adapter's own
// per-call deadline, if it has one, for the scenario to hold a reply past
// it: an adapter that gives up waits no longer than its deadline, one
// that waits gets the reply d late, so the scenario takes about d for
// each faulted Apply.
func WithSlowReply(d time.Duration) Option {
	return func(c *config) { c.slowReply, c.slowReplySet = d, true; c.mark("WithSlowReply") }
}

// WithQuietPeriod sets how long the fault sweeps wait after an Apply
// returned ErrTransient before they count the key's effects again and
// retry it (default [DefaultQuietPeriod]): an adapter that handed the
// work to something that applies it later broke ErrTransient's promise
// just as one that applied it at once. Make it at least the adapter's
// own per-call deadline.
func WithQuietPeriod(d time.Duration) Option {
	return func(c *config) { c.quietPeriod = d; c.mark("WithQuietPeriod") }
}

// WithSuccessorProcess lets the successor-process scenario run: the suite
// redelivers keys in a child process (the test binary, run again for just
// the test that called [Run]), which shares no memory with the instances
// of the test process, so a dedup whose authority is process memory (a
// package-level cache, a per-process session id) is caught. The harness
// must implement [Attacher]; in the child, Run calls attach with the
// harness's Attachment instead of the [Maker], makes one instance, applies
// the key and returns without running any scenario. attach must not start
// a backend: it connects to the one the attachment names. attach's In must
// be Run's.
func WithSuccessorProcess[In any](attach func(ctx context.Context, attachment string) (Harness[In], error)) Option {
	return func(c *config) {
		if attach != nil {
			c.successor = attach
		}
		c.mark("WithSuccessorProcess")
	}
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
	return func(c *config) {
		c.unverified, c.unverifiedFor = reason, append([]string(nil), scenarios...)
		c.mark("AllowUnverified")
	}
}

// Only runs just the named scenarios; the others are reported as not run
// ("not selected (Only)"). Only never turns a field that cannot be
// verified into a pass: a field whose scenarios it leaves out is not
// verified, and the Run functions fail unless [AllowUnverified] says why.
// Every name must be one of the suite's scenarios ([Scenarios],
// [JournalScenarios], [SourceScenarios], [PlanScenarios]); an unknown
// name fails the run before any scenario starts.
func Only(names ...string) Option {
	return func(c *config) { c.only = append([]string(nil), names...); c.mark("Only") }
}

// applied returns the defaults with opts applied, nil ones ignored, not
// validated (newConfig validates).
func applied(opts []Option) config {
	c := defaults()
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// newConfig applies opts to the defaults and validates the result for the
// suite op ("conformance.Run") running the scenarios of table, once. The
// options a suite takes are derived from its records ([optionsOf]).
func newConfig(op, suite string, table []Scenario, opts []Option) (config, error) {
	c := applied(opts)
	takes := optionsOf(suite, table)
	var scenarios []string
	for _, r := range table {
		scenarios = append(scenarios, r.Name)
	}
	bad := func(option, format string, args ...any) (config, error) {
		return config{}, &effects.ConfigError{Op: op, Option: option, Reason: fmt.Sprintf(format, args...)}
	}
	for _, name := range c.set {
		if !slices.Contains(takes, name) {
			return bad(name, "does not apply to the %s suite (its options: %s)", suite, strings.Join(takes, ", "))
		}
	}
	switch {
	case c.concurrency < 2:
		return bad("WithConcurrency", "%d: at least 2 attempts are needed to race", c.concurrency)
	case c.stormKeys < 10:
		return bad("WithStorm", "%d keys: at least 10", c.stormKeys)
	case !(c.stormSeen > 0 && c.stormSeen < 1):
		return bad("WithStorm", "seen fraction %v: must be in (0, 1)", c.stormSeen)
	case int(float64(c.stormKeys)*c.stormSeen) < 1 || int(float64(c.stormKeys)*c.stormSeen) >= c.stormKeys:
		return bad("WithStorm", "%d keys with %v seen leaves no seen or no new key", c.stormKeys, c.stormSeen)
	case c.maxSweep < 1:
		return bad("WithMaxSweep", "%d: at least 1", c.maxSweep)
	case c.timeout <= 0:
		return bad("WithTimeout", "%v: must be positive", c.timeout)
	case c.retryFor < 0:
		return bad("WithRetryFor", "%v: must not be negative", c.retryFor)
	case c.applyTimeout <= 0:
		return bad("WithApplyTimeout", "%v: must be positive", c.applyTimeout)
	case c.lateRedelivery <= 0:
		return bad("WithLateRedelivery", "%v: must be positive", c.lateRedelivery)
	case c.longAge <= 0:
		return bad("WithLongAge", "%v: must be positive", c.longAge)
	case c.lease < 10*time.Millisecond:
		return bad("WithLease", "%v: at least 10ms, or the suite cannot hold a lease while it checks it", c.lease)
	case c.redeliveryWait <= 0:
		return bad("WithRedeliveryWait", "%v: must be positive", c.redeliveryWait)
	case c.sourceMessages < 4:
		return bad("WithSourceMessages", "%d: at least 4", c.sourceMessages)
	case c.slowReply <= 0:
		return bad("WithSlowReply", "%v: must be positive", c.slowReply)
	case c.quietPeriod < 0:
		return bad("WithQuietPeriod", "%v: must not be negative", c.quietPeriod)
	case c.capacity < 1:
		return bad("WithCapacity", "%d: at least 1", c.capacity)
	case slices.Contains(c.set, "WithSchedules") && c.gen.schedules < 1:
		return bad("WithSchedules", "%d: at least 1", c.gen.schedules)
	case slices.Contains(c.set, "WithSlowBackend") && c.gen.slowBackend <= 0:
		return bad("WithSlowBackend", "%v: must be positive", c.gen.slowBackend)
	case slices.Contains(c.set, "WithSuccessorProcess") && c.successor == nil:
		return bad("WithSuccessorProcess", "nil attach function")
	case slices.Contains(c.set, "AllowUnverified") && strings.TrimSpace(c.unverified) == "":
		return bad("AllowUnverified", "empty reason: say why the harness cannot run what the unverified fields rest on")
	}
	if slices.Contains(c.set, "Only") && len(c.only) == 0 {
		return bad("Only", "no scenario named: leave Only out to run every scenario")
	}
	for _, n := range c.only {
		if !slices.Contains(scenarios, n) {
			return bad("Only", "unknown scenario %q for the %s suite (its scenarios: %s)", n, suite, strings.Join(scenarios, ", "))
		}
	}
	for _, n := range c.unverifiedFor {
		if !slices.Contains(scenarios, n) {
			return bad("AllowUnverified", "unknown scenario %q for the %s suite (its scenarios: %s)", n, suite, strings.Join(scenarios, ", "))
		}
	}
	return c, nil
}

// selected reports whether scenario name runs.
func (c *config) selected(name string) bool {
	return c.only == nil || slices.Contains(c.only, name)
}
