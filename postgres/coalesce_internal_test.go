package postgres

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// blockingExec is an exec whose statements wait until released; it
// records what each statement carried and whether its context ended.
type blockingExec struct {
	mu       sync.Mutex
	batches  [][]string
	canceled []bool
	started  chan struct{}
	release  chan struct{}
}

func newBlockingExec() *blockingExec {
	return &blockingExec{started: make(chan struct{}, 100), release: make(chan struct{})}
}

func (b *blockingExec) exec(ctx context.Context, reqs []string) []string {
	b.started <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batches = append(b.batches, slices.Clone(reqs))
	b.canceled = append(b.canceled, ctx.Err() != nil)
	out := make([]string, len(reqs))
	for i, r := range reqs {
		out[i] = "did " + r
	}
	return out
}

func newTestCoalescer(b *blockingExec) *coalescer[string, string] {
	return &coalescer[string, string]{key: func(s string) string { return s }, exec: b.exec}
}

// busyCoalescer returns a coalescer whose one statement slot is taken by
// the call "first", blocked in exec until b.release; wg waits for it.
func busyCoalescer() (*blockingExec, *coalescer[string, string], *sync.WaitGroup) {
	b := newBlockingExec()
	c := newTestCoalescer(b)
	wg := new(sync.WaitGroup)
	wg.Go(func() { c.do(context.Background(), "first") })
	<-b.started
	return b, c, wg
}

func waitQueue(t *testing.T, c *coalescer[string, string], n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		l := len(c.queue)
		c.mu.Unlock()
		if l == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue holds %d, want %d", l, n)
		}
	}
}

func TestCoalescerLoneCallRunsAtOnce(t *testing.T) {
	b := newBlockingExec()
	close(b.release)
	c := newTestCoalescer(b)
	res, end := c.do(context.Background(), "a")
	if res != "did a" || end != callDone {
		t.Fatalf("do = %q, %v", res, end)
	}
	if c.inFlight != 0 {
		t.Fatal("still running after the lone call")
	}
}

func TestCoalescerBatchesWhatWaited(t *testing.T) {
	b := newBlockingExec()
	c := newTestCoalescer(b)
	var wg sync.WaitGroup
	results := make(map[string]string)
	var mu sync.Mutex
	do := func(req string) {
		wg.Go(func() {
			res, end := c.do(context.Background(), req)
			if end != callDone {
				t.Errorf("do %s ended %v", req, end)
			}
			mu.Lock()
			results[req] += res + ";"
			mu.Unlock()
		})
	}
	do("first")
	<-b.started
	for _, r := range []string{"x", "y", "x", "z"} {
		do(r)
	}
	waitQueue(t, c, 4)
	close(b.release)
	wg.Wait()
	for _, batch := range b.batches {
		slices.Sort(batch) // the callers queued in any order
	}
	want := [][]string{{"first"}, {"x", "y", "z"}, {"x"}}
	if !slices.EqualFunc(b.batches, want, slices.Equal) {
		t.Fatalf("statements %q, want %q", b.batches, want)
	}
	if results["x"] != "did x;did x;" || results["y"] != "did y;" {
		t.Fatalf("results %q", results)
	}
}

// A caller whose context ends while it waits in the queue leaves it, and
// nothing is run for it.
func TestCoalescerQueuedCallLeavesOnCancel(t *testing.T) {
	b, c, wg := busyCoalescer()
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan callEnd)
	go func() { _, end := c.do(ctx, "gone"); ended <- end }()
	waitQueue(t, c, 1)
	cancel()
	if end := <-ended; end != callNotSent {
		t.Fatalf("cancelled queued call ended %v, want callNotSent", end)
	}
	close(b.release)
	wg.Wait()
	if len(b.batches) != 1 || c.inFlight != 0 {
		t.Fatalf("statements %q, in flight %d: the cancelled call ran", b.batches, c.inFlight)
	}
}

// A caller whose context ends while its statement runs returns at once;
// the statement goes on for the callers still waiting and is cancelled
// once none is left.
func TestCoalescerInFlightCallers(t *testing.T) {
	b, c, wg := busyCoalescer()
	ctxA, cancelA := context.WithCancel(context.Background())
	ctxB, cancelB := context.WithCancel(context.Background())
	endA, endB := make(chan callEnd, 1), make(chan callEnd, 1)
	go func() { _, end := c.do(ctxA, "a"); endA <- end }()
	go func() { _, end := c.do(ctxB, "b"); endB <- end }()
	waitQueue(t, c, 2)
	b.release <- struct{}{} // "first" returns; a and b run as one statement
	<-b.started
	cancelA()
	if end := <-endA; end != callInFlight && end != callDone {
		t.Fatalf("a ended %v", end)
	}
	select {
	case end := <-endB:
		t.Fatalf("b returned (%v) while its statement ran and its context lived", end)
	case <-time.After(20 * time.Millisecond):
	}
	cancelB()
	if end := <-endB; end != callInFlight && end != callDone {
		t.Fatalf("b ended %v", end)
	}
	wg.Wait()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		b.mu.Lock()
		n := len(b.batches)
		b.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the abandoned statement was not cancelled")
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.canceled[1] {
		t.Fatal("the statement's context lived on after every caller had gone")
	}
}
