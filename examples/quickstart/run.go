package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v76/client"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/kafka"
	"effectively.dev/postgres"
	"effectively.dev/stripe"
)

type Payment struct {
	ID       string `json:"id"` // the event's own id: a resent event keeps it
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

// newPlan defines what one payment does: a ledger row, then a charge.
func newPlan(pool *pgxpool.Pool, api *client.API) (*effects.Plan[Payment], error) {
	ledger, err1 := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p Payment) (string, error) {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (payment_id, cents) VALUES ($1, $2)`, p.ID, p.Cents)
		return p.ID, err
	})
	journal, err2 := postgres.NewJournal(pool, "billing")
	charges, err3 := stripe.NewPaymentIntents(api, stripe.WithJournal(journal)) // ids kept past Stripe's 24 h
	plan, err4 := effects.NewPlan("billing", effects.EventStep("ledger", ledger),
		effects.NewStep("charge", charges, func(p Payment, _ effects.Results) (stripe.PaymentIntent, error) {
			return stripe.PaymentIntent{Amount: p.Cents, Currency: "usd", Customer: p.Customer}, nil
		}))
	return plan, errors.Join(err1, err2, err3, err4)
}

func run(ctx context.Context, pool *pgxpool.Pool, api *client.API, brokers []string) error {
	plan, err := newPlan(pool, api) // conformance.RunPlan holds it to its contract
	if err != nil {
		return err
	}
	if err := plan.Check(ctx); err != nil {
		return err // before the first delivery: a bad API key, a missing table
	}
	src, err := kafka.NewSource([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("payments")})
	if err != nil {
		return err
	}
	defer src.Close() // commits what was acked, leaves the group
	// A producer for the dead letters.
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer producer.Close()
	dlq, err := kafka.DeadLetterTopic(producer, "payments-dlq")
	if err != nil {
		return err
	}
	c, err := consume.New(src, func(ctx context.Context, d effects.Delivery) error {
		var p Payment
		if err := json.Unmarshal(d.Body, &p); err != nil {
			return fmt.Errorf("%w: %v", effects.ErrPoison, err) // dead-lettered at once
		}
		if err := effects.CheckID(p.ID); err != nil {
			return err
		}
		_, err := plan.Run(ctx, p.ID, p) // keys from the event's id: a resent event replays
		return err
	}, consume.WithDeadLetter(dlq))
	if err != nil {
		return err
	}
	return c.Run(ctx)
}
