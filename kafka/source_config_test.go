package kafka_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// TestNewSourceValidates: bad options and a missing group are a
// *effects.ConfigError naming the option; nil options are ignored.
func TestNewSourceValidates(t *testing.T) {
	c := kafkatest.Start(t)
	group := c.Opts(kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"))
	for _, tc := range []struct {
		name   string
		client []kgo.Opt
		opts   []kafka.SourceOption
		option string
	}{
		{"no group", c.Opts(kgo.ConsumeTopics("t")), nil, "clientOpts"},
		{"no topics", c.Opts(kgo.ConsumerGroup("g")), nil, "clientOpts"},
		{"nil client options", nil, nil, "clientOpts"},
		{"empty id header", group, []kafka.SourceOption{kafka.WithIDHeader("")}, "WithIDHeader"},
		{"max poll 0", group, []kafka.SourceOption{kafka.WithMaxPoll(0)}, "WithMaxPoll"},
		{"nil logger", group, []kafka.SourceOption{kafka.WithLogger(nil)}, "WithLogger"},
		{"per partition 0", group, []kafka.SourceOption{kafka.WithMaxPendingPerPartition(0)}, "WithMaxPendingPerPartition"},
		{"negative interval", group, []kafka.SourceOption{kafka.WithCommitInterval(-time.Millisecond)}, "WithCommitInterval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := kafka.NewSource(tc.client, tc.opts...)
			var ce *effects.ConfigError
			if !errors.As(err, &ce) || ce.Option != tc.option || !errors.Is(err, effects.ErrInvalidConfig) {
				t.Fatalf("NewSource = %v, %v; want a ConfigError for %s", s, err, tc.option)
			}
			if tc.option == "clientOpts" && !strings.Contains(ce.Reason, "kgo.Consume") {
				t.Errorf("NewSource = %v; want it to name the missing kgo option", err)
			}
		})
	}
	s, err := kafka.NewSource(group, nil, kafka.WithCommitInterval(0))
	if err != nil {
		t.Fatalf("nil option and a zero interval: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(context.Background()); !errors.Is(err, kafka.ErrSourceClosed) {
		t.Errorf("Next after Close = %v, want ErrSourceClosed", err)
	}
	if err := s.Flush(context.Background()); !errors.Is(err, kafka.ErrSourceClosed) {
		t.Errorf("Flush after Close = %v, want ErrSourceClosed", err)
	}
}

// TestTransformValidates: Transform refuses a bad size or a missing
// argument with a *effects.ConfigError before any I/O.
func TestTransformValidates(t *testing.T) {
	fn := func(context.Context, *kgo.Record) ([]*kgo.Record, error) { return nil, nil }
	sess, err := kgo.NewGroupTransactSession(kgo.SeedBrokers("127.0.0.1:1"), kgo.TransactionalID("x"),
		kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	for _, tc := range []struct {
		name   string
		sess   *kgo.GroupTransactSession
		fn     func(context.Context, *kgo.Record) ([]*kgo.Record, error)
		opts   []kafka.TransformOption
		option string
	}{
		{"nil session", nil, fn, nil, "sess"},
		{"nil fn", sess, nil, nil, "fn"},
		{"size 0", sess, fn, []kafka.TransformOption{nil, kafka.WithTransactionSize(0)}, "WithTransactionSize"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := kafka.Transform(context.Background(), tc.sess, tc.fn, tc.opts...)
			var ce *effects.ConfigError
			if !errors.As(err, &ce) || ce.Option != tc.option {
				t.Fatalf("Transform = %v, want a ConfigError for %s", err, tc.option)
			}
		})
	}
}

// TestSourceUnknownTopic: a misspelled topic is a configuration error
// naming it, from Check before the first delivery and from Next once
// fetching started, so a consumer stops instead of idling; the topics
// that exist pass Check.
func TestSourceUnknownTopic(t *testing.T) {
	c := kafkatest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := c.Topic(t, "exists", 1)

	good, err := kafka.NewSource(c.Opts(kgo.ConsumerGroup("g-good"), kgo.ConsumeTopics(topic)))
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	if err := good.Check(ctx); err != nil {
		t.Errorf("Check with existing topics: %v", err)
	}

	var reported []error
	s, err := kafka.NewSource(c.Opts(kgo.ConsumerGroup("g-typo"), kgo.ConsumeTopics(topic, "paymnets")),
		kafka.WithObserver(effects.ObserverFunc(func(_ context.Context, ev effects.Event) { reported = append(reported, ev.Err) })))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	wantTopic := func(what string, err error) {
		t.Helper()
		var ce *effects.ConfigError
		if effects.ClassOf(err) != effects.InvalidConfig || !errors.As(err, &ce) || !strings.Contains(ce.Option, "paymnets") {
			t.Errorf("%s = %v; want a configuration error naming topic paymnets", what, err)
		}
	}
	wantTopic("Check", s.Check(ctx))
	_, err = s.Next(ctx)
	wantTopic("Next", err)
	_, err = s.Next(ctx)
	wantTopic("Next again", err)
	if len(reported) == 0 {
		t.Error("the unknown topic was not reported to the observer")
	}
}
