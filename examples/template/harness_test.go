package template_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/effects"

	"example.com/template"
)

// TestConformance holds the adapter to its contract in every scenario, and
// fails unless every field of the contract is verified, or left
// unverified only by the scenarios AllowUnverified names, for its reason.
//
// WithSlowReply holds each reply past the adapter's own deadline: set it
// above that deadline. The template's backend lives in the test's memory,
// so it can neither crash (conformance.CrashRestarter: a real backend is
// killed, with no clean shutdown, and started over its data) nor be
// reached by a child process (conformance.Attacher and
// conformance.WithSuccessorProcess: a real backend's address or files).
// Implement both for your backend and delete AllowUnverified.
func TestConformance(t *testing.T) {
	rep := conformance.Run(t, "template", func(t testing.TB) conformance.Harness[template.Entry] {
		return &harness{b: template.NewBackend()} // a real backend: start it here, stop it with t.Cleanup
	}, conformance.WithLateRedelivery(time.Second), conformance.WithSlowReply(300*time.Millisecond),
		conformance.AllowUnverified("the template's backend lives in the test's memory: no crash, no second process",
			conformance.ScenarioCrashRestart, conformance.ScenarioProcess))
	for _, f := range rep.Fields {
		if f.Status != conformance.Verified && f.Allowed == "" {
			t.Errorf("contract field %s", f)
		}
	}
}

// harness builds adapters over one backend per scenario: successors share
// the backend, never an adapter.
type harness struct{ b *template.Backend }

var (
	_ conformance.Restarter    = (*harness)(nil)
	_ conformance.Ager         = (*harness)(nil)
	_ conformance.BatchCounter = (*harness)(nil)
)

// Make builds a new adapter whose every backend call goes through f. A
// networked backend passes f.DialContext or f.Transport to its client; a
// database/sql driver opens sql.OpenDB(f.SQLConnector(base)).
func (h *harness) Make(_ context.Context, f *conformance.Faults) (effects.Effect[template.Entry], func(), error) {
	a, err := template.New(h.b, template.WithCaller(f))
	return a, nil, err // nothing to release; a real adapter returns its client's Close
}

// Input is variant 0 or, under a reused key, another amount.
func (h *harness) Input(_ effects.Key, variant int) template.Entry {
	return template.Entry{Account: "acct-1", Amount: int64(100 + variant)}
}

// Count reads the backend itself (its entries), never the adapter's
// records.
func (h *harness) Count(_ context.Context, key effects.Key) (int, error) {
	n, _ := h.b.Counts([]effects.Key{key})
	return n[0], nil
}

// Total is every entry written.
func (h *harness) Total(context.Context) (int, error) {
	_, total := h.b.Counts(nil)
	return total, nil
}

// CountBatch counts many keys in one look (conformance.BatchCounter). Without
// it the replay storm counts key by key.
func (h *harness) CountBatch(_ context.Context, keys []effects.Key) ([]int, error) {
	n, _ := h.b.Counts(keys)
	return n, nil
}

// Restart closes every handle and reopens over the same state
// (conformance.Restarter). A server: stop it and start it on the same
// address with the same data directory.
func (h *harness) Restart(context.Context) error {
	h.b.Restart()
	return nil
}

// Age makes every record d older (conformance.Ager). The horizon scenario
// then expects a redelivery to replay. Move your backend's clock or its
// stored timestamps; never prune.
func (h *harness) Age(_ context.Context, d time.Duration) error {
	h.b.Age(d)
	return nil
}

// TestCheck: Check refuses a durability setting that could lose an
// acknowledged effect, as a config error naming the setting.
func TestCheck(t *testing.T) {
	b := template.NewBackend()
	a, err := template.New(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Check(context.Background()); err != nil {
		t.Fatalf("Check on a durable backend: %v", err)
	}
	b.AsyncCommit = true
	var cfg *effects.ConfigError
	if err := a.Check(context.Background()); !errors.As(err, &cfg) || effects.ClassOf(err) != effects.InvalidConfig {
		t.Errorf("Check with AsyncCommit: %v, want a *effects.ConfigError", err)
	}
}

// TestRefusal: a refusal the backend guarantees applied nothing is
// permanent; a nil backend is a config error.
func TestRefusal(t *testing.T) {
	b := template.NewBackend()
	a, _ := template.New(b)
	_, err := a.Apply(context.Background(), effects.MustKey("k"), template.Entry{Account: "a"})
	if !errors.Is(err, effects.ErrRefused) || effects.ClassOf(err) != effects.Permanent {
		t.Errorf("zero amount: %v, want ErrRefused, permanent", err)
	}
	if _, total := b.Counts(nil); total != 0 {
		t.Errorf("refused entry written: total %d", total)
	}
	if _, err := template.New(nil); effects.ClassOf(err) != effects.InvalidConfig {
		t.Errorf("New(nil): %v, want a config error", err)
	}
}
