package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"effectively.dev/effects"
)

// redelivery applies one key, redelivers it three times to the same
// instance and once to a new instance (a restarted process).
func (s *scene[In]) redelivery(ctx context.Context) {
	eff, closeFn := s.make(ctx, NewFaults())
	defer closeFn()
	key := s.key("redelivery")
	in := s.h.Input(key, 0)
	first, err := s.applyUntilDone(ctx, eff, key, in)
	if err != nil {
		s.fatalf("first Apply: %v", err)
	}
	if first.Status != effects.Applied {
		s.failf("first Apply returned %s, want applied", first.Status)
	}
	s.expect(ctx, key, cleanRepeat, true, "after first apply")
	again := []effects.Effect[In]{eff, eff, eff}
	eff2, close2 := s.make(ctx, NewFaults())
	defer close2()
	again = append(again, eff2)
	for i, e := range again {
		res, err := s.applyUntilDone(ctx, e, key, in)
		if err != nil {
			s.fatalf("redelivery %d: %v", i+1, err)
		}
		s.checkReplay(first, res, fmt.Sprintf("redelivery %d", i+1))
	}
	s.expect(ctx, key, cleanRepeat, true, "after 4 redeliveries")
}

// checkReplay asserts that a repeated apply reported a replay of first.
func (s *scene[In]) checkReplay(first, res effects.Result, what string) {
	if s.contract.Guarantee != effects.EffectivelyOnce && s.contract.DuplicateWindow.Trigger == effects.AnyRedelivery {
		return // nothing records the first apply; a repeat applies again
	}
	if res.Status != effects.Replayed {
		s.failf("%s: returned %s, want replayed", what, res.Status)
	}
	if first.Ref != "" && res.Ref != first.Ref {
		s.failf("%s: ref %q, want the first apply's %q", what, res.Ref, first.Ref)
	}
}

// concurrent applies one key from cfg.concurrency goroutines at once: first
// a warm-up key (which also opens the instance's connections), then three
// more keys, so that a race window that connection set-up hid in one round
// opens in the next.
func (s *scene[In]) concurrent(ctx context.Context) {
	if s.cfg.concurrency < 16 {
		s.notef("only %d concurrent attempts (the full scenario uses 16)", s.cfg.concurrency)
	}
	f := NewFaults()
	f.SetDelay(time.Millisecond) // widen every race window a little
	eff, closeFn := s.make(ctx, f)
	defer closeFn()
	for round := range 4 {
		s.concurrentRound(ctx, eff, s.key("concurrent", fmt.Sprint(round)))
	}
}

func (s *scene[In]) concurrentRound(ctx context.Context, eff effects.Effect[In], key effects.Key) {
	in := s.h.Input(key, 0)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied int
		refs    = map[string]int{}
		errs    []string
		start   = make(chan struct{})
	)
	for i := 0; i < s.cfg.concurrency; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := s.applyUntilDone(ctx, eff, key, in)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err.Error())
				return
			}
			if res.Status == effects.Applied {
				applied++
			}
			refs[res.Ref]++
		}()
	}
	close(start)
	wg.Wait()
	what := fmt.Sprintf("%d concurrent attempts on %s", s.cfg.concurrency, key)
	if len(errs) > 0 {
		s.failf("%s: %d failed: %s", what, len(errs), errs[0])
	}
	n := s.expect(ctx, key, cleanRepeat, len(errs) < s.cfg.concurrency, what)
	if s.contract.DuplicateWindow.Trigger != effects.AnyRedelivery {
		if applied != 1 {
			s.failf("%s: %d reported applied, want exactly 1 (backend shows %d effects)", what, applied, n)
		}
		if len(refs) > 1 {
			s.failf("%s: %d different refs returned, want one", what, len(refs))
		}
	}
}

// sweep counts the round trips of a clean apply, then for each n injects
// kind at round trip n of a fresh instance, retries the key, and checks
// the backend.
func (s *scene[In]) sweep(ctx context.Context, kind FaultKind) {
	f := NewFaults()
	eff, closeFn := s.make(ctx, f)
	clean := s.key(kind.String(), "clean")
	if _, err := s.applyUntilDone(ctx, eff, clean, s.h.Input(clean, 0)); err != nil {
		closeFn()
		s.fatalf("clean apply: %v", err)
	}
	trips := f.RoundTrips()
	closeFn()
	s.expect(ctx, clean, cleanRepeat, true, "clean apply")
	if trips == 0 {
		s.row.Verdict = NotRun
		s.notef("the adapter made no round trip through the harness's Faults: wire Make's connections through f.DialContext or f.Transport")
		return
	}
	if trips > s.cfg.maxSweep {
		s.notef("clean apply takes %d round trips; swept the first %d", trips, s.cfg.maxSweep)
		trips = s.cfg.maxSweep
	}
	s.notef("%s at each of %d round trips", kind, trips)
	notFired := 0
	for n := 1; n <= trips; n++ {
		s.faultAt(ctx, kind, n, &notFired)
	}
	if notFired > 0 {
		s.notef("%d of %d armed faults did not fire (the apply took fewer round trips)", notFired, trips)
	}
}

func (s *scene[In]) faultAt(ctx context.Context, kind FaultKind, n int, notFired *int) {
	f := NewFaults()
	eff, closeFn := s.make(ctx, f)
	defer closeFn()
	key := s.key(kind.String(), fmt.Sprint(n))
	in := s.h.Input(key, 0)
	actx, cancel := context.WithCancel(ctx)
	f.Arm(n, kind, cancel)
	_, err := eff.Apply(actx, key, in)
	cancel()
	fired := f.Fired()
	f.Disarm()
	if !fired {
		*notFired++
	}
	what := fmt.Sprintf("%s at round trip %d", kind, n)
	if err != nil && !effects.Retryable(err) {
		s.failf("%s: Apply returned an error that Retryable rejects, so a consumer would give up on a key it may have applied: %v", what, err)
		return
	}
	if _, err := s.applyUntilDone(ctx, eff, key, in); err != nil {
		s.failf("%s: retrying the same key: %v", what, err)
		return
	}
	s.expect(ctx, key, unknownOutcome, true, what)
}

// keyReuse applies a key, then applies it again with another payload.
func (s *scene[In]) keyReuse(ctx context.Context) {
	eff, closeFn := s.make(ctx, NewFaults())
	defer closeFn()
	key := s.key("reuse")
	if _, err := s.applyUntilDone(ctx, eff, key, s.h.Input(key, 0)); err != nil {
		s.fatalf("first Apply: %v", err)
	}
	res, err := s.applyUntilDone(ctx, eff, key, s.h.Input(key, 1))
	switch {
	case s.contract.DetectsKeyReuse && !errors.Is(err, effects.ErrKeyReused):
		s.failf("contract detects key reuse, but the second payload got (%v, %v), want ErrKeyReused", res.Status, err)
	case errors.Is(err, effects.ErrKeyReused) && effects.Retryable(err):
		s.failf("ErrKeyReused must not be retryable")
	case err != nil && !errors.Is(err, effects.ErrKeyReused):
		s.failf("second payload: %v", err)
	case !s.contract.DetectsKeyReuse:
		s.notef("contract does not detect key reuse; second payload got %v", res.Status)
	}
	s.expect(ctx, key, cleanRepeat, true, "after key reuse")
}

// raceReuse has concurrent writers apply one key with two different
// payloads at once (half each), twice: exactly one may apply, the writers
// of the winning payload replay it, and, where the contract detects key
// reuse, the others get ErrKeyReused. The backend must hold one effect.
func (s *scene[In]) raceReuse(ctx context.Context) {
	f := NewFaults()
	f.SetDelay(time.Millisecond)
	eff, closeFn := s.make(ctx, f)
	defer closeFn()
	for round := range 2 {
		key := s.key("race-reuse", fmt.Sprint(round))
		type outcome struct {
			variant int
			res     effects.Result
			err     error
		}
		out := make([]outcome, s.cfg.concurrency)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range out {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				v := i % 2
				res, err := s.applyUntilDone(ctx, eff, key, s.h.Input(key, v))
				out[i] = outcome{v, res, err}
			}()
		}
		close(start)
		wg.Wait()
		what := fmt.Sprintf("%d concurrent writers, two payloads, on %s", len(out), key)
		winner, applied, succeeded := -1, 0, 0
		for _, o := range out {
			if o.err == nil {
				succeeded++
				if o.res.Status == effects.Applied {
					applied++
					winner = o.variant
				}
			}
		}
		s.expect(ctx, key, cleanRepeat, succeeded > 0, what)
		if s.contract.DuplicateWindow.Trigger == effects.AnyRedelivery {
			continue
		}
		if applied != 1 {
			s.failf("%s: %d reported applied, want exactly 1", what, applied)
			continue
		}
		for _, o := range out {
			switch {
			case o.variant == winner && o.err != nil:
				s.failf("%s: a writer of the winning payload failed: %v", what, o.err)
			case o.variant != winner && o.err == nil && s.contract.DetectsKeyReuse:
				s.failf("%s: a writer of the losing payload got %s, want ErrKeyReused", what, o.res.Status)
			case o.variant != winner && o.err != nil && !errors.Is(o.err, effects.ErrKeyReused):
				s.failf("%s: a writer of the losing payload got %v, want ErrKeyReused", what, o.err)
			}
		}
	}
}

// invalidKeys applies keys every adapter must refuse before any I/O.
func (s *scene[In]) invalidKeys(ctx context.Context) {
	eff, closeFn := s.make(ctx, NewFaults())
	defer closeFn()
	before, err := s.h.Total(ctx)
	if err != nil {
		s.fatalf("harness Total: %v", err)
	}
	invalid := map[string]effects.Key{
		"empty":         "",
		"10 KB":         effects.Key(strings.Repeat("k", 10<<10)),
		"NUL byte":      "abc\x00def",
		"invalid UTF-8": "abc\xff\xfedef",
		"newline":       "abc\ndef",
	}
	for what, key := range invalid {
		_, err := eff.Apply(ctx, key, s.h.Input(key, 0))
		if !errors.Is(err, effects.ErrInvalidKey) {
			s.failf("%s key: got %v, want ErrInvalidKey", what, err)
		} else if effects.Retryable(err) {
			s.failf("%s key: ErrInvalidKey must not be retryable", what)
		}
	}
	after, err := s.h.Total(ctx)
	if err != nil {
		s.fatalf("harness Total: %v", err)
	}
	s.row.observe(after - before)
	if after != before {
		s.failf("invalid keys wrote %d effects, want 0", after-before)
	}
}

// storm applies a fraction of keys, then replays all of them.
func (s *scene[In]) storm(ctx context.Context) {
	eff, closeFn := s.make(ctx, NewFaults())
	defer closeFn()
	total := s.cfg.stormKeys
	seen := int(float64(total) * s.cfg.stormSeen)
	keys := make([]effects.Key, total)
	for i := range keys {
		keys[i] = s.key("storm", fmt.Sprint(i))
	}
	if _, err := s.applyAll(ctx, eff, keys[:seen]); err != nil {
		s.fatalf("applying the %d keys seen before the storm: %v", seen, err)
	}
	before, err := s.h.Total(ctx)
	if err != nil {
		s.fatalf("harness Total: %v", err)
	}
	order := append([]effects.Key(nil), keys...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	applied, err := s.applyAll(ctx, eff, order)
	if err != nil {
		s.fatalf("replay storm: %v", err)
	}
	after, err := s.h.Total(ctx)
	if err != nil {
		s.fatalf("harness Total: %v", err)
	}
	s.notef("%d keys, %d applied before the storm; storm applied %d, backend grew by %d", total, seen, applied, after-before)
	strict := s.contract.DuplicateWindow.Trigger != effects.AnyRedelivery
	if strict && after-before != total-seen {
		s.failf("backend grew by %d effects, want %d (only the new keys)", after-before, total-seen)
	}
	if strict && applied != total-seen {
		s.failf("storm reported %d applied, want %d", applied, total-seen)
	}
	if after-before < total-seen {
		s.failf("backend grew by %d effects, fewer than the %d new keys", after-before, total-seen)
	}
	step := max(1, total/20)
	for i := 0; i < total; i += step {
		s.expect(ctx, keys[i], cleanRepeat, true, fmt.Sprintf("storm key %d", i))
	}
}

// applyAll applies keys with 8 workers and returns how many reported
// Applied.
func (s *scene[In]) applyAll(ctx context.Context, eff effects.Effect[In], keys []effects.Key) (int, error) {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		applied  int
		firstErr error
		next     = make(chan effects.Key)
	)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				res, err := s.applyUntilDone(ctx, eff, k, s.h.Input(k, 0))
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("key %s: %w", k, err)
				}
				if err == nil && res.Status == effects.Applied {
					applied++
				}
				mu.Unlock()
			}
		}()
	}
	for _, k := range keys {
		next <- k
	}
	close(next)
	wg.Wait()
	return applied, firstErr
}

// restart applies a key, restarts the backend and redelivers.
func (s *scene[In]) restart(ctx context.Context) {
	r, ok := s.h.(Restarter)
	if !ok {
		s.row.Verdict = NotRun
		s.notef("harness does not implement Restarter")
		return
	}
	eff, closeFn := s.make(ctx, NewFaults())
	defer closeFn()
	key := s.key("restart")
	in := s.h.Input(key, 0)
	first, err := s.applyUntilDone(ctx, eff, key, in)
	if err != nil {
		s.fatalf("first Apply: %v", err)
	}
	if err := r.Restart(ctx); err != nil {
		s.fatalf("harness Restart: %v", err)
	}
	res, err := s.applyUntilDone(ctx, eff, key, in)
	if err != nil {
		s.fatalf("redelivery after restart: %v", err)
	}
	s.checkReplay(first, res, "redelivery after restart")
	s.expect(ctx, key, cleanRepeat, true, "after restart")
}
