package kafka_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// TestSourceEmptyIDHeaderIsPoison: a record whose id header is present but
// empty is not keyed on its position (a resent event would get another id
// and apply its effects twice): it is handed out with an empty ID, NewKey
// refuses it, and the Consumer dead-letters it at the first attempt. Only
// a record without the header falls back to topic/partition/offset.
func TestSourceEmptyIDHeaderIsPoison(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "emptyid", 1)
	hdr := func(v string) []kgo.RecordHeader { return []kgo.RecordHeader{{Key: kafka.KeyHeader, Value: []byte(v)}} }
	recs := []*kgo.Record{
		{Topic: topic, Value: []byte("empty"), Headers: hdr("")},
		{Topic: topic, Value: []byte("absent")},
		{Topic: topic, Value: []byte("named"), Headers: hdr("evt-2")},
		{Topic: topic, Value: []byte("empty-then-named"), Headers: append(hdr(""), hdr("evt-3")...)},
	}
	if err := c.Client(t).ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	s := newSource(t, c, "g-"+topic, topic)

	var (
		mu       sync.Mutex
		attempts = map[string]int{}
		ids      = map[string]string{}
		dead     = map[string]error{}
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := func() {
		if len(ids)+len(dead) == len(recs) {
			cancel()
		}
	}
	h := func(_ context.Context, d effects.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		attempts[string(d.Body)]++
		if _, err := effects.NewKey("billing", d.ID, "ledger"); err != nil {
			return err
		}
		ids[string(d.Body)] = d.ID
		done()
		return nil
	}
	cons, err := consume.New(s, h,
		consume.WithBackoff(time.Millisecond, time.Millisecond),
		consume.WithDeadLetter(func(_ context.Context, d effects.Delivery, err error) error {
			mu.Lock()
			defer mu.Unlock()
			dead[string(d.Body)] = err
			done()
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := cons.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, body := range []string{"empty", "empty-then-named"} {
		if err := dead[body]; !errors.Is(err, effects.ErrInvalidKey) {
			t.Errorf("record %q (empty id header): dead letter %v, ids %v; want it dead-lettered with ErrInvalidKey", body, err, ids)
		}
		if attempts[body] != 1 {
			t.Errorf("record %q: %d attempts, want 1 (permanent)", body, attempts[body])
		}
	}
	if want := topic + "/0/1"; ids["absent"] != want {
		t.Errorf("record without the header: ID %q, want the fallback %q", ids["absent"], want)
	}
	if ids["named"] != "evt-2" {
		t.Errorf("record with the header: ID %q, want evt-2", ids["named"])
	}
}
