package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
)

// runSuite runs every selected scenario of table as a subtest of t, each
// with a fresh harness from mk, derives the report's fields from the
// records (for an effect, from the contract its scenarios learned),
// writes it where CONFORMANCE_REPORT says and returns it. Unless
// [ReportOnly] was given, every failed check fails the (sub)test it
// happened in, and a field that cannot be verified fails t unless
// [AllowUnverified] says why ([Report.Verify]).
func runSuite[H any](t *testing.T, suite, subject string, table []scenario[H], mk func(testing.TB) H, cfg config) Report {
	t.Helper()
	strict := !cfg.reportOnly
	if childRequest() != nil {
		// A successor child process runs one Apply of one effect suite
		// (runChild), never a suite.
		return Report{Suite: suite, Adapter: subject}
	}
	rep := runTable(t, suite, subject, table, mk, cfg, strict)
	recs := records(table)
	if suite == suiteEffect {
		for _, row := range rep.Rows {
			if row.contract != nil {
				rep.Contract = *row.contract
				break
			}
		}
		rep.Fields = effectFields(rep.Contract, recs, rep.Rows)
	} else {
		rep.Fields = suiteFieldsOf(suite, recs, rep.Rows)
	}
	allow(&rep)
	if err := rep.Verify(); err != nil && strict {
		t.Errorf("%v", err)
	}
	if err := rep.writeEnv(); err != nil {
		t.Errorf("conformance: writing report: %v", err)
	}
	if testing.Verbose() {
		t.Logf("conformance matrix:\n%s", rep.Markdown())
	}
	return rep
}

func runTable[H any](t *testing.T, suite, subject string, table []scenario[H], mk func(testing.TB) H, cfg config, strict bool) Report {
	t.Helper()
	if err := cfg.check(suite, records(table)); err != nil {
		t.Fatalf("%v", err)
	}
	rep := Report{Suite: suite, Adapter: subject, Evaluated: !strict, Unverified: cfg.unverified, UnverifiedFor: cfg.unverifiedFor}
	for _, sc := range table {
		row := &Row{Scenario: sc.Name}
		if !cfg.selected(sc.Name) {
			row.Skipped = notSelectedOnly
			row.Fix = "leave it out of Only, or give AllowUnverified the reason it need not run"
			row.settle()
			rep.Rows = append(rep.Rows, *row)
			continue
		}
		started, finished := false, false
		t.Run(sc.Name, func(t *testing.T) {
			t.Helper()
			started = true
			ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
			defer cancel()
			c := &checker{t: t, ctx: ctx, row: row, strict: strict, cfg: &cfg, run: newRunID(), out: &outbox{}, subject: subject}
			defer c.flush()
			h := mk(t)
			for _, need := range sc.needs {
				if need.wrong != nil {
					if msg := need.wrong(h, &cfg); msg != "" {
						c.failf("%s", msg)
						finished = true
						return
					}
				}
				if why, fix := need.missing(h, &cfg); why != "" {
					row.Skipped, row.Fix = why, fix
					t.Logf("not run: %s", row.Skipped)
					finished = true
					return
				}
			}
			c.guard(func() {
				t.Helper()
				sc.run(c, h)
			})
			finished = true
		})
		switch {
		case !started:
			row.Skipped = notSelectedRun
		case !finished:
			// The subtest stopped early (the harness failed it with
			// t.Fatal): whatever was recorded so far is no pass.
			row.fail("the scenario did not finish: the harness or the code under test failed the test (see its log)")
		}
		row.settle()
		if row.Verdict == Fail && !strict {
			t.Logf("%s: verdict FAIL (not failing the test: ReportOnly): %s", sc.Name, strings.Join(row.Failures, "; "))
		}
		rep.Rows = append(rep.Rows, *row)
	}
	return rep
}

// Why a scenario left out by selection did not run.
const (
	notSelectedOnly = "not selected (Only)"
	notSelectedRun  = "not selected (go test -run)"
)

// notSelected reports whether a row did not run because it was not
// selected (Only, or go test -run), rather than for want of a capability.
func notSelected(r Row) bool { return strings.HasPrefix(r.Skipped, "not selected") }

// outbox holds the failures of one (sub)test, reported on it when it
// ends: from its own goroutine, after every frame of the suite called
// t.Helper, so that go test shows them at the harness's call of Run, not
// at a line of the suite.
type outbox struct {
	mu   sync.Mutex
	msgs []string
}

func (o *outbox) add(msg string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.msgs = append(o.msgs, msg)
}

// checker records one scenario's checks into its row. Failed checks fail
// the current (sub)test in strict mode, when it ends (see outbox).
type checker struct {
	t       *testing.T
	ctx     context.Context
	row     *Row
	strict  bool
	cfg     *config
	run     string  // unique to this scenario run, part of every key
	subject string  // the adapter, journal or source the suite runs against
	out     *outbox // failures to report on t
}

// flush reports the failures recorded for c's (sub)test on it.
func (c *checker) flush() {
	c.t.Helper()
	c.out.mu.Lock()
	msgs := c.out.msgs
	c.out.msgs = nil
	c.out.mu.Unlock()
	for _, m := range msgs {
		c.t.Errorf("%s", m)
	}
}

// abort stops a scenario (or a sweep's round trip) after a failure that
// makes further checks moot, or when it cannot run.
type abort struct{}

// guard runs fn, recovering an abort.
func (c *checker) guard(fn func()) {
	c.t.Helper()
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(abort); !ok {
				panic(r)
			}
		}
	}()
	fn()
}

// check records one assertion: ok, or a failure described by the format.
func (c *checker) check(ok bool, format string, args ...any) bool {
	c.row.checked()
	if !ok {
		c.failf(format, args...)
	}
	return ok
}

func (c *checker) failf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	c.row.fail(msg)
	if c.strict {
		c.out.add(c.row.Scenario + ": " + msg)
	} else {
		c.t.Logf("check failed: %s", msg)
	}
}

// fatalf records a failure and stops the scenario (or the round trip).
func (c *checker) fatalf(format string, args ...any) {
	c.failf(format, args...)
	panic(abort{})
}

func (c *checker) notef(format string, args ...any) {
	c.row.note(fmt.Sprintf(format, args...))
}

// skip marks the scenario not run, with why, and stops it: the fields it
// verifies are not verified.
func (c *checker) skip(format string, args ...any) {
	c.row.skip(fmt.Sprintf(format, args...))
	c.t.Logf("not run: %s", c.row.Skipped)
	panic(abort{})
}

// inapplicable marks the scenario not run because it does not apply to
// the subject (what it checks is not claimed), with why, and stops it:
// the fields it verifies rest on the other scenarios.
func (c *checker) inapplicable(format string, args ...any) {
	c.row.skip("not applicable: " + fmt.Sprintf(format, args...))
	rowMu.Lock()
	c.row.NotApplicable = true
	rowMu.Unlock()
	c.t.Logf("not run: %s", c.row.Skipped)
	panic(abort{})
}

// sub runs fn as a subtest named name (so that -run isolates it), with a
// checker of its own that records into the same row and reports its
// failures on the subtest. It reports whether the subtest ran: go test
// -run may leave it out.
func (c *checker) sub(name string, fn func(c *checker)) bool {
	c.t.Helper()
	started, finished := false, false
	c.t.Run(name, func(t *testing.T) {
		t.Helper()
		started = true
		sc := *c
		sc.t, sc.out = t, &outbox{}
		defer sc.flush()
		sc.guard(func() {
			t.Helper()
			fn(&sc)
		})
		finished = true
	})
	if started && !finished {
		c.row.fail(name + ": did not finish: the harness or the code under test failed the test (see its log)")
	}
	return started
}

// hangGrace is how long a hung call gets to return once its context was
// cancelled and its connections cut.
const hangGrace = 5 * time.Second

// timed runs one call into the code under test, bounded by the apply
// timeout. A call still running then is a hang: its context is cancelled,
// the connections of f (if any) are cut, the failure names what (the call,
// and the round trip it was on, counted after the first base), and the
// scenario stops.
func timed[T any](c *checker, f *Faults, base int, what string, fn func(ctx context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	type result struct {
		v        T
		err      error
		panicked string // what the code under test panicked with, and where
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- result{panicked: fmt.Sprintf("%v\n%s", r, tail(debug.Stack(), 1500))}
			}
		}()
		v, err := fn(ctx)
		done <- result{v: v, err: err}
	}()
	timer := time.NewTimer(c.cfg.applyTimeout)
	defer timer.Stop()
	limit := fmt.Sprintf("within %v", c.cfg.applyTimeout)
	select {
	case r := <-done:
		if r.panicked != "" {
			// A panic in a goroutine of its own would end the test binary,
			// and every report with it: it is a failure of the code under
			// test like any other.
			c.fatalf("panic: %s panicked: %s", what, r.panicked)
		}
		return r.v, r.err
	case <-timer.C:
	case <-c.ctx.Done():
		limit = fmt.Sprintf("before the scenario's time limit (%v)", c.cfg.timeout)
	}
	where := ""
	if f != nil {
		where = "; " + f.describe(base)
	}
	cancel()
	if f != nil {
		f.Sever()
	}
	grace := time.NewTimer(hangGrace)
	defer grace.Stop()
	select {
	case <-done:
		c.fatalf("hang: %s did not return %s%s (it returned once its context was cancelled and its connections cut)", what, limit, where)
	case <-grace.C:
		c.fatalf("hang: %s did not return %s%s, nor %v after its context was cancelled and its connections cut", what, limit, where, hangGrace)
	}
	var zero T
	return zero, nil // not reached
}

func newRunID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
