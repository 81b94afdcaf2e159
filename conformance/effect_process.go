package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
)

// envSuccessor names the file that carries a successor request to a child
// process; its presence makes the test binary a successor.
const envSuccessor = "CONFORMANCE_SUCCESSOR"

// successorRequest is what the test process asks of a successor child.
type successorRequest struct {
	Adapter    string
	Attachment string
	Key        string
	Result     string // file the child writes its successorResult to
}

// successorResult is what the child's Apply returned.
type successorResult struct {
	Status    string // "applied", "replayed", or "" after an error
	Ref       string
	Err       string
	Retryable bool
	Permanent bool
	Setup     string // why the child could not apply at all
}

// childRequest returns the successor request this process was started
// for, or nil in an ordinary test process.
func childRequest() *successorRequest {
	path := os.Getenv(envSuccessor)
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return &successorRequest{Result: path + ".result", Adapter: "\x00unreadable: " + err.Error()}
	}
	var req successorRequest
	if err := json.Unmarshal(b, &req); err != nil {
		return &successorRequest{Result: path + ".result", Adapter: "\x00unreadable: " + err.Error()}
	}
	return &req
}

// runChild is [Run] in a successor child: for the adapter the request
// names, it attaches to the test process's backend, applies the key on one
// new instance (retrying retryable errors, as a consumer would) and writes
// the outcome where the request says. Every other Run returns at once.
func runChild[In any](t *testing.T, adapter string, req *successorRequest, cfg config) Report {
	rep := Report{Suite: suiteEffect, Adapter: adapter}
	if adapter != req.Adapter && !strings.HasPrefix(req.Adapter, "\x00") {
		return rep
	}
	out := successorResult{}
	defer func() {
		b, _ := json.Marshal(out)
		if err := os.WriteFile(req.Result, b, 0o600); err != nil {
			t.Errorf("conformance: successor: writing the result: %v", err)
		}
	}()
	if strings.HasPrefix(req.Adapter, "\x00") {
		out.Setup = "reading the request: " + req.Adapter[1:]
		return rep
	}
	attach, ok := cfg.successor.(func(context.Context, string) (Harness[In], error))
	if !ok {
		out.Setup = "WithSuccessorProcess is missing from Run's options in the child, or its input type differs"
		return rep
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.retryFor+cfg.applyTimeout)
	defer cancel()
	h, err := attach(ctx, req.Attachment)
	if err != nil {
		out.Setup = fmt.Sprintf("attach(%q): %v", req.Attachment, err)
		return rep
	}
	eff, closeFn, err := h.Make(ctx, new(Faults))
	if err != nil {
		out.Setup = fmt.Sprintf("harness Make: %v", err)
		return rep
	}
	if closeFn != nil {
		defer closeFn()
	}
	key := effects.Key(req.Key)
	b := retry.Backoff{Min: 5 * time.Millisecond, Max: 250 * time.Millisecond}
	for attempt := 1; ; attempt++ {
		actx, stop := context.WithTimeout(ctx, cfg.applyTimeout)
		res, err := eff.Apply(actx, key, h.Input(key, 0))
		stop()
		if err == nil {
			out.Status, out.Ref = res.Status.String(), res.Ref
			return rep
		}
		out.Err, out.Retryable, out.Permanent = err.Error(), effects.ClassOf(err) == effects.Retryable, effects.ClassOf(err) == effects.Permanent
		if !out.Retryable || retry.Sleep(ctx, b.Delay(attempt)) != nil {
			return rep
		}
	}
}

// successorProcess applies a key in this process and redelivers it in a
// child process; then loses the reply of a key's last round trip and
// retries it in a child process. The child shares no memory with this
// process: only the backend can tell it the key was done.
func (s *scene[In]) successorProcess() {
	if _, ok := s.cfg.successor.(func(context.Context, string) (Harness[In], error)); !ok {
		s.fatalf("WithSuccessorProcess's attach function takes another input type than this Run (%T)", s.cfg.successor)
	}
	att := s.h.(Attacher).Attachment()

	inst := s.open(new(Faults))
	key := s.key("process")
	first := s.applyFirst(inst, key, "first Apply")
	trips := inst.f.RoundTrips() - inst.base
	inst.Close()
	what := "redelivery in a successor process"
	s.checkChild(first, s.child(att, key, what), what)
	s.expect(key, cleanRepeat, true, "after a "+what)

	if trips == 0 {
		s.notef("no round trip through the Faults: the lost reply before a successor process was not run")
		return
	}
	f := new(Faults)
	inst = s.open(f)
	lost := s.key("process-lost")
	res, fired, err := s.applyFaulted(inst, f, DropReply, trips, lost, s.h.Input(lost, 0), "Apply whose last reply is lost")
	inst.Close()
	if !fired {
		s.notef("the lost reply at round trip %d did not fire", trips)
	}
	if err != nil {
		s.quiet()
	}
	what = "retry in a successor process after a lost reply"
	got := s.child(att, lost, what)
	if err == nil {
		s.checkChild(res, got, what)
	} else {
		s.check(got.Err == "", "%s failed: %s", what, got.Err)
	}
	s.expect(lost, unknownOutcome, true, "after a "+what)
}

// checkChild asserts that a child's redelivery replayed first.
func (s *scene[In]) checkChild(first effects.Result, got successorResult, what string) {
	if !s.check(got.Err == "", "%s of a key done before failed: %s", what, got.Err) {
		return
	}
	s.checkReplay(first, effects.Result{Status: statusOf(got.Status), Ref: got.Ref}, what)
}

func statusOf(s string) effects.Status {
	if s == effects.Replayed.String() {
		return effects.Replayed
	}
	return effects.Applied
}

// child runs the test binary again for the test that called Run, as a
// successor process that applies key, and returns what its Apply
// returned.
func (s *scene[In]) child(attachment string, key effects.Key, what string) successorResult {
	dir := s.t.TempDir()
	req := successorRequest{Adapter: s.adapter(), Attachment: attachment, Key: string(key), Result: filepath.Join(dir, "result.json")}
	b, err := json.Marshal(req)
	if err != nil {
		s.fatalf("%s: %v", what, err)
	}
	reqPath := filepath.Join(dir, "request.json")
	if err := os.WriteFile(reqPath, b, 0o600); err != nil {
		s.fatalf("%s: %v", what, err)
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.retryFor+2*s.cfg.applyTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+runPattern(parentTest(s.t.Name())), "-test.count=1")
	cmd.Env = append(os.Environ(), envSuccessor+"="+reqPath)
	output, runErr := cmd.CombinedOutput()
	rb, err := os.ReadFile(req.Result)
	if err != nil {
		s.fatalf("%s: the child process (%s) wrote no result (exit: %v): %v\n%s", what, os.Args[0], runErr, err, tail(output, 2000))
	}
	var got successorResult
	if err := json.Unmarshal(rb, &got); err != nil {
		s.fatalf("%s: the child's result: %v", what, err)
	}
	if got.Setup != "" {
		s.fatalf("%s: the child process could not apply: %s", what, got.Setup)
	}
	return got
}

// adapter is the adapter name Run was given.
func (s *scene[In]) adapter() string { return s.checker.subject }

// parentTest is the name of the test that called Run: the scenario
// subtest's parent.
func parentTest(name string) string {
	if i := strings.LastIndex(name, "/"); i >= 0 {
		return name[:i]
	}
	return name
}

// runPattern is the -test.run pattern that selects exactly the test named
// name (each element anchored).
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
