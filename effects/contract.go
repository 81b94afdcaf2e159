package effects

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Guarantee is how many times a side effect becomes visible per key.
type Guarantee int

const (
	// AtLeastOnce (best effort): every successful Apply is visible at least
	// once, and duplicates appear only inside the contract's
	// [Contract.DuplicateWindow]. It is the zero value, so a Contract that
	// forgets to say claims the weaker guarantee.
	AtLeastOnce Guarantee = iota
	// EffectivelyOnce: however often Apply runs with a key, concurrently or
	// after faults, the effect is visible exactly once (within the
	// contract's Horizon).
	EffectivelyOnce
)

// String returns "effectively-once" or "at-least-once".
func (g Guarantee) String() string {
	switch g {
	case EffectivelyOnce:
		return "effectively-once"
	case AtLeastOnce:
		return "at-least-once"
	}
	return fmt.Sprintf("Guarantee(%d)", int(g))
}

// Trigger says what opens an at-least-once effect's duplicate window.
type Trigger int

const (
	// NoDuplicates: no window; the only valid trigger for EffectivelyOnce.
	NoDuplicates Trigger = iota
	// AfterUnknownOutcome: a duplicate appears only when an earlier attempt
	// with the key ended without the adapter learning its outcome (a lost
	// reply, a connection cut, a crash, a cancelled context) and the key was
	// retried. Clean redeliveries and concurrent duplicates are absorbed.
	AfterUnknownOutcome
	// AnyRedelivery: every repeated Apply with a key may duplicate; nothing
	// records that the effect happened. The honest declaration for an effect
	// with no dedup record at all.
	AnyRedelivery
)

// String names the trigger.
func (t Trigger) String() string {
	switch t {
	case NoDuplicates:
		return "none"
	case AfterUnknownOutcome:
		return "after an unknown outcome"
	case AnyRedelivery:
		return "any redelivery"
	}
	return fmt.Sprintf("Trigger(%d)", int(t))
}

// Window is where an at-least-once effect can duplicate.
type Window struct {
	// Trigger is the machine-readable class of failure that can duplicate;
	// the conformance suite allows duplicates only in scenarios it covers.
	Trigger Trigger
	// Between names the two steps a crash must fall between, for operators:
	// "after the SMTP server's 250, before the sent-record commits".
	Between string
}

// Contract is what an adapter promises about its effect. Every adapter
// declares one, and package conformance checks the declaration under
// injected faults: a declaration the suite cannot confirm is a bug.
type Contract struct {
	// Guarantee is EffectivelyOnce or AtLeastOnce.
	Guarantee Guarantee
	// Enforcer names who holds the key and what enforces it, e.g.
	// "postgres: UNIQUE(scope, key) in the same transaction".
	Enforcer string
	// Horizon is how long the enforcer remembers a key; 0 means until the
	// application prunes it. Past the horizon a redelivery applies again, so
	// it must outlive broker retention plus the longest replay.
	Horizon time.Duration
	// DuplicateWindow is where duplicates can appear. It must be zero for
	// EffectivelyOnce and set for AtLeastOnce.
	DuplicateWindow Window
	// DetectsKeyReuse reports whether Apply returns ErrKeyReused when a key
	// comes back with a different payload. If false, a reused key silently
	// replays the first payload's effect.
	DetectsKeyReuse bool
	// HorizonAssumed reports that Horizon is the application's assumption,
	// not a retention the enforcer publishes (a provider that documents
	// none): a claim that holds only if a check against the enforcer
	// itself confirms it. It is false for a Horizon of 0.
	HorizonAssumed bool
}

// Validate reports whether the contract is self-consistent: a guarantee it
// knows, an enforcer named, no duplicate window for EffectivelyOnce, and a
// described window for AtLeastOnce. Its error ("invalid contract: ...")
// lists every problem.
func (c Contract) Validate() error {
	var problems []string
	if c.Guarantee != EffectivelyOnce && c.Guarantee != AtLeastOnce {
		problems = append(problems, fmt.Sprintf("unknown guarantee %d", int(c.Guarantee)))
	}
	if c.Enforcer == "" {
		problems = append(problems, "no enforcer named")
	}
	if c.Horizon < 0 {
		problems = append(problems, "negative horizon")
	}
	if c.HorizonAssumed && c.Horizon == 0 {
		problems = append(problems, "an assumed horizon of 0 (0 means kept until pruned, which nothing assumes)")
	}
	switch c.Guarantee {
	case EffectivelyOnce:
		if c.DuplicateWindow.Trigger != NoDuplicates {
			problems = append(problems, "effectively-once with a duplicate window")
		}
	case AtLeastOnce:
		if c.DuplicateWindow.Trigger == NoDuplicates || c.DuplicateWindow.Between == "" {
			problems = append(problems, "at-least-once needs a duplicate window with a trigger and a description")
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return errors.New("invalid contract: " + strings.Join(problems, "; "))
}

// String renders the contract on one line, e.g.
// "effectively-once (postgres: UNIQUE(scope, key) in the same transaction; keys kept until pruned; detects key reuse)".
func (c Contract) String() string {
	parts := []string{c.Enforcer}
	switch {
	case c.Horizon > 0 && c.HorizonAssumed:
		parts = append(parts, "keys kept "+c.Horizon.String()+" (assumed: not published by the enforcer)")
	case c.Horizon > 0:
		parts = append(parts, "keys kept "+c.Horizon.String())
	default:
		parts = append(parts, "keys kept until pruned")
	}
	if c.Guarantee == AtLeastOnce {
		parts = append(parts, fmt.Sprintf("duplicates %s: %s", c.DuplicateWindow.Trigger, c.DuplicateWindow.Between))
	}
	if c.DetectsKeyReuse {
		parts = append(parts, "detects key reuse")
	} else {
		parts = append(parts, "does not detect key reuse")
	}
	return c.Guarantee.String() + " (" + strings.Join(parts, "; ") + ")"
}

// Weaker reports whether c promises less than d: at-least-once is weaker
// than effectively-once; between two at-least-once contracts the wider
// trigger is weaker; between two effectively-once contracts the shorter
// non-zero horizon is weaker; a contract that does not detect key reuse is
// weaker than one that does, all else equal.
func (c Contract) Weaker(d Contract) bool {
	if c.Guarantee != d.Guarantee {
		return c.Guarantee < d.Guarantee
	}
	if c.DuplicateWindow.Trigger != d.DuplicateWindow.Trigger {
		return c.DuplicateWindow.Trigger > d.DuplicateWindow.Trigger
	}
	if c.Horizon != d.Horizon {
		return c.Horizon != 0 && (d.Horizon == 0 || c.Horizon < d.Horizon)
	}
	return !c.DetectsKeyReuse && d.DetectsKeyReuse
}
