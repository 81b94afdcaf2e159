package kafka_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// conformanceLease is the journal lease in the conformance runs: longer
// than a produce on kfake takes (so clean concurrent attempts never both
// produce), short enough that the fault sweeps, which wait for it after a
// lost journal reply, stay fast.
const conformanceLease = 2 * time.Second

// producerHarness runs the producer against one kfake cluster and topic
// (and, with a journal, one fresh database). Every connection of an
// instance, to Kafka and to the journal's PostgreSQL, goes through the
// suite's Faults, so the sweeps also cut and lose the journal's replies.
type producerHarness struct {
	t       testing.TB
	cluster *kafkatest.Cluster // nil in a successor process (attachProducer)
	brokers []string
	topic   string
	dbURL   string // "" without a journal
	lie     bool   // claim EffectivelyOnce (the counterexample)
}

func newProducerHarness(t testing.TB, journal, lie bool) conformance.Harness[kafka.Message] {
	h := &producerHarness{t: t, lie: lie}
	if kafkatest.Real() {
		h.cluster = kafkatest.Start(t)
	} else {
		h.cluster = kafkatest.StartRestartable(t)
	}
	h.topic = h.cluster.Topic(t, "conformance", 3)
	h.brokers = h.cluster.Brokers()
	if journal {
		h.dbURL = pgtest.DB(t)
		pool, err := pgxpool.New(context.Background(), h.dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if err := postgres.Migrate(context.Background(), pool); err != nil {
			t.Fatal(err)
		}
	}
	if h.cluster.Fake != nil {
		return restartableHarness{h}
	}
	return h
}

func (h *producerHarness) Make(ctx context.Context, f *conformance.Faults) (effects.Effect[kafka.Message], func(), error) {
	// A short metadata minimum age only makes franz-go retry a lost
	// metadata reply sooner (the default 5 s would make the sweeps slow);
	// everything that decides the outcome keeps its default.
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.brokers...), kgo.Dialer(f.DialContext), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		return nil, nil, err
	}
	var (
		opts  []kafka.ProducerOption
		pool  *pgxpool.Pool
		close = cl.Close
	)
	if h.dbURL != "" {
		cfg, err := pgxpool.ParseConfig(h.dbURL)
		if err != nil {
			cl.Close()
			return nil, nil, err
		}
		cfg.ConnConfig.DialFunc = f.DialContext
		if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			cl.Close()
			return nil, nil, err
		}
		j, err := postgres.NewJournal(pool, "kafka-conformance")
		if err != nil {
			cl.Close()
			pool.Close()
			return nil, nil, err
		}
		opts = append(opts, kafka.WithJournal(j, journal.WithLease(conformanceLease)))
		close = func() { cl.Close(); pool.Close() }
	}
	p, err := kafka.NewProducer(cl, h.topic, opts...)
	if err != nil {
		close()
		return nil, nil, err
	}
	if h.lie {
		return claimsEffectivelyOnce{p}, close, nil
	}
	return p, close, nil
}

func (h *producerHarness) Input(key effects.Key, variant int) kafka.Message {
	return kafka.Message{Value: []byte{'v', byte('0' + variant)}}
}

// records reads the topic from the start with a fresh client, under
// read_committed.
func (h *producerHarness) records(ctx context.Context) ([]*kgo.Record, error) {
	return h.cluster.ReadAll(ctx, h.topic)
}

func (h *producerHarness) Count(ctx context.Context, key effects.Key) (int, error) {
	recs, err := h.records(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range recs {
		if v, ok := kafkatest.Header(r, kafka.KeyHeader); ok && v == string(key) {
			n++
		}
	}
	return n, nil
}

func (h *producerHarness) Total(ctx context.Context) (int, error) {
	recs, err := h.records(ctx)
	return len(recs), err
}

// CountBatch reads the topic once and counts the records of every key.
func (h *producerHarness) CountBatch(ctx context.Context, keys []effects.Key) ([]int, error) {
	recs, err := h.records(ctx)
	if err != nil {
		return nil, err
	}
	byKey := map[string]int{}
	for _, r := range recs {
		if v, ok := kafkatest.Header(r, kafka.KeyHeader); ok {
			byKey[v]++
		}
	}
	out := make([]int, len(keys))
	for i, k := range keys {
		out[i] = byKey[string(k)]
	}
	return out, nil
}

// Age makes every journal record d older (its timestamps and its lease):
// the journal is what remembers keys. Without a journal nothing remembers
// them, and Kafka's log holds nothing the producer dedups on, so there is
// nothing to age (retention, which deletes records, is not modelled).
// Pruning is not run.
func (h *producerHarness) Age(ctx context.Context, d time.Duration) error {
	if h.dbURL == "" {
		return nil
	}
	return pgtest.Age(ctx, h.dbURL, d)
}

// producerAttachment is what a successor process needs to reach the
// harness's cluster, topic and journal.
type producerAttachment struct {
	Brokers []string
	Topic   string
	DBURL   string
}

// Attachment is the cluster's brokers, the topic and the journal's
// database, as JSON (conformance.Attacher).
func (h *producerHarness) Attachment() string {
	b, _ := json.Marshal(producerAttachment{h.brokers, h.topic, h.dbURL})
	return string(b)
}

// attachProducer builds the harness in a successor process: it produces
// to the test process's cluster and journal; the test process counts.
func attachProducer(_ context.Context, attachment string) (conformance.Harness[kafka.Message], error) {
	var a producerAttachment
	if err := json.Unmarshal([]byte(attachment), &a); err != nil {
		return nil, err
	}
	return &producerHarness{brokers: a.Brokers, topic: a.Topic, dbURL: a.DBURL}, nil
}

var (
	_ conformance.Attacher     = (*producerHarness)(nil)
	_ conformance.BatchCounter = (*producerHarness)(nil)
	_ conformance.Ager         = (*producerHarness)(nil)
)

// restartableHarness restarts the kfake cluster from its data directory.
type restartableHarness struct{ *producerHarness }

func (h restartableHarness) Restart(context.Context) error { return h.cluster.Restart() }

// claimsEffectivelyOnce is the counterexample: a producer without a
// journal that claims what Kafka's idempotence does not give, effects
// that happen once across redeliveries and producer sessions.
type claimsEffectivelyOnce struct{ *kafka.Producer }

func (claimsEffectivelyOnce) Contract() effects.Contract {
	return effects.Contract{
		Guarantee: effects.EffectivelyOnce,
		Enforcer:  "kafka idempotent producer (claimed, wrongly: it dedups only retries within one session)",
	}
}

// TestConformance runs the suite on the producer with a PostgreSQL journal
// (AtLeastOnce, duplicates only after an unknown outcome) and without one
// (AtLeastOnce, any redelivery), against kfake.
func TestConformance(t *testing.T) {
	t.Run("journal", func(t *testing.T) {
		rep := conformance.Run(t, "kafka.Producer+postgres.Journal",
			func(t testing.TB) conformance.Harness[kafka.Message] { return newProducerHarness(t, true, false) },
			conformance.WithRetryFor(4*conformanceLease+10*time.Second), conformance.WithSuccessorProcess(attachProducer),
			conformance.WithCapacity(1000), // as email's: postgres.Journal keeps the keys
			conformance.WithSlowReply(300*time.Millisecond), allowKfake(true))
		c := rep.Contract
		if c.Guarantee != effects.AtLeastOnce || c.DuplicateWindow.Trigger != effects.AfterUnknownOutcome || !c.DetectsKeyReuse {
			t.Errorf("contract %s, want at-least-once after an unknown outcome, detecting key reuse", c)
		}
		requireAllRan(t, rep)
	})
	t.Run("no journal", func(t *testing.T) {
		rep := conformance.Run(t, "kafka.Producer",
			func(t testing.TB) conformance.Harness[kafka.Message] { return newProducerHarness(t, false, false) },
			conformance.WithSuccessorProcess(attachProducer), conformance.WithSlowReply(300*time.Millisecond), allowKfake(false))
		if tr := rep.Contract.DuplicateWindow.Trigger; tr != effects.AnyRedelivery {
			t.Errorf("trigger %s, want any redelivery", tr)
		}
	})
}

// allowKfake names what the producer's harness does not verify, and why:
// kfake is a cluster in the test's memory, with nothing a crash would
// lose that its restart keeps (no CrashRestarter), and a real cluster
// (KAFKA_BROKERS) is not the test's to restart; with the journal,
// postgres.Journal keeps keys in a table nothing evicts from but Prune,
// so 1,000 keys show what 5,000 would. The slow replies are held 300 ms,
// under franz-go's request timeouts: the producer waits for them.
func allowKfake(journaled bool) conformance.EffectOption {
	left := []string{conformance.ScenarioCrashRestart}
	if journaled {
		left = append(left, conformance.ScenarioKeyCapacity)
	}
	if kafkatest.Real() {
		left = append(left, conformance.ScenarioRestart)
	}
	return conformance.AllowUnverified("kfake is a cluster in the test's memory, with nothing a crash loses that a restart keeps, and a real "+
		"cluster is not the test's to restart; postgres.Journal evicts no key, so 1,000 keys show what 5,000 would; "+
		"neither kfake nor PostgreSQL can be made to answer an application error on demand", append(left, conformance.ScenarioAppFaults)...)
}

func requireAllRan(t *testing.T, rep conformance.Report) {
	t.Helper()
	for _, row := range rep.Rows {
		// No CrashRestarter: kfake lives in the test's memory; no
		// application faults (see AllowUnverified); key-scope and key-bytes
		// do not apply to this harness.
		if row.Verdict == conformance.NotRun && !row.NotApplicable && !(row.Scenario == conformance.ScenarioRestart && kafkatest.Real()) &&
			row.Scenario != conformance.ScenarioCrashRestart && row.Scenario != conformance.ScenarioAppFaults {
			t.Errorf("%s: not run: %v", row.Scenario, row.Notes)
		}
	}
}

// TestConformanceCounterexample: the producer without a journal, claiming
// EffectivelyOnce, must fail the suite, and in the scenarios that repeat
// an Apply: redelivery, concurrent duplicates, key reuse, the replay storm
// and the backend restart.
func TestConformanceCounterexample(t *testing.T) {
	rep := conformance.Run(t, "counterexample: kafka.Producer without journal claiming effectively-once",
		func(t testing.TB) conformance.Harness[kafka.Message] { return newProducerHarness(t, false, true) },
		conformance.WithLateRedelivery(time.Second), conformance.WithCapacity(1000), conformance.ReportOnly()) // caught long before 5,000 keys
	failed := map[string]bool{}
	for _, s := range rep.Failed() {
		failed[s] = true
	}
	must := []string{conformance.ScenarioRedelivery, conformance.ScenarioLateRedelivery, conformance.ScenarioHorizon,
		conformance.ScenarioConcurrent, conformance.ScenarioKeyReuse, conformance.ScenarioDistinctKeys, conformance.ScenarioStorm}
	if !kafkatest.Real() {
		must = append(must, conformance.ScenarioRestart)
	}
	for _, s := range must {
		if !failed[s] {
			t.Errorf("scenario %s did not catch the lying producer", s)
		}
	}
	if failed[conformance.ScenarioInvalidKey] {
		t.Errorf("invalid-keys failed: the producer validates keys before any I/O")
	}
	t.Logf("scenarios that caught the counterexample: %v", rep.Failed())
}
