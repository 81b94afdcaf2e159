package torture_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"effectively.dev/internal/torture"
)

// The worker binary, built once per test binary.
var build struct {
	once      sync.Once
	dir, path string
	err       error
}

// workerBinary builds internal/cmd/chargehook-worker into a temporary directory
// (with the race detector when this test binary has it) and returns its
// path. TestMain removes it.
func workerBinary(t *testing.T) string {
	t.Helper()
	build.once.Do(func() {
		start := time.Now()
		gobin, err := exec.LookPath("go")
		if err != nil && os.Getenv("GOROOT") != "" {
			gobin, err = filepath.Join(os.Getenv("GOROOT"), "bin", "go"), nil
		}
		if err != nil {
			build.err = fmt.Errorf("the go command is needed to build the worker: %w", err)
			return
		}
		defer func() {
			if build.err == nil {
				t.Logf("built %s (race detector %t) in %v", build.path, raceEnabled, time.Since(start).Round(time.Millisecond))
			}
		}()
		if build.dir, build.err = os.MkdirTemp("", "torture-worker-"); build.err != nil {
			return
		}
		build.path = filepath.Join(build.dir, "chargehook-worker")
		args := []string{"build", "-o", build.path}
		if raceEnabled {
			args = append(args, "-race")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, gobin, append(args, "effectively.dev/internal/cmd/chargehook-worker")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go %s: %w\n%s", strings.Join(cmd.Args[1:], " "), err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.path
}

func removeWorkerBinary() {
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
}

// workerProc is one worker process.
type workerProc struct {
	cmd    *exec.Cmd
	stderr *lockedBuffer
	exited chan struct{} // closed once the process was reaped and its output read
	err    error         // Wait's error; read after exited is closed
}

// startWorker starts the worker with args, its stdout going to tl. The
// process is killed when t ends if it still runs.
func startWorker(t *testing.T, bin string, args []string, tl *traceLog) *workerProc {
	t.Helper()
	w := &workerProc{cmd: exec.Command(bin, args...), stderr: &lockedBuffer{}, exited: make(chan struct{})}
	w.cmd.Stdout = tl
	w.cmd.Stderr = w.stderr
	if err := w.cmd.Start(); err != nil {
		t.Fatalf("starting the worker: %v", err)
	}
	tl.startIncarnation()
	go func() {
		w.err = w.cmd.Wait()
		tl.addStderr(w.stderr.String())
		close(w.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-w.exited:
		default:
			w.kill()
		}
	})
	return w
}

// kill sends SIGKILL and waits until the process is reaped and everything
// it wrote was read.
func (w *workerProc) kill() {
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	<-w.exited
}

// terminate sends SIGTERM and waits for a clean exit, killing the process
// after timeout.
func (w *workerProc) terminate(timeout time.Duration) error {
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.exited:
		return w.err
	case <-time.After(timeout):
		w.kill()
		return fmt.Errorf("no exit %v after SIGTERM; killed", timeout)
	}
}

// stderrTail is the end of what the worker wrote to stderr.
func (w *workerProc) stderrTail() string {
	s := w.stderr.String()
	if len(s) > 4000 {
		s = "..." + s[len(s)-4000:]
	}
	return s
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// traceLog reads the workers' -trace lines (see internal/cmd/chargehook-worker):
// totals over every worker, and the state of each delivery of the current
// one, to say where the deliveries in flight were when it was killed.
type traceLog struct {
	ackFirst bool

	mu      sync.Mutex
	partial []byte
	// The current worker.
	current   map[string]*inFlight // by event id
	began     chan struct{}        // closed at its first "begin"
	isBegun   bool
	isStopped bool
	startedAt time.Time
	// Totals.
	toReady    time.Duration // from starts to "ready", summed
	attempts   int           // handler attempts ("begin" lines)
	deliveries int           // first attempts: deliveries
	absorbed   int           // deliveries whose first attempt replayed the ledger step
	steps      map[string]map[string]int
	retries    map[string]int
	errs       []string // stderr of every worker
}

// inFlight is where one delivery is: stage "ledger" (handler started, the
// ledger step not done), "output" (ledger done, output step not done),
// "ack" (plan done, not acked), "retrying" (a step failed; waiting for
// the next attempt); acked once Ack returned.
type inFlight struct {
	stage   string
	attempt int
	acked   bool
}

func newTraceLog(ackFirst bool) *traceLog {
	return &traceLog{ackFirst: ackFirst, steps: map[string]map[string]int{}, retries: map[string]int{}}
}

func (l *traceLog) startIncarnation() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.current, l.began, l.isBegun, l.isStopped = map[string]*inFlight{}, make(chan struct{}), false, false
	l.startedAt = time.Now()
}

// begun is closed when the current worker began its first delivery.
func (l *traceLog) begun() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.began
}

func (l *traceLog) stopped() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.isStopped
}

// endIncarnation returns the deliveries the current worker left unfinished:
// not acked, or (with -ack-first) acked with the plan not done.
func (l *traceLog) endIncarnation() []inFlight {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []inFlight
	for _, d := range l.current {
		if !d.acked || (l.ackFirst && d.stage != "ack") {
			out = append(out, *d)
		}
	}
	l.current = map[string]*inFlight{}
	return out
}

func (l *traceLog) addStderr(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, s)
}

func (l *traceLog) stderrs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errs...)
}

// traceTotals is what the workers' traces add up to.
type traceTotals struct {
	attempts, deliveries, absorbed int
	toReady                        time.Duration // summed over the workers
	steps                          map[string]map[string]int
	retries                        map[string]int
}

func (l *traceLog) totals() traceTotals {
	l.mu.Lock()
	defer l.mu.Unlock()
	return traceTotals{attempts: l.attempts, deliveries: l.deliveries, absorbed: l.absorbed, toReady: l.toReady, steps: l.steps, retries: l.retries}
}

// Write takes the worker's stdout.
func (l *traceLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.lineLocked(string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
	return len(p), nil
}

func (l *traceLog) lineLocked(line string) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return
	}
	d := func() *inFlight {
		if len(f) < 2 {
			return &inFlight{}
		}
		x := l.current[f[1]]
		if x == nil {
			x = &inFlight{stage: "ledger"}
			l.current[f[1]] = x
		}
		return x
	}
	switch f[0] {
	case "ready":
		l.toReady += time.Since(l.startedAt)
	case "begin":
		l.attempts++
		attempt := 1
		if len(f) > 2 {
			attempt, _ = strconv.Atoi(f[2])
		}
		if attempt == 1 {
			l.deliveries++
		}
		if len(f) > 1 {
			l.current[f[1]] = &inFlight{stage: "ledger", attempt: attempt}
		}
		if !l.isBegun {
			l.isBegun = true
			close(l.began)
		}
	case "step":
		if len(f) < 4 {
			return
		}
		step, kind := f[2], f[3]
		if l.steps[step] == nil {
			l.steps[step] = map[string]int{}
		}
		l.steps[step][kind]++
		x := d()
		if step == torture.StepLedger && kind == "replayed" && x.attempt == 1 {
			l.absorbed++
		}
		switch {
		case kind != "applied" && kind != "replayed":
			x.stage = "retrying"
		case step == torture.StepLedger:
			x.stage = "output"
		default:
			x.stage = "ack"
		}
	case "acked":
		d().acked = true
	case "retry":
		if len(f) > 2 {
			cause, _, _ := strings.Cut(f[2], ":")
			l.retries[cause]++
		}
	case "stopped":
		l.isStopped = true
	}
}

// errNotDrained is returned by waitDrained on a timeout.
var errNotDrained = errors.New("the worker did not commit every input offset")
