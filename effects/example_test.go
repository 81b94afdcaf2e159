package effects_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"effectively.dev/effects"
)

func ExampleNewKey() {
	key, err := effects.NewKey("billing", "evt_1NqZ:retry", "ledger")
	if err != nil {
		panic(err)
	}
	fmt.Println(key)
	// Output: billing:evt_1NqZ%3Aretry:ledger
}

// An id decoded from JSON: invalid UTF-8 arrives as U+FFFD, so two
// events whose ids differ only there would share every key. CheckID makes
// such an id poison, which a Consumer dead-letters at once.
func ExampleCheckID() {
	var a, b struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal([]byte("{\"id\":\"evt-\xff\"}"), &a)
	_ = json.Unmarshal([]byte("{\"id\":\"evt-\xfe\"}"), &b)
	fmt.Println(a.ID == b.ID)
	err := effects.CheckID(a.ID)
	fmt.Println(errors.Is(err, effects.ErrPoison))
	fmt.Println(effects.CheckID("evt_42"))
	// Output:
	// true
	// true
	// <nil>
}

func ExampleKey_Validate() {
	err := effects.Key("evt\x00").Validate()
	fmt.Println(errors.Is(err, effects.ErrInvalidKey), effects.ClassOf(err) == effects.Retryable)
	// Output: true false
}

func ExampleClassOf() {
	lost := effects.Ambiguous("postgres.Apply", "evt_1", errors.New("connection reset during COMMIT"))
	reused := &effects.Error{Kind: effects.ErrKeyReused, Op: "stripe.Apply", Key: "evt_1"}
	fmt.Println(effects.ClassOf(lost) == effects.Retryable, effects.ClassOf(reused) == effects.Retryable)
	// Output: true false
}

func ExampleContract_String() {
	c := effects.Contract{
		Guarantee: effects.AtLeastOnce,
		Enforcer:  "email: sent-record in the journal, deterministic Message-ID",
		DuplicateWindow: effects.Window{
			Trigger: effects.AfterUnknownOutcome,
			Between: "after the SMTP server's 250, before the sent-record commits",
		},
		DetectsKeyReuse: true,
	}
	fmt.Println(c.Validate() == nil)
	fmt.Println(c)
	// Output:
	// true
	// at-least-once (email: sent-record in the journal, deterministic Message-ID; keys kept until pruned; duplicates after an unknown outcome: after the SMTP server's 250, before the sent-record commits; detects key reuse)
}

// memoryEffect is a toy Effect: a map guarded by a mutex is its "backend",
// and the map's key is the dedup record.
type memoryEffect struct {
	mu   sync.Mutex
	done map[effects.Key]string
}

func (m *memoryEffect) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "memory: map key under a mutex"}
}

func (m *memoryEffect) Apply(ctx context.Context, key effects.Key, note string) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ref, ok := m.done[key]; ok {
		return effects.Result{Status: effects.Replayed, Ref: ref}, nil
	}
	ref := fmt.Sprintf("note-%d", len(m.done)+1)
	m.done[key] = ref
	return effects.Result{Status: effects.Applied, Ref: ref}, nil
}

func ExampleEffect() {
	var eff effects.Effect[string] = &memoryEffect{done: map[effects.Key]string{}}
	key := effects.MustKey("demo", "msg-1", "note")
	for range 3 { // the broker delivers the message three times
		res, err := eff.Apply(context.Background(), key, "hello")
		fmt.Println(res.Status, res.Ref, err)
	}
	// Output:
	// applied note-1 <nil>
	// replayed note-1 <nil>
	// replayed note-1 <nil>
}

func ExampleFingerprint() {
	fp := effects.Fingerprint([]byte("acct_1"), []byte("1999"))
	fmt.Printf("%x\n", fp[:4])
	// Output: f255c41e
}
