package conformance

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"effectively.dev/effects"
)

// KeyScoper is implemented by a Harness whose backend could scope keys by
// something other than the key (an account, a path, an API version): it
// names those scopes and makes inputs that differ only in them. The
// key-scope scenario applies one key in every scope: a store scoped
// narrower than the key applies it again.
type KeyScoper[In any] interface {
	// KeyScopes names the scopes inputs can vary in ("account", "path",
	// "api version"); ScopedInput(key, i) for i in 1..len(KeyScopes())
	// is Input(key, 0) in another value of scope i.
	KeyScopes() []string
	ScopedInput(key effects.Key, scope int) In
}

// PayloadSizer is implemented by a Harness whose inputs can be made
// large: SizedInput returns Input(key, variant) carrying about bytes of
// payload (what the backend stores of a request or its response), and
// MaxPayload and StoreBudget say the largest payload the adapter takes
// and how many bytes of stored keys and responses the backend must keep.
// The key-bytes scenario fills the backend past StoreBudget with
// payloads of MaxPayload, then redelivers the first key.
type PayloadSizer[In any] interface {
	SizedInput(key effects.Key, variant, bytes int) In
	MaxPayload() int
	StoreBudget() int
}

// appFaults faults each round trip of a clean Apply, and of a duplicate
// Apply, with an application error of every code the backend can answer
// ([AppFaultCodes]), before the request is applied, and with a 5xx after
// it was applied. The adapter's classification must keep its word, and
// the retry must keep the contract.
func (s *scene[In]) appFaults() {
	var codes []string
	if ac, ok := s.h.(AppFaultCodes); ok {
		codes = ac.AppFaultCodes()
	}
	if len(codes) == 0 {
		codes = append(append([]string(nil), SQLAppCodes...), HTTPAppCodes...)
	}
	trips := min(s.cleanTrips(), s.cfg.maxSweep)
	type arm struct {
		kind FaultKind
		code string
	}
	var arms []arm
	for _, c := range codes {
		arms = append(arms, arm{AppErrorBefore, c})
	}
	for _, c := range codes {
		if afterApply(c) {
			arms = append(arms, arm{AppErrorAfter, c})
		}
	}
	s.appFaultsFire(codes[0], trips)
	fired := 0
	for _, a := range arms {
		for n := 1; n <= trips; n++ {
			for _, dup := range []bool{false, true} {
				name := fmt.Sprintf("%s-%s-trip-%02d", appSlug(a.kind), a.code, n)
				if dup {
					name = "dup-" + name
				}
				s.sub(name, func(c *checker) {
					ts := &scene[In]{checker: c, h: s.h, contract: s.contract, appCode: a.code}
					if dup {
						ts.faultDuplicateAt(a.kind, n)
						return
					}
					if ts.faultAt(a.kind, n, false) {
						fired++
					}
				})
			}
		}
	}
	if fired == 0 {
		s.skip("no application fault fired: the backend answers application errors only through Faults.RoundTrip, Faults.SQLConnector or a harness's Faults.SetAppFaulter")
	}
	s.notef("%d application faults (codes %s) at each of the %d round trips of a clean and of a duplicate Apply", len(arms), strings.Join(codes, ", "), trips)
}

// appFaultsFire skips the scenario when an application fault with code
// (one the backend says it answers) fires on none of the first trips
// round trips of an Apply: its backend answers none. A backend may answer
// only some round trips (a journal's are not the mail server's), so each
// is probed in turn, on a new key, until one fires.
func (s *scene[In]) appFaultsFire(code string, trips int) {
	for n := 1; n <= trips; n++ {
		f := new(Faults)
		f.SetAppError(code)
		probe := s.open(f)
		key := s.key("app-faults", "probe", fmt.Sprint(n))
		probe.f.Arm(probe.base+n, AppErrorBefore, nil)
		_, _ = s.apply(s.ctx, probe, key, s.h.Input(key, 0), "the probe of application faults")
		fired := probe.f.Fired()
		probe.f.Disarm()
		probe.Close()
		if fired {
			return
		}
	}
	s.skip("no application fault fired: the backend answers application errors only through Faults.RoundTrip, Faults.SQLConnector or a harness's Faults.SetAppFaulter")
}

func appSlug(k FaultKind) string {
	if k == AppErrorAfter {
		return "after"
	}
	return "before"
}

// slowBackend makes the backend take cfg.gen.slowBackend over each round
// trip of an Apply in turn, while two other instances apply the same key
// again and again: one effect, every attempt that succeeded reporting it
// with one ref.
func (s *scene[In]) slowBackend() {
	trips := min(s.cleanTrips(), s.cfg.maxSweep)
	d := s.cfg.gen.slowBackendTime()
	s.notef("the backend takes %v over each of the %d round trips of an Apply in turn, while duplicates arrive on two other instances", d, trips)
	for n := 1; n <= trips; n++ {
		s.sub(fmt.Sprintf("trip-%02d", n), func(c *checker) {
			ts := &scene[In]{checker: c, h: s.h, contract: s.contract}
			ts.slowAt(n, d)
		})
	}
}

// slowAt applies a new key with round trip n slowed by d, and duplicates
// of it meanwhile.
func (s *scene[In]) slowAt(n int, d time.Duration) {
	key := s.key("slow-backend", fmt.Sprint(n))
	in := s.h.Input(key, 0)
	f := new(Faults)
	f.SetSlowBackend(d)
	slow := s.open(f)
	dups := []*instance[In]{s.open(new(Faults)), s.open(new(Faults))}
	f.Arm(slow.base+n, SlowBackend, nil)
	what := fmt.Sprintf("a slow backend (%v) at round trip %d", d, n)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		outs []outcome
		stop = make(chan struct{})
	)
	record := func(res effects.Result, err error) {
		mu.Lock()
		defer mu.Unlock()
		outs = append(outs, outcome{res: res, err: err})
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(stop)
		s.guard(func() {
			res, err := s.applyUntilDone(slow, key, in, what)
			record(res, err)
		})
	}()
	for _, inst := range dups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.guard(func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(d / 10):
					}
					res, err := s.applyUntilDone(inst, key, in, what+": a duplicate meanwhile")
					record(res, err)
				}
			})
		}()
	}
	wg.Wait()
	if !f.Fired() {
		s.notef("%s: did not fire (the Apply took fewer round trips)", what)
	}
	var refs = map[string]int{}
	applied := 0
	for _, o := range outs {
		if o.err != nil {
			s.failf("%s: an attempt failed: %v", what, o.err)
			continue
		}
		refs[o.res.Ref]++
		if o.res.Status == effects.Applied {
			applied++
		}
	}
	s.quiet()
	// The duplicates arrive while the first attempt's outcome is unknown
	// to them: an at-least-once contract may duplicate after an unknown
	// outcome; an effectively-once one never.
	n1 := s.expect(key, unknownOutcome, len(outs) > 0, what)
	if s.contract.Guarantee == effects.EffectivelyOnce {
		s.check(applied <= 1, "%s: %d attempts reported applied, want one (backend shows %d effects)", what, applied, n1)
		s.check(len(refs) <= 1, "%s: %d different refs returned, want one", what, len(refs))
	}
}

// hostileKeys applies both keys of every generated hostile pair
// ([hostilePairsBothOrders]), in both orders: each must apply once, be
// counted once and replay on its own.
func (s *scene[In]) hostileKeys() {
	seed := s.cfg.gen.scheduleSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	hp := hostilePairsBothOrders(string(s.key("hostile"))+":", seed, 3)
	pairs := make([]distinctPair, len(hp))
	for i, p := range hp {
		pairs[i] = distinctPair{why: p.class + ": " + p.why, a: p.a, b: p.b}
	}
	s.notef("hostile pairs from seed %d", seed)
	s.applyDistinct(pairs)
}

// keyScope applies a key, then the same key in every other scope the
// harness names: the backend must hold one effect for the key, and each
// other scope must replay it (or, where the contract detects key reuse,
// be refused as a reuse).
func (s *scene[In]) keyScope() {
	ks, ok := s.h.(KeyScoper[In])
	if !ok {
		s.inapplicable("the harness names no scope its backend could key by besides the key (conformance.KeyScoper)")
	}
	scopes := ks.KeyScopes()
	if len(scopes) == 0 {
		s.inapplicable("the harness names no scope its backend could key by besides the key")
	}
	key := s.key("scope")
	inst := s.open(new(Faults))
	first := s.applyFirst(inst, key, "first Apply")
	for i, name := range scopes {
		for _, on := range []*instance[In]{inst, s.open(new(Faults))} {
			what := fmt.Sprintf("the key in another %s", name)
			res, err := s.applyUntilDone(on, key, ks.ScopedInput(key, i+1), what)
			switch {
			case errors.Is(err, effects.ErrKeyReused):
			case err != nil:
				s.failf("%s: %v", what, err)
			case s.contract.DetectsKeyReuse:
				s.failf("%s: returned %s, want ErrKeyReused: the backend keys by %s as well as the key", what, res.Status, name)
			default:
				s.checkReplay(first, res, what)
			}
			s.expect(key, cleanRepeat, true, what)
		}
	}
}

// keyBytes fills the backend with keys of the largest payload until it
// holds more than the harness's stated budget, then redelivers the first
// key on the same and on a new instance, and reuses it with another
// payload.
func (s *scene[In]) keyBytes() {
	ps, ok := s.h.(PayloadSizer[In])
	if !ok {
		s.inapplicable("the harness states no payload size or store budget in bytes (conformance.PayloadSizer)")
	}
	size, budget := ps.MaxPayload(), ps.StoreBudget()
	if size <= 0 || budget <= 0 {
		s.inapplicable("the harness states no payload size (%d) or store budget (%d)", size, budget)
	}
	keys := budget/size + 2
	inst := s.open(new(Faults))
	key := s.key("bytes", "first")
	first, err := s.applyUntilDone(inst, key, ps.SizedInput(key, 0, size), "first Apply")
	if err != nil {
		s.fatalf("first Apply: %v", err)
	}
	others := make([]effects.Key, keys)
	for i := range others {
		others[i] = s.key("bytes", fmt.Sprint(i))
		if _, err := s.applyUntilDone(inst, others[i], ps.SizedInput(others[i], 0, size), "filling the store"); err != nil {
			s.fatalf("filling the store, key %d: %v", i, err)
		}
	}
	what := fmt.Sprintf("redelivery after %d keys of %d bytes (%d bytes, budget %d)", keys, size, keys*size, budget)
	for _, on := range []*instance[In]{inst, s.open(new(Faults))} {
		res, err := s.applyUntilDone(on, key, ps.SizedInput(key, 0, size), what)
		if err != nil {
			s.fatalf("%s: %v", what, err)
		}
		s.checkReplay(first, res, what)
	}
	if s.contract.DetectsKeyReuse {
		_, err := s.applyUntilDone(inst, key, ps.SizedInput(key, 1, size), what+", with another payload")
		s.check(errors.Is(err, effects.ErrKeyReused), "%s, with another payload: got %v, want ErrKeyReused", what, err)
	}
	s.expect(key, cleanRepeat, true, what)
	s.notef("%d keys of %d bytes after the first", keys, size)
}
