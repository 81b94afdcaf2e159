package pgtest_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"effectively.dev/postgres/pgtest"
)

// A throwaway cluster of one's own. In a test, pgtest.Start(t, opts)
// does the same and stops it when the test ends; pgtest.DB(t) is enough for
// a fresh database on a shared cluster.
func ExampleNew() {
	c, err := pgtest.New(pgtest.Options{})
	if err != nil {
		log.Fatal(err) // names what to install when the server binaries are missing
	}
	defer c.Stop()
	ctx := context.Background()
	if err := c.CreateDatabase(ctx, "ledger"); err != nil {
		log.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.URL("ledger"))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	var fsync, commit string
	if err := conn.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit')").Scan(&fsync, &commit); err != nil {
		log.Fatal(err)
	}
	fmt.Println("fsync", fsync, "synchronous_commit", commit) // fast, but commits still wait for their WAL
	// Output: fsync off synchronous_commit on
}

// A failover to a synchronous standby keeps every acknowledged commit: the
// primary crashes (an immediate shutdown) and the standby is promoted.
func ExampleCluster_Promote() {
	primary, err := pgtest.New(pgtest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer primary.Stop()
	standby, err := primary.StartStandby(pgtest.Options{Name: "replica"})
	if err != nil {
		log.Fatal(err)
	}
	defer standby.Stop()
	ctx := context.Background()
	if err := primary.SetSynchronousStandbys(ctx, "replica"); err != nil {
		log.Fatal(err)
	}

	conn, err := pgx.Connect(ctx, primary.URL("postgres"))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE payments (id text PRIMARY KEY); INSERT INTO payments VALUES ('evt_1')"); err != nil {
		log.Fatal(err) // acknowledged: the standby has flushed it
	}
	conn.Close(ctx)

	if err := primary.StopImmediate(); err != nil {
		log.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		log.Fatal(err)
	}
	conn, err = pgx.Connect(ctx, standby.URL("postgres"))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM payments").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payments on the new primary:", n)
	// Output: payments on the new primary: 1
}
