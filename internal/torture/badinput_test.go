package torture_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/postgres/pgtest"
)

// badInputBehind is how many good events follow each poison record in its
// partition.
const badInputBehind = 40

// TestBadInputPass: the real worker process and consumer, fed poison
// records among good events: each poison record is dead-lettered (one row
// per input record in the dead-letters table, with the reason), and the
// good events behind it in its partition are all booked, once each; the
// group commits every input offset. The poison: what is not JSON, a string
// amount, an amount past int64, an empty or missing id, ids that differ
// only in invalid UTF-8 (encoding/json would merge them), no account, a
// zero, negative or absurd amount, not a payment event at all, and an
// event id reused with another amount.
//
// The share subtest runs the same input through the worker's share-group
// mode (kafka.ShareSource), without the reused id: a share group keeps no
// order, so which of the two records came first would be a coin toss.
func TestBadInputPass(t *testing.T) {
	t.Run("group", func(t *testing.T) { badInputPass(t, false) })
	t.Run("share", func(t *testing.T) { badInputPass(t, true) })
}

func badInputPass(t *testing.T, share bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := workerBinary(t)
	var cluster *kafkatest.Cluster
	if share {
		cluster = kafkatest.Start(t, kafkatest.ShareBrokerConfigs(shareLock, shareDeliveryLimit))
	} else {
		cluster = kafkatest.Start(t)
	}
	fake := cluster.RequireFake(t)
	dbURL := pgtest.DB(t)
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	input := cluster.Topic(t, "badinput-in", partitions)
	output := cluster.Topic(t, "badinput-out", 3)
	group := input + "-workers"

	poison := []struct{ name, body, says string }{
		{"bad JSON", `{"id":"evt-json","account":`, "not a payment event"},
		{"string amount", `{"id":"evt-str","account":"a","cents":"100"}`, "cannot unmarshal string"},
		{"int64 overflow", `{"id":"evt-ovf","account":"a","cents":9223372036854775808}`, "cannot unmarshal number"},
		{"empty id", `{"id":"","account":"a","cents":100}`, "empty"},
		{"invalid UTF-8 id", "{\"id\":\"evt-utf8-\xff\",\"account\":\"a\",\"cents\":100}", "U+FFFD"},
		{"invalid UTF-8 id, other byte", "{\"id\":\"evt-utf8-\xfe\",\"account\":\"a\",\"cents\":200}", "U+FFFD"},
		{"no account", `{"id":"evt-noacct","cents":100}`, "no account"},
		{"zero amount", `{"id":"evt-zero","account":"a","cents":0}`, "not positive"},
		{"negative amount", `{"id":"evt-neg","account":"a","cents":-100}`, "not positive"},
		{"absurd amount", `{"id":"evt-huge","account":"a","cents":100000000000000}`, "over the limit"},
		{"not a payment event", `{"type":"customer.created","customer":"cus_1"}`, "message id \"\": empty"},
		{"key reused", `{"id":"evt-good-0000","account":"a","cents":1}`, "reused"},
	}
	cl := cluster.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	var recs []*kgo.Record
	good := map[string]int64{}
	ends := map[int32]int64{}
	poisonAt := map[string]string{} // position -> poison case
	add := func(p int32, id string, body []byte) string {
		r := &kgo.Record{Topic: input, Partition: p, Value: body}
		if id != "" {
			r.Headers = []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte(id)}, {Key: "event-id", Value: []byte(id)}}
		}
		recs = append(recs, r)
		pos := input + "/" + strconv.Itoa(int(p)) + "/" + strconv.FormatInt(ends[p], 10)
		ends[p]++
		return pos
	}
	addGood := func(p int32) {
		id := fmt.Sprintf("evt-good-%04d", len(good))
		body, _ := json.Marshal(map[string]any{"id": id, "account": "acct-1", "email": "a@example.com", "cents": 100 + len(good)})
		good[id] = int64(100 + len(good))
		add(p, id, body)
	}
	addGood(0) // evt-good-0000, whose id the "key reused" record reuses behind it
	for i, c := range poison {
		if share && c.name == "key reused" {
			continue
		}
		p := int32(i % partitions)
		id := ""
		if c.name == "key reused" {
			p = 0
			id = "evt-good-0000"
		}
		poisonAt[add(p, id, []byte(c.body))] = c.name
		for range badInputBehind {
			addGood(p)
		}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	tl := newTraceLog(false)
	args := []string{
		"-brokers", strings.Join(cluster.Brokers(), ","), "-database-url", dbURL,
		"-topic", input, "-output", output, "-group", group, "-scope", scope,
		"-concurrency", strconv.Itoa(partitions), "-migrate", "-trace",
	}
	if share {
		cluster.ShareFromEarliest(t, group)
		args = append([]string{"share"}, append(args, "-delivery-limit", strconv.Itoa(shareDeliveryLimit))...)
	} else {
		args = append(args, "-max-attempts", "5")
	}
	w := startWorker(t, bin, args, tl)
	if share {
		// A share group commits no offsets: wait for the tables instead.
		if err := waitForRows(ctx, db, len(good), len(poisonAt)); err != nil {
			t.Fatalf("%v: a poison record held its member\nworker stderr:\n%s", err, w.stderrTail())
		}
	} else if err := waitDrained(ctx, fake, group, input, ends, w); err != nil {
		t.Fatalf("%v: a poison record held its partition\nworker stderr:\n%s", err, w.stderrTail())
	}
	if err := w.terminate(20 * time.Second); err != nil {
		t.Errorf("graceful stop: %v\n%s", err, w.stderrTail())
	}

	rows, err := db.Query(ctx, `SELECT position, reason FROM chargehook_worker_dead_letters`)
	if err != nil {
		t.Fatal(err)
	}
	dead := map[string]string{}
	for rows.Next() {
		var pos, reason string
		if err := rows.Scan(&pos, &reason); err != nil {
			t.Fatal(err)
		}
		dead[pos] = reason
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for pos, name := range poisonAt {
		reason, ok := dead[pos]
		var says string
		for _, c := range poison {
			if c.name == name {
				says = c.says
			}
		}
		switch {
		case !ok:
			t.Errorf("poison %q (%s) was not dead-lettered", name, pos)
		case !strings.Contains(reason, says) || strings.Contains(reason, "<nil>"):
			t.Errorf("poison %q dead-lettered with reason %q, want it to say %q", name, reason, says)
		}
	}
	for pos := range dead {
		if _, ok := poisonAt[pos]; !ok {
			t.Errorf("dead letter %s (%q) is not one of the poison records", pos, dead[pos])
		}
	}

	rows, err = db.Query(ctx, `SELECT event_id, cents FROM chargehook_worker_ledger`)
	if err != nil {
		t.Fatal(err)
	}
	booked := map[string][]int64{}
	for rows.Next() {
		var id string
		var cents int64
		if err := rows.Scan(&id, &cents); err != nil {
			t.Fatal(err)
		}
		booked[id] = append(booked[id], cents)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id, cents := range good {
		if got := booked[id]; len(got) != 1 || got[0] != cents {
			t.Errorf("good event %s: ledger rows %v, want one of %d cents", id, got, cents)
		}
	}
	for id, got := range booked {
		if _, ok := good[id]; !ok {
			t.Errorf("ledger rows %v for %q, which is no good event", got, id)
		}
	}
	t.Logf("%d poison records dead-lettered, %d good events booked behind them; worker: %s",
		len(dead), len(booked), strings.TrimSpace(lastLine(w.stderr.String())))
}

// waitForRows waits until the worker's ledger holds ledger rows and its
// dead-letters table dead rows.
func waitForRows(ctx context.Context, db *pgx.Conn, ledger, dead int) error {
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	for {
		var l, d int
		err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM chargehook_worker_ledger), (SELECT count(*) FROM chargehook_worker_dead_letters)`).Scan(&l, &d)
		if err == nil && l >= ledger && d >= dead {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %v: %d of %d ledger rows, %d of %d dead letters (last error %v)", drainTimeout, l, ledger, d, dead, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
