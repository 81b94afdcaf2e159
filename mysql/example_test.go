package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"sync/atomic"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/mysql"
	"effectively.dev/mysql/mysqltest"
)

// Payment is a payment event from a webhook or a queue.
type Payment struct {
	EventID string
	Amount  int64
}

// The common path: an Effect that writes a ledger row once per event,
// however often the event is delivered.
func ExampleNew() {
	ctx := context.Background()
	db := exampleDB() // your *sql.DB, from go-sql-driver/mysql
	defer db.Close()
	if err := mysql.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(255), amount BIGINT)`); err != nil {
		log.Fatal(err)
	}

	record, err := mysql.New(db, "billing", func(ctx context.Context, tx *sql.Tx, p Payment) (string, error) {
		res, err := tx.ExecContext(ctx, `INSERT INTO ledger (event_id, amount) VALUES (?, ?)`, p.EventID, p.Amount)
		if err != nil {
			return "", err
		}
		id, err := res.LastInsertId()
		return fmt.Sprintf("ledger/%d", id), err
	})
	if err != nil {
		log.Fatal(err)
	}
	// At start-up: the table, its engine and key columns, and the
	// server's durability settings.
	if err := record.Check(ctx); err != nil {
		log.Fatal(err)
	}

	// The same event delivered twice, as after a crash between the commit
	// and the ack. The key comes from the event's identity, never from the
	// delivery.
	p := Payment{EventID: "evt_1", Amount: 4200}
	key := effects.MustKey(p.EventID, "ledger")
	for range 2 {
		res, err := record.Apply(ctx, key, p)
		if err != nil {
			// Do not ack. effects.ClassOf(err) says whether redelivery
			// can succeed; an ambiguous error must be retried with the
			// same key.
			log.Fatal(err)
		}
		fmt.Println(res.Status, res.Ref) // ack the message here
	}
	// Output:
	// applied ledger/1
	// replayed ledger/1
}

// A Journal in MySQL keeps the sent-records of effects outside the
// database: pass it to stripe.WithJournal, httpkey.WithJournal,
// kafka.WithJournal or the email sender, or run the protocol yourself with
// journal.Journaled.
func ExampleNewJournal() {
	ctx := context.Background()
	db := exampleDB()
	defer db.Close()
	if err := mysql.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	j, err := mysql.NewJournal(db, "notifications")
	if err != nil {
		log.Fatal(err)
	}
	send, err := journal.NewJournaled("welcome-email", j)
	if err != nil {
		log.Fatal(err)
	}
	var sent atomic.Int32
	key := effects.MustKey("user-42", "welcome")
	fp := effects.Fingerprint([]byte("user-42@example.com"))
	for range 2 {
		res, err := send.Apply(ctx, key, fp, func(ctx context.Context, _ *journal.Attempt) (effects.Result, error) {
			sent.Add(1) // the outside effect: an SMTP transaction, an API call
			return effects.Result{Status: effects.Applied, Ref: "msg-1"}, nil
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.Status, res.Ref)
	}
	fmt.Println("sent", sent.Load())
	// Output:
	// applied msg-1
	// replayed msg-1
	// sent 1
}

// A Pruner keeps effectively_keys flat: keys older than the horizon are
// deleted at a bounded rate, in the background.
func ExamplePruner() {
	db := exampleDB()
	defer db.Close()
	p := &mysql.Pruner{DB: db, Scope: "billing", Horizon: 30 * 24 * time.Hour, Rate: 2000}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // in a service: cancelled at shutdown
	fmt.Println(p.Run(ctx))
	// Output: <nil>
}

var exampleSeq atomic.Int64

// exampleDB opens a fresh database on the test binary's shared server.
func exampleDB() *sql.DB {
	ctx := context.Background()
	s, err := mysqltest.Shared()
	if err != nil {
		panic(err)
	}
	name := fmt.Sprintf("example_%d_%d", os.Getpid(), exampleSeq.Add(1))
	if err := s.CreateDatabase(ctx, name); err != nil {
		panic(err)
	}
	db, err := sql.Open("mysql", s.DSN(name))
	if err != nil {
		panic(err)
	}
	return db
}
