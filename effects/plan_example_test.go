package effects_test

import (
	"context"
	"fmt"
	"log"

	"effectively.dev/effects"
)

// order is the event the example's plan runs on.
type order struct {
	ID    string
	Cents int
}

// Define a plan once, at start-up, with steps that are functions of the
// event; print (or assert) its contract before the first event arrives;
// then run it for every delivery.
func ExampleNewPlan() {
	ledger := &memoryEffect{done: map[effects.Key]string{}}   // your adapters: postgres.New, stripe.NewPaymentIntents, ...
	receipts := &memoryEffect{done: map[effects.Key]string{}} // each an effects.Effect[In]

	billing, err := effects.NewPlan("billing",
		effects.NewStep("ledger", effects.Effect[string](ledger), func(o order, _ effects.Results) (string, error) {
			return fmt.Sprintf("order %s: %d cents", o.ID, o.Cents), nil
		}),
		effects.NewStep("receipt", effects.Effect[string](receipts), func(o order, done effects.Results) (string, error) {
			return fmt.Sprintf("receipt for %s, ledger entry %s", o.ID, done["ledger"].Ref), nil // replayed ref on a redelivery
		}),
	)
	if err != nil {
		log.Fatal(err) // a *effects.ConfigError: nothing ran
	}
	if pc := billing.Contract(); pc.Contract.Guarantee != effects.EffectivelyOnce {
		log.Fatalf("billing must be effectively-once:\n%s", pc)
	}
	fmt.Println(billing.Contract())

	ctx := context.Background()
	for _, d := range []struct {
		id string
		ev order
	}{{"ord_1", order{"ord_1", 1999}}, {"ord_2", order{"ord_2", 500}}, {"ord_1", order{"ord_1", 1999}}} { // ord_1 is redelivered
		res, err := billing.Run(ctx, d.id, d.ev)
		fmt.Println(d.id, res["ledger"].Status, res["receipt"].Status, err)
	}
	// Output:
	// plan "billing" is effectively-once: every step is effectively-once for as long as keys are kept; step "ledger" (memory: map key under a mutex) is the weakest
	//   ledger   effectively-once (memory: map key under a mutex; keys kept until pruned; does not detect key reuse)
	//   receipt  effectively-once (memory: map key under a mutex; keys kept until pruned; does not detect key reuse)
	// ord_1 applied applied <nil>
	// ord_2 applied applied <nil>
	// ord_1 replayed replayed <nil>
}
