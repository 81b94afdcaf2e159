package conformance_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/effects"
)

// Ledger is a small adapter: it writes an entry to a ledger service whose
// dedup record is written together with the entry, and declares
// effectively-once for it. Every Apply dials through dial, which the
// harness points at the suite's Faults.
type Ledger struct {
	addr string
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Entry is the Ledger's input.
type Entry struct{ Payload string }

// Contract declares what the suite will hold the Ledger to.
func (l *Ledger) Contract() effects.Contract {
	return effects.Contract{
		Guarantee:       effects.EffectivelyOnce,
		Enforcer:        "ledger service: dedup record written with the entry",
		Horizon:         0, // kept until pruned
		DetectsKeyReuse: true,
	}
}

// Apply writes in under key, once.
func (l *Ledger) Apply(ctx context.Context, key effects.Key, in Entry) (effects.Result, error) {
	const op = "Ledger.Apply"
	if err := key.Validate(); err != nil {
		return effects.Result{}, err // before any I/O
	}
	c, err := l.dial(ctx, "tcp", l.addr)
	if err != nil {
		return effects.Result{}, effects.Transient(op, key, err) // nothing was sent
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) }) // honour cancellation
	defer stop()
	if _, err := fmt.Fprintf(c, "APPLY %x %x\n", key, in.Payload); err != nil {
		return effects.Result{}, effects.Ambiguous(op, key, err) // part of it may have left
	}
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return effects.Result{}, effects.Ambiguous(op, key, err) // sent; the answer is lost
	}
	status, ref, _ := strings.Cut(strings.TrimSpace(reply), " ")
	switch status {
	case "APPLIED":
		return effects.Result{Status: effects.Applied, Ref: ref}, nil
	case "REPLAYED":
		return effects.Result{Status: effects.Replayed, Ref: ref}, nil
	case "REUSED":
		return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Op: op, Key: key}
	case "BUSY": // refused before anything was applied
		return effects.Result{}, effects.Transient(op, key, fmt.Errorf("ledger busy: %s", ref))
	case "ERR": // a server error: the entry may have been written
		return effects.Result{}, effects.Ambiguous(op, key, fmt.Errorf("ledger error: %s", ref))
	}
	return effects.Result{}, fmt.Errorf("%s: unexpected reply %q", op, reply)
}

// ledgerHarness connects the suite to the Ledger and its service. Beside
// conformance.Harness it implements the optional capabilities the
// service allows: Restarter, Ager (the service's clock moves forward) and
// BatchCounter.
type ledgerHarness struct{ srv *ledgerServer }

// answerAppFaults makes the service answer the suite's application faults
// on f's armed round trip: BUSY before applying the request, ERR after.
func (h *ledgerHarness) answerAppFaults(f *conformance.Faults) {
	f.SetAppFaulter(func(e *conformance.AppError) error {
		h.srv.failNext(e.Code, e.Applied)
		return nil
	})
}

// Make builds an instance whose every connection goes through f.
func (h *ledgerHarness) Make(ctx context.Context, f *conformance.Faults) (effects.Effect[Entry], func(), error) {
	h.answerAppFaults(f)
	return &Ledger{addr: h.srv.Addr(), dial: f.DialContext}, nil, nil
}

// Input embeds the key, so that Count finds the entry; variant 1 differs.
func (h *ledgerHarness) Input(key effects.Key, variant int) Entry {
	return Entry{Payload: fmt.Sprintf("%s/%d", key, variant)}
}

// SizedInput pads the payload to bytes; the service keeps every payload,
// so the harness states a budget of 1 MiB of them, in entries of up to
// 32 KiB (the key-bytes scenario).
func (h *ledgerHarness) SizedInput(key effects.Key, variant, bytes int) Entry {
	e := h.Input(key, variant)
	e.Payload += strings.Repeat("p", max(bytes-len(e.Payload), 0))
	return e
}

func (h *ledgerHarness) MaxPayload() int  { return 32 << 10 }
func (h *ledgerHarness) StoreBudget() int { return 1 << 20 }

// Count and Total read the service's ledger, never the adapter.
func (h *ledgerHarness) Count(_ context.Context, key effects.Key) (int, error) {
	return h.srv.Count(string(key)), nil
}

func (h *ledgerHarness) Total(context.Context) (int, error) { return h.srv.Total(), nil }

func (h *ledgerHarness) CountBatch(ctx context.Context, keys []effects.Key) ([]int, error) {
	out := make([]int, len(keys))
	for i, k := range keys {
		out[i] = h.srv.Count(string(k))
	}
	return out, nil
}

func (h *ledgerHarness) Restart(context.Context) error { return h.srv.Restart() }

// Attachment is the service's address: a successor process reaches it
// there (conformance.Attacher, with conformance.WithSuccessorProcess).
func (h *ledgerHarness) Attachment() string { return h.srv.Addr() }

// ledgerAt is the harness in a successor process: it reaches the test
// process's service at addr. It only applies; the test process counts.
type ledgerAt struct{ ledgerHarness }

func attachLedger(_ context.Context, addr string) (conformance.Harness[Entry], error) {
	return &ledgerAt{ledgerHarness{srv: &ledgerServer{addr: addr}}}, nil
}

func (h *ledgerHarness) Age(_ context.Context, d time.Duration) error {
	h.srv.Age(d)
	return nil
}

// The harness a test hands to conformance.Run (see TestLedgerConformance:
// conformance.Run(t, "ledger", func(t testing.TB) conformance.Harness[Entry] {...})).
// Here it is driven by hand through one lost reply: the Apply cannot know
// its outcome, and the retry on a new instance, a successor process,
// replays the entry instead of writing it twice.
func Example_harness() {
	srv, err := newLedgerServer(0)
	if err != nil {
		panic(err)
	}
	defer srv.stop()
	h := &ledgerHarness{srv: srv}
	ctx := context.Background()
	key := effects.MustKey("example", "evt_1", "ledger")

	f := new(conformance.Faults)
	eff, _, _ := h.Make(ctx, f)
	f.Arm(1, conformance.DropReply, nil) // the service writes, the reply is lost
	_, err = eff.Apply(ctx, key, h.Input(key, 0))
	fmt.Println("lost reply:", errors.Is(err, effects.ErrAmbiguous), effects.ClassOf(err) == effects.Retryable)

	successor, _, _ := h.Make(ctx, new(conformance.Faults))
	res, err := successor.Apply(ctx, key, h.Input(key, 0))
	n, _ := h.Count(ctx, key)
	fmt.Println("retry on a new instance:", res.Status, err, "entries:", n)
	// Output:
	// lost reply: true true
	// retry on a new instance: replayed <nil> entries: 1
}
