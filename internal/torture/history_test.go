package torture_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"effectively.dev/internal/torture"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/postgres/pgtest"
)

// committed returns the group's committed offsets of topic, by partition.
func committed(fake *kfake.Cluster, group, topic string) map[int32]int64 {
	out := map[int32]int64{}
	if g := fake.GroupInfo(group); g != nil {
		for p, c := range g.Commits[topic] {
			out[p] = c.Offset
		}
	}
	return out
}

// waitDrained waits until the group committed every partition of topic up
// to its end, or w exited, or drainTimeout passed.
func waitDrained(ctx context.Context, fake *kfake.Cluster, group, topic string, ends map[int32]int64, w *workerProc) error {
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		got := committed(fake, group, topic)
		behind := 0
		for p, end := range ends {
			behind += int(end - got[p])
		}
		if behind == 0 {
			return nil
		}
		select {
		case <-w.exited:
			return fmt.Errorf("%w: the worker exited (%v) with %d records uncommitted", errNotDrained, w.err, behind)
		case <-ctx.Done():
			return fmt.Errorf("%w in %v: %d records uncommitted (committed %v, ends %v)", errNotDrained, drainTimeout, behind, got, ends)
		case <-tick.C:
		}
	}
}

// readHistory fills h from the backends: the input and output topics, the
// group's committed offsets, the ledger with commit times, the dedup rows
// and the journal.
func readHistory(t *testing.T, ctx context.Context, c *kafkatest.Cluster, fake *kfake.Cluster, db *pgx.Conn, group, input, output string, h *torture.History) {
	t.Helper()
	h.Committed = committed(fake, group, input)

	in, err := c.ReadAll(ctx, input)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range in {
		id, _ := kafkatest.Header(r, "event-id")
		h.Input = append(h.Input, torture.InputRecord{Partition: r.Partition, Offset: r.Offset, EventID: id})
	}
	out, err := c.ReadAll(ctx, output)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range out {
		var v struct {
			Event       string `json:"event"`
			LedgerEntry string `json:"ledger_entry"`
			Cents       int64  `json:"cents"`
		}
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Errorf("output record %d/%d: %v", r.Partition, r.Offset, err)
		}
		id, _ := kafkatest.Header(r, "event-id")
		if id != v.Event {
			t.Errorf("output record %d/%d: header event-id %q, value names %q", r.Partition, r.Offset, id, v.Event)
		}
		h.Output = append(h.Output, torture.OutputRecord{Partition: r.Partition, Offset: r.Offset, EventID: id, LedgerEntry: v.LedgerEntry, Cents: v.Cents})
	}

	rows, err := db.Query(ctx, `SELECT id::text, event_id, cents, pg_xact_commit_timestamp(xmin) FROM chargehook_worker_ledger`)
	if err != nil {
		t.Fatal(err)
	}
	h.Ledger, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (torture.LedgerRow, error) {
		var l torture.LedgerRow
		var at *time.Time
		err := row.Scan(&l.ID, &l.EventID, &l.Cents, &at)
		if err == nil && at == nil {
			err = fmt.Errorf("ledger row %s has no commit timestamp (track_commit_timestamp off when it committed?)", l.ID)
		}
		if at != nil {
			l.CommittedAt = *at
		}
		return l, err
	})
	if err != nil {
		t.Fatal(err)
	}

	h.Keys = map[string]bool{}
	rows, err = db.Query(ctx, `SELECT key FROM effectively_keys WHERE scope = $1`, h.Scope)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		h.Keys[k] = true
	}

	h.Journal = map[string]torture.JournalRow{}
	rows, err = db.Query(ctx, `SELECT key, done, ref, attempt FROM effectively_journal WHERE scope = $1`, h.Scope)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		var j torture.JournalRow
		if err := rows.Scan(&k, &j.Done, &j.Ref, &j.Attempt); err != nil {
			t.Fatal(err)
		}
		h.Journal[k] = j
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// commitTimesDB returns a database of its own on a server that records
// commit times (track_commit_timestamp), which the ack-before-commit check
// needs, and a connection to it, closed at cleanup. It skips t when
// DATABASE_URL names a server that does not record them.
func commitTimesDB(ctx context.Context, t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	dbURL := pgtest.DBWith(t, pgtest.Options{Settings: map[string]string{"track_commit_timestamp": "on"}})
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	var tct string
	if err := db.QueryRow(ctx, "SHOW track_commit_timestamp").Scan(&tct); err != nil {
		t.Fatal(err)
	}
	if tct != "on" {
		t.Skipf("track_commit_timestamp is %q on the server (DATABASE_URL?): the ack-before-commit check needs commit times", tct)
	}
	return dbURL, db
}
