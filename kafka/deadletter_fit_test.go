package kafka_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// TestDeadLetterFitsTopic: a 64 KiB poison record and a record whose id
// header is 520 KB are dead-lettered to a topic whose max.message.bytes is
// 4 KiB, read from the topic's config: each dead letter is cut to fit,
// says what was cut, its original size and its body's hash, and the
// partition goes on to the good record behind them.
func TestDeadLetterFitsTopic(t *testing.T) {
	c := kafkatest.Start(t)
	topic, dlq := c.Topic(t, "big", 1), c.Topic(t, "big-dlq", 1)
	c.SetTopicConfig(t, dlq, "max.message.bytes", "4096")
	big := append([]byte("poison:"), bytes.Repeat([]byte("x"), 64<<10)...)
	longID := strings.Repeat("i", 520_000)
	id := func(v string) []kgo.RecordHeader { return []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte(v)}} }
	if err := c.Client(t, kgo.ProducerBatchMaxBytes(2<<20)).ProduceSync(context.Background(),
		&kgo.Record{Topic: topic, Value: big, Headers: id("big-body")},
		&kgo.Record{Topic: topic, Value: []byte("poison: long id"), Headers: id(longID)},
		&kgo.Record{Topic: topic, Value: []byte("good"), Headers: id("good")},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	hook, err := kafka.DeadLetterTopic(c.Client(t), dlq)
	if err != nil {
		t.Fatal(err)
	}
	cons := runConsumer(t, newSource(t, c, "g-"+topic, topic), poisonHandler,
		consume.WithDeadLetter(hook), consume.WithBackoff(time.Millisecond, 10*time.Millisecond))
	eventually(t, "all three deliveries acked", func() bool { return cons.Stats().Acked == 3 })
	if st := cons.Stats(); st.DeadLettered != 2 || st.Parked != 0 {
		t.Fatalf("stats %+v, want 2 dead-lettered, none parked", st)
	}
	recs := readTopic(t, c, dlq)
	if len(recs) != 2 {
		t.Fatalf("%d dead letters, want 2", len(recs))
	}
	sum := sha256.Sum256(big)
	for i, r := range recs {
		size := len(r.Key) + len(r.Value)
		for _, h := range r.Headers {
			size += len(h.Key) + len(h.Value)
			if len(h.Value) > 1<<10 {
				t.Errorf("dead letter %d: header %s is %d bytes, want each bounded", i, h.Key, len(h.Value))
			}
		}
		if size > 4096 {
			t.Errorf("dead letter %d is %d bytes, over the topic's 4096", i, size)
		}
		cut := header(r, kafka.HeaderDLQCut)
		orig, _ := strconv.Atoi(header(r, kafka.HeaderDLQOriginalSize))
		switch i {
		case 0:
			if !strings.Contains(cut, "body") || orig < len(big) || header(r, kafka.HeaderDLQBodySHA256) != hex.EncodeToString(sum[:]) {
				t.Errorf("big body: cut %q, original size %d, hash %q", cut, orig, header(r, kafka.HeaderDLQBodySHA256))
			}
			if !bytes.HasPrefix(big, r.Value) || len(r.Value) == 0 {
				t.Errorf("big body: kept %d bytes, want a prefix of the body", len(r.Value))
			}
		case 1:
			if !strings.Contains(cut, "header:"+kafka.KeyHeader) || orig < len(longID) {
				t.Errorf("long id: cut %q, original size %d", cut, orig)
			}
			if string(r.Value) != "poison: long id" {
				t.Errorf("long id: body %q, want it whole (it fits)", r.Value)
			}
		}
		if got := header(r, kafka.HeaderDLQClass); got != "poison" {
			t.Errorf("dead letter %d: class %q", i, got)
		}
	}
}

// TestDeadLetterIDStoredOnce: a delivery whose id came from a header
// keeps that header, names it in HeaderDLQIDHeader, and has no second
// copy of the id; a delivery keyed on its position gets
// HeaderDLQDeliveryID. ParseDeadLetter reads both.
func TestDeadLetterIDStoredOnce(t *testing.T) {
	now := time.Now()
	fromHeader := effects.Delivery{ID: "evt-7", Body: []byte("b"), Headers: map[string]string{kafka.KeyHeader: "evt-7", "type": "x"}}
	r := kafka.DeadLetterRecord("dlq", fromHeader, effects.ErrPoison, now)
	n := 0
	for _, h := range r.Headers {
		if string(h.Value) == "evt-7" {
			n++
		}
	}
	if n != 1 || header(r, kafka.HeaderDLQIDHeader) != kafka.KeyHeader || deadLetterID(r) != "evt-7" {
		t.Errorf("id from a header: %d copies, id-header %q, ParseDeadLetter's ID %q; want 1, %s, evt-7", n, header(r, kafka.HeaderDLQIDHeader), deadLetterID(r), kafka.KeyHeader)
	}
	r = kafka.DeadLetterRecord("dlq", effects.Delivery{ID: "t/0/3"}, effects.ErrPoison, now)
	if header(r, kafka.HeaderDLQDeliveryID) != "t/0/3" || deadLetterID(r) != "t/0/3" {
		t.Errorf("positional id: header %q, ParseDeadLetter's ID %q", header(r, kafka.HeaderDLQDeliveryID), deadLetterID(r))
	}
	// A record without the dead-letter headers is not a dead letter.
	plain := &kgo.Record{Timestamp: now, Headers: []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte("evt-8")}}}
	if d, ok := kafka.ParseDeadLetter(plain); ok || d != (kafka.DeadLetter{Time: now}) {
		t.Errorf("ParseDeadLetter(a plain record) = %+v, %t; want only its timestamp, false", d, ok)
	}
}

// TestDeadLetterMaxBytesOption: WithMaxBytes caps the dead
// letter below what the topic allows, and refuses a limit too small for
// the dead-letter headers.
func TestDeadLetterMaxBytesOption(t *testing.T) {
	c := kafkatest.Start(t)
	dlq := c.Topic(t, "opt-dlq", 1)
	if _, err := kafka.DeadLetterTopic(c.Client(t), dlq, kafka.WithMaxBytes(100)); effects.ClassOf(err) != effects.InvalidConfig {
		t.Errorf("WithMaxBytes(100): %v, want a configuration error", err)
	}
	hook, err := kafka.DeadLetterTopic(c.Client(t), dlq, kafka.WithMaxBytes(3000))
	if err != nil {
		t.Fatal(err)
	}
	d := effects.Delivery{ID: "evt-1", Body: bytes.Repeat([]byte("y"), 10_000)}
	if err := hook(context.Background(), d, effects.ErrPoison); err != nil {
		t.Fatal(err)
	}
	recs := readTopic(t, c, dlq)
	if len(recs) != 1 || len(recs[0].Value) >= 3000 || !strings.Contains(header(recs[0], kafka.HeaderDLQCut), "body") {
		t.Fatalf("dead letters %d, body %d bytes, cut %q", len(recs), len(recs[0].Value), header(recs[0], kafka.HeaderDLQCut))
	}
	// A cut dead letter is for inspection: Redrive does not move it.
	st, err := kafka.Redrive(context.Background(), c.Client(t), dlq, kafka.WithTopic("elsewhere"), kafka.WithDryRun(nil))
	if err != nil || st.Moved != 0 || st.Cut != 1 {
		t.Errorf("Redrive of a cut dead letter: %+v, %v; want 0 moved, 1 cut", st, err)
	}
}

// TestDeadLetterSizeLimitMix: 60 records over 3 partitions, 15 of them
// poison with a 64 KiB body and 5 poison with a 520 KB id header, to a
// dead-letter topic of max.message.bytes 4 KiB: every record is acked,
// every poison one dead-lettered once and cut to fit, every good one
// handled once, nothing parked.
func TestDeadLetterSizeLimitMix(t *testing.T) {
	for _, naive := range []bool{false, true} {
		name := "DeadLetterTopic"
		if naive {
			name = "negative control: a hook that produces the whole record"
		}
		t.Run(name, func(t *testing.T) { deadLetterSizeLimitMix(t, naive) })
	}
}

func deadLetterSizeLimitMix(t *testing.T, naive bool) {
	c := kafkatest.Start(t)
	topic, dlq := c.Topic(t, "mix", 3), c.Topic(t, "mix-dlq", 1)
	c.SetTopicConfig(t, dlq, "max.message.bytes", "4096")
	var recs []*kgo.Record
	for i := range 60 {
		id, body := fmt.Sprint("evt-", i), []byte("good")
		switch {
		case i%4 == 1:
			body = append([]byte("poison:"), bytes.Repeat([]byte("x"), 64<<10)...)
		case i%12 == 3:
			id, body = fmt.Sprint(i, "-", strings.Repeat("i", 520_000)), []byte("poison: long id")
		}
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(i % 3), Value: body,
			Headers: []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte(id)}}})
	}
	if err := c.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner())).ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handled := map[string]int{}
	h := func(ctx context.Context, d effects.Delivery) error {
		if err := poisonHandler(ctx, d); err != nil {
			return err
		}
		mu.Lock()
		handled[d.ID]++
		mu.Unlock()
		return nil
	}
	hook, err := kafka.DeadLetterTopic(c.Client(t), dlq)
	if err != nil {
		t.Fatal(err)
	}
	if naive {
		cl := c.Client(t, kgo.ProducerBatchMaxBytes(2<<20))
		hook = func(ctx context.Context, d effects.Delivery, cause error) error {
			return cl.ProduceSync(ctx, kafka.DeadLetterRecord(dlq, d, cause, time.Now())).FirstErr()
		}
	}
	cons := runConsumer(t, newSource(t, c, "g-"+topic, topic), h, consume.WithDeadLetter(hook),
		consume.WithBackoff(time.Millisecond, 10*time.Millisecond), consume.WithLogger(slog.New(slog.DiscardHandler)))
	if naive {
		eventually(t, "a dead letter refused as too large parks its partition", func() bool { return cons.Stats().Parked > 0 })
		if st := cons.Stats(); st.Acked >= 60 {
			t.Errorf("stats %+v: the negative control acked everything", st)
		} else {
			t.Logf("negative control: stats %+v", st)
		}
		return
	}
	eventually(t, "all 60 acked", func() bool { return cons.Stats().Acked == 60 })
	st := cons.Stats()
	dead := readTopic(t, c, dlq)
	ids := map[string]int{}
	for _, r := range dead {
		size := len(r.Key) + len(r.Value)
		for _, h := range r.Headers {
			size += len(h.Key) + len(h.Value)
		}
		if size > 4096 || header(r, kafka.HeaderDLQCut) == "" {
			t.Errorf("dead letter of %d bytes, cut %q; want at most 4096, cut", size, header(r, kafka.HeaderDLQCut))
		}
		ids[header(r, kafka.HeaderDLQOriginalSize)+header(r, kafka.HeaderDLQBodySHA256)+header(r, kafka.HeaderDLQOffset)+header(r, kafka.HeaderDLQPartition)]++
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("60 records: %d handled, %d dead letters (%d distinct), stats %+v", len(handled), len(dead), len(ids), st)
	if st.DeadLettered != 20 || st.Parked != 0 || len(dead) != 20 || len(ids) != 20 || len(handled) != 40 {
		t.Errorf("stats %+v, %d dead letters (%d distinct), %d handled; want 20 dead letters, each once, 40 handled, none parked", st, len(dead), len(ids), len(handled))
	}
	for id, n := range handled {
		if n != 1 {
			t.Errorf("%s handled %d times", id, n)
		}
	}
}
