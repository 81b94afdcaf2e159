package conformance

import (
	"errors"
	"strings"
	"testing"
	"time"

	"effectively.dev/effects"
)

func TestOptionsConvention(t *testing.T) {
	all := records(effectTable[struct{}]())
	cfg, err := newConfig("conformance.Run", suiteEffect, all, []Option{nil, WithConcurrency(4), nil})
	if err != nil {
		t.Fatalf("nil options must be ignored: %v", err)
	}
	if cfg.concurrency != 4 || cfg.stormKeys != DefaultStormKeys || cfg.applyTimeout != DefaultApplyTimeout {
		t.Errorf("config %+v: option or defaults lost", cfg)
	}
	bad := []struct {
		suite  string
		opts   []Option
		option string
		reason string
	}{
		{suiteEffect, []Option{Only("redelivery", "redelivry")}, "Only", `unknown scenario "redelivry"`},
		{suiteEffect, []Option{Only()}, "Only", "no scenario named"},
		{suiteJournal, []Option{Only(ScenarioStorm)}, "Only", `unknown scenario "replay-storm" for the journal suite`},
		{suiteJournal, []Option{WithStorm(100, 0.5)}, "WithStorm", "does not apply to the journal suite"},
		{suiteEffect, []Option{WithConcurrency(1)}, "WithConcurrency", "at least 2"},
		{suiteEffect, []Option{WithStorm(100, 1)}, "WithStorm", "must be in (0, 1)"},
		{suiteEffect, []Option{WithApplyTimeout(0)}, "WithApplyTimeout", "must be positive"},
		{suiteJournal, []Option{WithLease(time.Millisecond)}, "WithLease", "at least 10ms"},
		{suiteSource, []Option{WithSourceMessages(2)}, "WithSourceMessages", "at least 4"},
		{suiteEffect, []Option{AllowUnverified(" ")}, "AllowUnverified", "empty reason"},
		{suiteJournal, []Option{WithSlowReply(time.Second)}, "WithSlowReply", "does not apply to the journal suite"},
		{suitePlan, []Option{WithCapacity(100)}, "WithCapacity", "does not apply to the plan suite"},
		{suiteEffect, []Option{WithCapacity(0)}, "WithCapacity", "at least 1"},
		{suiteSource, []Option{WithCapacity(100)}, "WithCapacity", "does not apply to the source suite"},
	}
	for _, b := range bad {
		scenarios := map[string][]Scenario{suiteEffect: all, suiteJournal: records(journalTable()), suiteSource: records(sourceTable()),
			suitePlan: records(planTable[struct{}]())}[b.suite]
		_, err := newConfig("conformance.Run", b.suite, scenarios, b.opts)
		var ce *effects.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, effects.ErrInvalidConfig) {
			t.Errorf("%s: got %v, want a *effects.ConfigError", b.option, err)
			continue
		}
		if ce.Option != b.option || !strings.Contains(ce.Reason, b.reason) {
			t.Errorf("got %q, want option %s and a reason with %q", err, b.option, b.reason)
		}
	}
}

// TestEverySuiteTakesAllowUnverified: every suite is strict, so every
// suite takes the option that says why a field cannot be verified.
func TestEverySuiteTakesAllowUnverified(t *testing.T) {
	for suite, table := range map[string][]Scenario{suiteEffect: records(effectTable[struct{}]()), suiteJournal: records(journalTable()),
		suiteSource: records(sourceTable()), suitePlan: records(planTable[struct{}]())} {
		if _, err := newConfig("conformance.Run", suite, table, []Option{AllowUnverified("a reason")}); err != nil {
			t.Errorf("%s suite: %v", suite, err)
		}
	}
}
