// Command quickstart records each payment event from Kafka once in a
// Postgres ledger and charges it once at Stripe, however often the event is
// delivered. Its worker is in run.go, which the README prints.
//
// Environment: DATABASE_URL (the ledger table and effectively's tables must
// exist: see postgres.Migrate), KAFKA_BROKERS, STRIPE_SECRET_KEY.
package main

import (
	"context"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v76/client"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	api := client.New(os.Getenv("STRIPE_SECRET_KEY"), nil)
	if err := run(ctx, pool, api, strings.Split(os.Getenv("KAFKA_BROKERS"), ",")); err != nil {
		log.Fatal(err) // a configuration error (a revoked key, a missing table) stops the worker
	}
}
