package conformance

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"effectively.dev/effects"
)

func TestOptionsConvention(t *testing.T) {
	cfg := configure("conformance.Run", []EffectOption{nil, WithStorm(100, 0.5), nil}, EffectOption.effectOption)
	if err := cfg.check(suiteEffect, records(effectTable[struct{}]())); err != nil {
		t.Fatalf("nil options must be ignored: %v", err)
	}
	if cfg.stormKeys != 100 || cfg.capacity != defaultCapacity || cfg.applyTimeout != defaultApplyTimeout {
		t.Errorf("config %+v: option or defaults lost", cfg)
	}
	tables := map[string][]Scenario{suiteEffect: records(effectTable[struct{}]()), suiteJournal: records(journalTable()),
		suiteSource: records(sourceTable()), suitePlan: records(planTable[struct{}]())}
	bad := []struct {
		suite  string
		opt    func(*config)
		option string
		reason string
	}{
		{suiteEffect, Only("redelivery", "redelivry").effectOption, "Only", `unknown scenario "redelivry"`},
		{suiteEffect, Only().effectOption, "Only", "no scenario named"},
		{suiteJournal, Only(ScenarioStorm).journalOption, "Only", `unknown scenario "replay-storm" for the journal suite`},
		{suiteJournal, AllowUnverified("why", ScenarioStorm).journalOption, "AllowUnverified", `unknown scenario "replay-storm"`},
		{suiteEffect, WithStorm(100, 1).effectOption, "WithStorm", "must be in (0, 1)"},
		{suiteEffect, WithStorm(5, 0.5).effectOption, "WithStorm", "at least 10"},
		{suiteEffect, WithApplyTimeout(0).effectOption, "WithApplyTimeout", "must be positive"},
		{suiteJournal, WithLease(time.Millisecond).journalOption, "WithLease", "at least 10ms"},
		{suiteEffect, AllowUnverified(" ").effectOption, "AllowUnverified", "empty reason"},
		{suiteEffect, WithCapacity(0).effectOption, "WithCapacity", "at least 1"},
		{suitePlan, WithMaxSweep(0).planOption, "WithMaxSweep", "at least 1"},
		{suiteEffect, WithSchedules(0).effectOption, "WithSchedules", "at least 1"},
		{suiteEffect, WithSuccessorProcess[struct{}](nil).effectOption, "WithSuccessorProcess", "nil attach"},
	}
	for _, b := range bad {
		cfg := configure("conformance.Run", []func(*config){b.opt}, func(f func(*config), c *config) { f(c) })
		err := cfg.check(b.suite, tables[b.suite])
		var ce *effects.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, effects.ErrInvalidConfig) {
			t.Errorf("%s: got %v, want a *effects.ConfigError", b.option, err)
			continue
		}
		if ce.Option != b.option || !strings.Contains(ce.Reason, b.reason) || ce.Op != "conformance.Run" {
			t.Errorf("got %q, want conformance.Run, option %s and a reason with %q", err, b.option, b.reason)
		}
	}
}

// TestOptionScopes: each option's declared type is taken by exactly the
// suites it tunes, so that giving it to another suite does not compile.
func TestOptionScopes(t *testing.T) {
	scope := map[string]reflect.Type{
		suiteEffect:  reflect.TypeFor[EffectOption](),
		suiteJournal: reflect.TypeFor[JournalOption](),
		suiteSource:  reflect.TypeFor[SourceOption](),
		suitePlan:    reflect.TypeFor[PlanOption](),
	}
	all := []string{suiteEffect, suiteJournal, suiteSource, suitePlan}
	for _, c := range []struct {
		name   string
		fn     any
		suites []string
	}{
		{"Only", Only, all},
		{"AllowUnverified", AllowUnverified, all},
		{"WithTimeout", WithTimeout, all},
		{"WithApplyTimeout", WithApplyTimeout, all},
		{"ReportOnly", ReportOnly, all},
		{"WithRetryFor", WithRetryFor, []string{suiteEffect, suitePlan}},
		{"WithMaxSweep", WithMaxSweep, []string{suiteEffect, suitePlan}},
		{"WithStorm", WithStorm, []string{suiteEffect}},
		{"WithCapacity", WithCapacity, []string{suiteEffect}},
		{"WithLateRedelivery", WithLateRedelivery, []string{suiteEffect}},
		{"WithQuietPeriod", WithQuietPeriod, []string{suiteEffect}},
		{"WithSlowReply", WithSlowReply, []string{suiteEffect}},
		{"WithSchedules", WithSchedules, []string{suiteEffect}},
		{"WithScheduleSeed", WithScheduleSeed, []string{suiteEffect}},
		{"WithSlowBackend", WithSlowBackend, []string{suiteEffect}},
		{"WithSuccessorProcess", WithSuccessorProcess[struct{}], []string{suiteEffect}},
		{"WithLease", WithLease, []string{suiteJournal}},
		{"WithRedeliveryWait", WithRedeliveryWait, []string{suiteSource}},
	} {
		out := reflect.TypeOf(c.fn).Out(0)
		for _, suite := range all {
			takes := out.Implements(scope[suite])
			if want := strings.Contains(strings.Join(c.suites, ","), suite); takes != want {
				t.Errorf("%s (%v): taken by the %s suite = %v, want %v", c.name, out, suite, takes, want)
			}
		}
	}
}

// TestEverySuiteTakesAllowUnverified: every suite is strict, so every
// suite takes the option that says why a field cannot be verified.
func TestEverySuiteTakesAllowUnverified(t *testing.T) {
	var o Option = AllowUnverified("a reason")
	for _, cfg := range []config{
		configure("conformance.Run", []EffectOption{o}, EffectOption.effectOption),
		configure("conformance.RunJournal", []JournalOption{o}, JournalOption.journalOption),
		configure("conformance.RunSource", []SourceOption{o}, SourceOption.sourceOption),
		configure("conformance.RunPlan", []PlanOption{o}, PlanOption.planOption),
	} {
		if cfg.err != nil || cfg.unverified != "a reason" {
			t.Errorf("%s: %v, reason %q", cfg.op, cfg.err, cfg.unverified)
		}
	}
}
