package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// TestRedriveRefusesBadOptions: an invalid option is a ConfigError naming
// it, returned before any I/O.
func TestRedriveRefusesBadOptions(t *testing.T) {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for option, opt := range map[string]kafka.RedriveOption{
		"WithFilter":      kafka.WithFilter(nil),
		"WithLimiter":     kafka.WithLimiter(nil),
		"WithLimit":       kafka.WithLimit(0),
		"WithAllowTopics": kafka.WithAllowTopics(),
		"WithIDHeader":    kafka.WithIDHeader(""),
	} {
		_, err := kafka.Redrive(context.Background(), cl, "dlq", opt)
		var ce *effects.ConfigError
		if !errors.As(err, &ce) || ce.Option != option {
			t.Errorf("%s: %v, want a ConfigError naming it", option, err)
		}
	}
}

// TestRedriveAllowTopicsAndGroup: a dead letter whose destination header
// names a topic that is not allowed is skipped and counted; with a group,
// WithLimit moves the next N each run, a cancelled run resumes
// where it stopped, and nothing is moved twice.
func TestRedriveAllowTopicsAndGroup(t *testing.T) {
	c := kafkatest.Start(t)
	src, other, dlq := c.Topic(t, "src", 1), c.Topic(t, "other", 1), c.Topic(t, "dlq", 2)
	ctx := context.Background()
	var recs []*kgo.Record
	at := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	for i := range 10 {
		r := kafka.DeadLetterRecord(dlq, effects.Delivery{ID: fmt.Sprint("id-", i), Body: []byte(fmt.Sprint(i))}, effects.ErrPoison, at.Add(time.Duration(i)*time.Minute))
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: kafka.HeaderDLQTopic, Value: []byte(src)})
		if i == 4 { // forged: whoever can write the dead-letter topic picks another destination
			r.Headers[len(r.Headers)-1].Value = []byte(other)
		}
		recs = append(recs, r)
	}
	if err := c.Client(t).ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl := c.Client(t)
	allow := kafka.WithAllowTopics(src)
	group := kafka.WithGroup("redrive-" + dlq)

	st, err := kafka.Redrive(ctx, cl, dlq, allow, kafka.WithDryRun(nil))
	if err != nil || st.Moved != 9 || st.NotAllowed != 1 || len(st.Moves) != 1 || st.Moves[0].Topic != src || st.Moves[0].Count != 9 ||
		!st.Moves[0].First.Equal(at) || !st.Moves[0].Last.Equal(at.Add(9*time.Minute)) {
		t.Fatalf("dry run: %+v, %v; want 9 to %s from %v to %v, 1 not allowed", st, err, src, at, at.Add(9*time.Minute))
	}
	moved := 0
	for run, want := range []int{3, 3} {
		st, err := kafka.Redrive(ctx, cl, dlq, allow, group, kafka.WithLimit(3))
		if err != nil || st.Moved != want {
			t.Fatalf("run %d: %+v, %v; want %d moved", run, st, err, want)
		}
		moved += st.Moved
	}
	// A run stopped part-way (its context cancelled after a record moved)
	// commits what it moved.
	cctx, cancel := context.WithCancel(ctx)
	st, err = kafka.Redrive(cctx, cl, dlq, allow, group, kafka.WithDryRun(nil))
	cancel()
	if err != nil || st.Moved != 3 {
		t.Fatalf("dry run after two runs of 3: %+v, %v; want the 3 left", st, err)
	}
	st, err = kafka.Redrive(ctx, cl, dlq, allow, group)
	if err != nil || st.Moved != 3 {
		t.Fatalf("last run: %+v, %v; want the 3 left", st, err)
	}
	moved += st.Moved
	st, err = kafka.Redrive(ctx, cl, dlq, allow, group)
	if err != nil || st.Moved != 0 || st.Read != 0 {
		t.Fatalf("a rerun after the end: %+v, %v; want nothing read", st, err)
	}
	// A run that ended cleanly leaves no time stamp: the next run looks in
	// no destination.
	commits, err := kadm.NewClient(cl).FetchOffsets(ctx, "redrive-"+dlq)
	if err != nil {
		t.Fatal(err)
	}
	commits.Each(func(o kadm.OffsetResponse) {
		if o.Metadata != "" {
			t.Errorf("partition %d committed with metadata %q after a clean end", o.Partition, o.Metadata)
		}
	})
	got := map[string]int{}
	for _, r := range readTopic(t, c, src) {
		id, _ := kafkatest.Header(r, kafka.KeyHeader)
		got[id]++
	}
	if moved != 9 || len(got) != 9 || got["id-4"] != 0 {
		t.Errorf("moved %d, source topic ids %v; want each of the 9 allowed once, id-4 not", moved, got)
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("%s moved %d times", id, n)
		}
	}
	if n := len(readTopic(t, c, other)); n != 0 {
		t.Errorf("%d records in the forged destination", n)
	}
}
