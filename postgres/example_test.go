package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"effectively.dev/effects"
	"effectively.dev/negcache"
	"effectively.dev/postgres"
)

// Payment is a payment event from a webhook or a queue.
type Payment struct {
	EventID string
	Amount  int64
}

// The common path: an Effect that writes a ledger row once per event, however
// often the event is delivered.
func ExampleNew() {
	ctx := context.Background()
	pool := exampleDB() // your *pgxpool.Pool
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (id bigserial PRIMARY KEY, event_id text, amount bigint)`); err != nil {
		log.Fatal(err)
	}

	record, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p Payment) (string, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO ledger (event_id, amount) VALUES ($1, $2) RETURNING id`,
			p.EventID, p.Amount).Scan(&id)
		return fmt.Sprintf("ledger/%d", id), err
	})
	if err != nil {
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
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ledger rows:", rows)
	// Output:
	// applied ledger/1
	// replayed ledger/1
	// ledger rows: 1
}

// Writes known before they run go as statements, with the key's row and
// COMMIT in one round trip: the ref is made first (here from the event).
func ExampleNewPipelined() {
	ctx := context.Background()
	pool := exampleDB() // your *pgxpool.Pool
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (id text PRIMARY KEY, event_id text, amount bigint)`); err != nil {
		log.Fatal(err)
	}

	record, err := postgres.NewPipelined(pool, "billing", func(_ context.Context, key effects.Key, p Payment) (string, []postgres.Statement, error) {
		id := "ledger/" + p.EventID
		return id, []postgres.Statement{
			{SQL: `INSERT INTO ledger (id, event_id, amount) VALUES ($1, $2, $3)`, Args: []any{id, p.EventID, p.Amount}},
		}, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	p := Payment{EventID: "evt_1", Amount: 4200}
	for range 2 {
		res, err := record.Apply(ctx, effects.MustKey(p.EventID, "ledger"), p)
		if err != nil {
			log.Fatal(err) // do not ack
		}
		fmt.Println(res.Status, res.Ref) // ack the message here
	}
	// Output:
	// applied ledger/evt_1
	// replayed ledger/evt_1
}

// Claim inside a transaction you own: claim, write, set the ref, commit, and
// only then ack.
func ExampleClaim() {
	ctx := context.Background()
	pool := exampleDB()
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (id bigserial PRIMARY KEY, event_id text, amount bigint)`); err != nil {
		log.Fatal(err)
	}

	handle := func(ctx context.Context, p Payment) (effects.Result, error) {
		key := effects.MustKey(p.EventID, "ledger")
		fp, err := effects.FingerprintJSON(p)
		if err != nil {
			return effects.Result{}, err
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			return effects.Result{}, err
		}
		defer tx.Rollback(ctx)
		res, err := postgres.Claim(ctx, tx, "billing", key, fp)
		if err != nil || res.Replayed() {
			return res, err
		}
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO ledger (event_id, amount) VALUES ($1, $2) RETURNING id`,
			p.EventID, p.Amount).Scan(&id); err != nil {
			return effects.Result{}, err
		}
		res.Ref = fmt.Sprintf("ledger/%d", id)
		if err := postgres.SetRef(ctx, tx, "billing", key, res.Ref); err != nil {
			return effects.Result{}, err
		}
		return res, tx.Commit(ctx) // ack only if this is nil
	}

	for range 2 {
		res, err := handle(ctx, Payment{EventID: "evt_2", Amount: 990})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.Status, res.Ref)
	}
	// Output:
	// applied ledger/1
	// replayed ledger/1
}

// A consumer that takes messages in batches claims the whole batch with one
// statement and writes only the new ones.
func ExampleClaimBatch() {
	ctx := context.Background()
	pool := exampleDB()
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}

	process := func(batch []Payment) {
		items := make([]postgres.BatchItem, len(batch))
		for i, p := range batch {
			fp, _ := effects.FingerprintJSON(p)
			items[i] = postgres.BatchItem{Key: effects.MustKey(p.EventID, "ledger"), Fingerprint: fp}
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer tx.Rollback(ctx)
		results, err := postgres.ClaimBatch(ctx, tx, "billing", items)
		if err != nil {
			log.Fatal(err)
		}
		for i, r := range results {
			switch {
			case r.Err != nil:
				fmt.Println(batch[i].EventID, "key reused:", errors.Is(r.Err, effects.ErrKeyReused)) // dead-letter it
			case r.Status == effects.Applied:
				fmt.Println(batch[i].EventID, "new") // write its effect in tx here
			default:
				fmt.Println(batch[i].EventID, "duplicate")
			}
		}
		if err := tx.Commit(ctx); err != nil {
			log.Fatal(err)
		}
		// ack the whole batch here
	}

	process([]Payment{{"evt_a", 1}, {"evt_b", 2}})
	process([]Payment{{"evt_b", 2}, {"evt_c", 3}, {"evt_a", 99}})
	// Output:
	// evt_a new
	// evt_b new
	// evt_b duplicate
	// evt_c new
	// evt_a key reused: true
}

// A replay storm: a batch handler (for kafka.Replay with kafka.WithBatchSize, say) whose
// batches are mostly events handled before. WithPrecheck looks up the keys
// the filter may have seen with one query; those replay without a
// transaction, and only the rest are claimed and written.
func ExampleWithPrecheck() {
	ctx := context.Background()
	pool := exampleDB()
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (id bigserial PRIMARY KEY, event_id text, amount bigint)`); err != nil {
		log.Fatal(err)
	}
	// The keys this process committed (warm it at startup with postgres.Keys).
	filter, err := negcache.New(1_000_000, 0.01)
	if err != nil {
		log.Fatal(err)
	}

	handle := func(batch []Payment) {
		items := make([]postgres.BatchItem, len(batch))
		for i, p := range batch {
			fp, _ := effects.FingerprintJSON(p)
			items[i] = postgres.BatchItem{Key: effects.MustKey(p.EventID, "ledger"), Fingerprint: fp}
		}
		results, err := postgres.ApplyBatch(ctx, pool, "billing", items, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO ledger (event_id, amount) VALUES ($1, $2) RETURNING id`,
				batch[i].EventID, batch[i].Amount).Scan(&id)
			return fmt.Sprintf("ledger/%d", id), err
		}, postgres.WithPrecheck(filter))
		if err != nil {
			log.Fatal(err) // nothing acked: the whole batch is redelivered
		}
		for i, r := range results {
			fmt.Println(batch[i].EventID, r.Status, r.Ref, r.Err) // ack those without Err
		}
	}

	handle([]Payment{{"evt_a", 1}, {"evt_b", 2}})
	handle([]Payment{{"evt_a", 1}, {"evt_b", 2}, {"evt_c", 3}}) // the replay: a and b from the pre-check
	// Output:
	// evt_a applied ledger/1 <nil>
	// evt_b applied ledger/2 <nil>
	// evt_a replayed ledger/1 <nil>
	// evt_b replayed ledger/2 <nil>
	// evt_c applied ledger/3 <nil>
}

// A journal records an effect outside the database, such as an email: begin,
// do the effect, complete.
func ExampleJournal() {
	ctx := context.Background()
	pool := exampleDB()
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	journal, err := postgres.NewJournal(pool, "email")
	if err != nil {
		log.Fatal(err)
	}

	send := func(key effects.Key, body string) {
		rec, err := journal.Begin(ctx, key, effects.Fingerprint([]byte(body)), time.Minute)
		switch {
		case err != nil:
			fmt.Println("in flight:", errors.Is(err, effects.ErrInFlight)) // retry later
		case rec.Done:
			fmt.Println("already sent:", rec.Ref)
		default:
			ref := "250 queued as 7F3A" // the SMTP server's reply
			if err := journal.Complete(ctx, key, ref); err != nil {
				log.Fatal(err)
			}
			fmt.Println("sent, attempt", rec.Attempt)
		}
	}
	key := effects.MustKey("evt_1", "receipt-email")
	send(key, "Thanks for your payment")
	send(key, "Thanks for your payment")
	// Output:
	// sent, attempt 1
	// already sent: 250 queued as 7F3A
}
