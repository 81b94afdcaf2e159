package kafka_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

func TestProducerRefusesNonIdempotentClients(t *testing.T) {
	c := kafkatest.Start(t)
	for name, opts := range map[string][]kgo.Opt{
		"idempotence disabled": {kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.AllISRAcks())},
		"acks=1":               {kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())},
		"transactional":        {kgo.TransactionalID("tx")},
	} {
		t.Run(name, func(t *testing.T) {
			cl := c.Client(t, opts...)
			if _, err := kafka.NewProducer(cl, "t"); !errors.Is(err, kafka.ErrNotIdempotent) {
				t.Fatalf("NewProducer = %v, want ErrNotIdempotent", err)
			}
		})
	}
}

func TestProducerRecord(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "producer", 3)
	p, err := kafka.NewProducer(c.Client(t), topic)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := effects.MustKey("billing", "evt-1", "event")
	res, err := p.Apply(ctx, key, kafka.Message{Value: []byte("v"), Headers: []kgo.RecordHeader{{Key: "h", Value: []byte("x")}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != effects.Applied {
		t.Errorf("status %s, want applied", res.Status)
	}
	recs, err := c.ReadAll(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Fatalf("%d records, want 1", len(recs))
	}
	r := recs[0]
	if got := string(r.Key); got != string(key) {
		t.Errorf("record key %q, want the effect key %q", got, key)
	}
	if h, _ := kafkatest.Header(r, kafka.KeyHeader); h != string(key) {
		t.Errorf("%s header %q, want %q", kafka.KeyHeader, h, key)
	}
	if h, _ := kafkatest.Header(r, "h"); h != "x" {
		t.Errorf("caller's header h = %q, want x", h)
	}
	if want := refOf(r); res.Ref != want {
		t.Errorf("Ref %q, want partition/offset %q", res.Ref, want)
	}

	// A caller-chosen record key is kept; the header still names the effect.
	key2 := effects.MustKey("billing", "evt-2", "event")
	if _, err := p.Apply(ctx, key2, kafka.Message{Key: []byte("account-7"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	recs, _ = c.ReadAll(ctx, topic)
	for _, r := range recs {
		if h, _ := kafkatest.Header(r, kafka.KeyHeader); h == string(key2) && string(r.Key) != "account-7" {
			t.Errorf("record key %q, want the caller's account-7", r.Key)
		}
	}
}

// refOf is the Ref the producer reports for r: "partition/offset".
func refOf(r *kgo.Record) string {
	return strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
}

// TestProducerWithoutJournalDuplicatesAcrossSessions shows why the plain
// producer declares AnyRedelivery: Kafka's idempotence is per producer
// session, so the same key produced by two client sessions is two records.
func TestProducerWithoutJournalDuplicatesAcrossSessions(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "sessions", 1)
	key := effects.MustKey("billing", "evt-1", "event")
	for session := 0; session < 2; session++ {
		cl := c.Client(t)
		p, err := kafka.NewProducer(cl, topic)
		if err != nil {
			t.Fatal(err)
		}
		if c := p.Contract(); c.DuplicateWindow.Trigger != effects.AnyRedelivery {
			t.Fatalf("contract trigger %s, want any redelivery", c.DuplicateWindow.Trigger)
		}
		if _, err := p.Apply(context.Background(), key, kafka.Message{Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		cl.Close() // the session ends, like a restarted process
	}
	if n := readCounts(t, c, topic, kafka.KeyHeader)[string(key)]; n != 2 {
		t.Fatalf("%d records for the key, want 2 (one per producer session)", n)
	}
}

func TestProducerInvalidKeyDoesNoIO(t *testing.T) {
	c := kafkatest.Start(t)
	fake := c.RequireFake(t)
	var requests atomic.Int64
	fake.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		requests.Add(1)
		fake.KeepControl()
		return nil, nil, false
	})
	p, err := kafka.NewProducer(c.Client(t), "never")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []effects.Key{"", "a\x00b", "\xff"} {
		if _, err := p.Apply(context.Background(), key, kafka.Message{}); !errors.Is(err, effects.ErrInvalidKey) {
			t.Errorf("key %q: %v, want ErrInvalidKey", key, err)
		}
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("%d requests reached the broker, want 0", n)
	}
}

// TestProducerErrors checks the classification of broker failures.
func TestProducerErrors(t *testing.T) {
	c := kafkatest.Start(t)
	fake := c.RequireFake(t)
	topic := c.Topic(t, "errors", 1)
	tests := []struct {
		name  string
		err   *kerr.Error
		class effects.Class
	}{
		{"retryable broker error wrote nothing", kerr.NotEnoughReplicas, effects.Retryable},
		{"topic authorization is configuration", kerr.TopicAuthorizationFailed, effects.InvalidConfig},
		{"cluster authorization is configuration", kerr.ClusterAuthorizationFailed, effects.InvalidConfig},
		{"record too large is refused", kerr.MessageTooLarge, effects.Permanent},
		{"invalid record is refused", kerr.InvalidRecord, effects.Permanent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl := c.Client(t, kgo.RecordRetries(0))
			p, err := kafka.NewProducer(cl, topic)
			if err != nil {
				t.Fatal(err)
			}
			fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				preq := req.(*kmsg.ProduceRequest)
				resp := preq.ResponseKind().(*kmsg.ProduceResponse)
				for _, rt := range preq.Topics {
					st := kmsg.NewProduceResponseTopic()
					st.Topic = rt.Topic
					st.TopicID = rt.TopicID
					for _, rp := range rt.Partitions {
						sp := kmsg.NewProduceResponseTopicPartition()
						sp.Partition = rp.Partition
						sp.ErrorCode = tt.err.Code
						st.Partitions = append(st.Partitions, sp)
					}
					resp.Topics = append(resp.Topics, st)
				}
				return resp, nil, true
			})
			key := effects.MustKey("errors", tt.name)
			_, err = p.Apply(context.Background(), key, kafka.Message{Value: []byte("v")})
			if err == nil {
				t.Fatal("Apply succeeded, want an error")
			}
			if !errors.Is(err, tt.err) {
				t.Errorf("error %v does not wrap %v", err, tt.err)
			}
			if got := effects.ClassOf(err); got != tt.class {
				t.Errorf("%v: class %v, want %v", err, got, tt.class)
			}
			var ce *effects.ConfigError
			if tt.class == effects.InvalidConfig && (!errors.As(err, &ce) || ce.Option == "") {
				t.Errorf("%v: no *effects.ConfigError naming the setting", err)
			}
		})
	}
}

// TestProducerUnknownTopic: producing to a topic the cluster does not
// have is a configuration error naming the topic, and Check says so
// before any Apply; an existing topic passes Check.
func TestProducerUnknownTopic(t *testing.T) {
	c := kafkatest.Start(t)
	cl := c.Client(t, kgo.UnknownTopicRetries(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	good, err := kafka.NewProducer(cl, c.Topic(t, "exists", 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := good.Check(ctx); err != nil {
		t.Errorf("Check of an existing topic: %v", err)
	}

	p, err := kafka.NewProducer(cl, "no-such-topic-typo")
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"Check": p.Check(ctx),
		"Apply": func() error {
			_, err := p.Apply(ctx, effects.MustKey("unknown", "topic"), kafka.Message{Value: []byte("v")})
			return err
		}(),
	} {
		var ce *effects.ConfigError
		if effects.ClassOf(err) != effects.InvalidConfig || !errors.As(err, &ce) || !strings.Contains(ce.Option, "no-such-topic-typo") {
			t.Errorf("%s = %v; want a configuration error naming the topic", name, err)
		}
	}
}

// TestProducerRetriesWithinSession shows what Kafka's idempotence does
// cover: a produce answered with REQUEST_TIMED_OUT (maybe written) is
// retried by franz-go with the same producer id and sequence, and the
// broker keeps one record.
func TestProducerRetriesWithinSession(t *testing.T) {
	c := kafkatest.Start(t)
	fake := c.RequireFake(t)
	topic := c.Topic(t, "timeout", 1)
	p, err := kafka.NewProducer(c.Client(t), topic)
	if err != nil {
		t.Fatal(err)
	}
	// Write the batch, then answer REQUEST_TIMED_OUT as a broker does when
	// replication was slow.
	fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.RequestTimedOut})
	key := effects.MustKey("timeout")
	if _, err := p.Apply(context.Background(), key, kafka.Message{Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if n := readCounts(t, c, topic, kafka.KeyHeader)[string(key)]; n != 1 {
		t.Fatalf("%d records, want 1: the retry within the session is deduped", n)
	}
}

// TestProducerContextDoneInFlight: when the context ends while the produce
// request is at the broker, Apply returns ErrAmbiguous at once; with a
// journal, the record the broker acks later is still recorded, so the
// retry replays it instead of producing again.
func TestProducerContextDoneInFlight(t *testing.T) {
	c := kafkatest.Start(t)
	fake := c.RequireFake(t)
	topic := c.Topic(t, "inflight", 1)
	j := memjournal.New(nil)
	p, err := kafka.NewProducer(c.Client(t), topic, kafka.WithJournal(j))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		fake.SleepControl(func() { <-release })
		return nil, nil, false
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	key := effects.MustKey("inflight")
	_, err = p.Apply(ctx, key, kafka.Message{Value: []byte("v")})
	close(release)
	if !errors.Is(err, effects.ErrAmbiguous) || effects.ClassOf(err) != effects.Retryable {
		t.Fatalf("Apply = %v, want a retryable ErrAmbiguous", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !j.Get(key).Done {
		if time.Now().After(deadline) {
			t.Fatalf("the late ack was not recorded: %+v", j.Get(key))
		}
		time.Sleep(10 * time.Millisecond)
	}
	res, err := p.Apply(context.Background(), key, kafka.Message{Value: []byte("v")})
	if err != nil || res.Status != effects.Replayed || res.Ref != j.Get(key).Ref {
		t.Fatalf("retry = %+v, %v; want replayed from the journal", res, err)
	}
	if n := readCounts(t, c, topic, kafka.KeyHeader)[string(key)]; n != 1 {
		t.Errorf("%d records, want 1", n)
	}
}

// An Apply waits for its own record, never for the client's linger: with
// the longest linger franz-go allows (a minute), the first Apply to a
// topic the client does not know yet and the ones after it all finish well
// inside a deadline that a lingering record would miss. (No timing is
// measured: a lingering Apply would fail with ErrAmbiguous.)
func TestProducerNeverWaitsForLinger(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "linger", 3)
	for name, opts := range map[string][]kafka.ProducerOption{
		"plain":   nil,
		"journal": {kafka.WithJournal(memjournal.New(nil))},
	} {
		t.Run(name, func(t *testing.T) {
			cl := c.Client(t, kgo.ProducerLinger(time.Minute))
			p, err := kafka.NewProducer(cl, topic, opts...)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 5 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				res, err := p.Apply(ctx, effects.MustKey("linger", name, fmt.Sprint(i)), kafka.Message{Value: []byte("v")})
				cancel()
				if err != nil || res.Status != effects.Applied {
					t.Fatalf("Apply %d = %+v, %v; want applied without waiting for the one-minute linger", i, res, err)
				}
			}
		})
	}
}

// The broker acked the record but the journal could not record it: the
// truth is Applied, and the failure is logged without an observer and
// reported as an event with one.
func TestProducerUnrecordedAckIsApplied(t *testing.T) {
	c := kafkatest.Start(t)
	topic := c.Topic(t, "unrecorded", 1)
	j := &refusingComplete{Journal: memjournal.New(nil)}
	var logs bytes.Buffer
	p, err := kafka.NewProducer(c.Client(t), topic, kafka.WithJournal(j, journal.WithRecordTimeout(200*time.Millisecond)),
		kafka.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Apply(context.Background(), "k", kafka.Message{Value: []byte("v")})
	if err != nil || res.Status != effects.Applied {
		t.Fatalf("Apply = %+v, %v; want applied: the broker has the record", res, err)
	}
	if !strings.Contains(logs.String(), "did not commit") || !strings.Contains(logs.String(), res.Ref) {
		t.Errorf("log %q does not report the unrecorded record", logs.String())
	}

	var events []effects.Event
	logs.Reset()
	p, err = kafka.NewProducer(c.Client(t), topic, kafka.WithJournal(j, journal.WithRecordTimeout(200*time.Millisecond)),
		kafka.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		kafka.WithObserver(effects.ObserverFunc(func(_ context.Context, ev effects.Event) { events = append(events, ev) })))
	if err != nil {
		t.Fatal(err)
	}
	if res, err = p.Apply(context.Background(), "k2", kafka.Message{Value: []byte("v")}); err != nil || res.Status != effects.Applied {
		t.Fatalf("Apply = %+v, %v; want applied", res, err)
	}
	if len(events) != 1 || events[0].Kind != effects.EventFailed || events[0].Component != "journal" ||
		events[0].Key != "k2" || events[0].Err == nil || !strings.Contains(events[0].Err.Error(), res.Ref) {
		t.Errorf("observed %+v; want one failed event of the journal for k2, naming %s", events, res.Ref)
	}
	if logs.Len() != 0 {
		t.Errorf("logged %q with an observer; want the event only", logs.String())
	}
}

type refusingComplete struct{ *memjournal.Journal }

func (refusingComplete) Complete(_ context.Context, key effects.Key, _ string) error {
	return effects.Ambiguous("test.Complete", key, errors.New("reply lost"))
}

func TestNewProducerRefusesBadConfiguration(t *testing.T) {
	c := kafkatest.Start(t)
	cl := c.Client(t)
	for _, tc := range []struct {
		name, option string
		client       *kgo.Client
		topic        string
		opts         []kafka.ProducerOption
	}{
		{"nil client", "client", nil, "t", nil},
		{"empty topic", "topic", cl, "", nil},
		{"zero lease", "WithLease", cl, "t", []kafka.ProducerOption{kafka.WithJournal(memjournal.New(nil), journal.WithLease(0))}},
		{"zero record timeout", "WithRecordTimeout", cl, "t", []kafka.ProducerOption{kafka.WithJournal(memjournal.New(nil), journal.WithRecordTimeout(-time.Second))}},
		{"nil logger", "WithLogger", cl, "t", []kafka.ProducerOption{kafka.WithLogger(nil)}},
	} {
		_, err := kafka.NewProducer(tc.client, tc.topic, tc.opts...)
		var ce *effects.ConfigError
		if !errors.As(err, &ce) || ce.Option != tc.option {
			t.Errorf("%s: %v, want a *ConfigError naming %s", tc.name, err, tc.option)
		}
	}
	if _, err := kafka.NewProducer(cl, "t", nil, kafka.WithJournal(nil, journal.WithLease(time.Second)), nil); err != nil {
		t.Errorf("nil options: %v, want them ignored", err)
	}
}
