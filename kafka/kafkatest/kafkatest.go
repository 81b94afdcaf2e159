// Package kafkatest gives tests a Kafka cluster: an in-process kfake
// cluster (github.com/twmb/franz-go/pkg/kfake, which speaks the Kafka
// protocol on 127.0.0.1 ports, with transactions, consumer groups and share
// groups) by default, or the real cluster named by the KAFKA_BROKERS
// environment variable (comma-separated host:port list). kfake runs inside
// the test process: there is no binary to install and nothing to download
// at run time.
//
//	c := kafkatest.Start(t)            // closed when t ends
//	topic := c.Topic(t, "payments", 3) // a fresh, uniquely named topic
//	client := c.Client(t, kgo.DefaultProduceTopic(topic))
//	recs, err := c.ReadAll(ctx, topic) // what a read_committed reader sees
//
// Every helper that takes a testing.TB cleans up with t.Cleanup: clusters
// and clients are closed when the test ends, so goleak finds nothing left
// behind. [New] is for code without a testing.TB (TestMain, examples, a
// demo); its caller closes the cluster.
//
// Against a real cluster ([Real]), topics get unique names and are not
// deleted, so use a scratch cluster; kfake's fault injection
// ([Cluster.RequireFake]) and restarts ([StartRestartable]) are not
// available, and the tests that need them skip with the reason.
//
// When not to use it: kfake is a faithful protocol implementation, not
// Kafka; for broker behaviour under real disks, replication and leader
// elections, run the tests against a real cluster with KAFKA_BROKERS.
package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// brokersEnv names the environment variable that points tests at a real
// cluster instead of kfake.
const brokersEnv = "KAFKA_BROKERS"

// Cluster is a Kafka cluster for one test or harness.
type Cluster struct {
	// Fake is the kfake cluster, for fault injection (ControlKey,
	// KeepControl, Fault); nil when KAFKA_BROKERS names a real cluster.
	Fake    *kfake.Cluster
	brokers []string

	opts    []kfake.Opt // to restart with
	dataDir string
}

// Real reports whether KAFKA_BROKERS is set.
func Real() bool { return len(realBrokers()) > 0 }

// realBrokers returns the brokers KAFKA_BROKERS lists, spaces trimmed and
// empty entries dropped.
func realBrokers() []string {
	var out []string
	for _, b := range strings.Split(os.Getenv(brokersEnv), ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// Start is [New] for tests: it returns a cluster for t, closed when t
// ends, and fails t if kfake cannot start.
func Start(t testing.TB, opts ...kfake.Opt) *Cluster {
	t.Helper()
	c, err := New(opts...)
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// New starts a single-broker kfake cluster on a free 127.0.0.1 port, with
// three partitions per topic by default and a 100ms minimum group session
// timeout; opts are extra kfake options. When KAFKA_BROKERS is set it
// returns the real cluster it names instead, and ignores opts. The caller
// closes the cluster.
func New(opts ...kfake.Opt) (*Cluster, error) {
	if brokers := realBrokers(); len(brokers) > 0 {
		return &Cluster{brokers: brokers}, nil
	}
	all := append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.DefaultNumPartitions(3),
		kfake.GroupMinSessionTimeout(100 * time.Millisecond),
	}, opts...)
	fake, err := kfake.NewCluster(all...)
	if err != nil {
		return nil, fmt.Errorf("starting kfake: %w", err)
	}
	return &Cluster{Fake: fake, brokers: fake.ListenAddrs(), opts: all}, nil
}

// StartRestartable is [Start] for a kfake cluster that keeps its data in
// t's temporary directory, so that [Cluster.Restart] brings it back with
// its topics, records, groups and producer state. When KAFKA_BROKERS is
// set it skips t, naming the variable: a test cannot restart a real
// cluster.
func StartRestartable(t testing.TB, opts ...kfake.Opt) *Cluster {
	t.Helper()
	if Real() {
		t.Skip("cannot restart the real cluster named by " + brokersEnv)
	}
	dir := t.TempDir()
	c, err := New(append([]kfake.Opt{kfake.DataDir(dir)}, opts...)...)
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	c.dataDir = dir
	t.Cleanup(c.Close)
	return c
}

// Restart stops the kfake cluster (it saves its state) and starts it
// again on the same port from its data directory; clients reconnect.
func (c *Cluster) Restart() error {
	if c.Fake == nil || c.dataDir == "" {
		return errors.New("kafkatest: only a cluster from StartRestartable can restart")
	}
	_, port, err := net.SplitHostPort(c.brokers[0])
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return err
	}
	c.Fake.Close()
	var fake *kfake.Cluster
	for try := 0; ; try++ {
		fake, err = kfake.NewCluster(append(append([]kfake.Opt(nil), c.opts...), kfake.Ports(p))...)
		if err == nil || try == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond) // the port may take a moment to free
	}
	if err != nil {
		return fmt.Errorf("kafkatest: restarting kfake: %w", err)
	}
	c.Fake = fake
	return nil
}

// Close closes a kfake cluster; it does nothing for a real one.
func (c *Cluster) Close() {
	if c.Fake != nil {
		c.Fake.Close()
	}
}

// Brokers returns the seed brokers.
func (c *Cluster) Brokers() []string { return c.brokers }

// RequireFake returns the kfake cluster, or skips t on a real cluster:
// broker fault injection needs kfake.
func (c *Cluster) RequireFake(t testing.TB) *kfake.Cluster {
	t.Helper()
	if c.Fake == nil {
		t.Skip("needs kfake's fault injection; KAFKA_BROKERS names a real cluster")
	}
	return c.Fake
}

// Opts returns the client options that reach the cluster, plus extra.
func (c *Cluster) Opts(extra ...kgo.Opt) []kgo.Opt {
	return append([]kgo.Opt{kgo.SeedBrokers(c.brokers...)}, extra...)
}

// Client returns a new client for the cluster, closed when t ends.
func (c *Cluster) Client(t testing.TB, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(c.Opts(extra...)...)
	if err != nil {
		t.Fatalf("kafkatest: new client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// Topic creates a topic with a unique name starting with prefix and the
// given number of partitions, and returns its name.
func (c *Cluster) Topic(t testing.TB, prefix string, partitions int32) string {
	t.Helper()
	name, err := c.CreateTopic(context.Background(), prefix, partitions)
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	return name
}

// CreateTopic creates a topic with a unique name starting with prefix.
func (c *Cluster) CreateTopic(ctx context.Context, prefix string, partitions int32) (string, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := prefix + "-" + hex.EncodeToString(b[:])
	cl, err := kgo.NewClient(c.Opts()...)
	if err != nil {
		return "", err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, -1, nil, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return "", fmt.Errorf("creating topic %s: %w", name, err)
	}
	return name, nil
}

// ReadAll reads every record of topic that a read_committed consumer sees,
// from the start of each partition up to its last stable offset at the
// time of the call, with a fresh client. Control records (transaction
// markers) are left out.
func (c *Cluster) ReadAll(ctx context.Context, topic string) ([]*kgo.Record, error) {
	opts := c.Opts()
	adm, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer adm.Close()
	ends, err := kadm.NewClient(adm).ListCommittedOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("listing end offsets of %s: %w", topic, err)
	}
	if err := ends.Error(); err != nil {
		return nil, fmt.Errorf("listing end offsets of %s: %w", topic, err)
	}
	left := map[int32]int64{} // partition -> end offset still to reach
	starts := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
			starts[o.Partition] = kgo.NewOffset().AtStart()
		}
	})
	if len(left) == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), opts...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: starts}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []*kgo.Record
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("reading %s: %w (still to read: %v)", topic, err, left)
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = errors.Join(ferr, err) })
		if ferr != nil {
			return nil, fmt.Errorf("reading %s: %w", topic, ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			end, ok := left[r.Partition]
			if !ok || r.Offset >= end {
				return
			}
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
			if r.Offset+1 >= end {
				delete(left, r.Partition)
			}
		})
	}
	return out, nil
}

// Header returns the value of the first header named name, and whether
// there was one.
func Header(r *kgo.Record, name string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

// GroupOpts returns consumer-group options for tests: join group, consume
// topic, and heartbeat and session timeouts short enough that a member
// leaving or joining rebalances within seconds.
//
// The rebalance timeout (2 s) is below the session timeout (3 s), as it
// should be on kfake: kfake does not refresh a member's session while the
// member's JoinGroup is parked waiting for the others, and it restarts the
// rebalance timer on every join or session expiry, so with a longer
// rebalance timeout a member parked behind a slow one could expire
// although it is alive, and the group churn. (Kafka refreshes the session
// of a member whose join is in flight.)
func GroupOpts(group, topic string) []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.SessionTimeout(3 * time.Second),
		kgo.RebalanceTimeout(2 * time.Second),
	}
}

// SetTopicConfig sets the topic-level config name of topic to value (for
// instance "max.message.bytes"), failing t if the cluster refuses.
func (c *Cluster) SetTopicConfig(t testing.TB, topic, name, value string) {
	t.Helper()
	cl, err := kgo.NewClient(c.Opts()...)
	if err != nil {
		t.Fatalf("kafkatest: new client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resps, err := kadm.NewClient(cl).AlterTopicConfigs(ctx,
		[]kadm.AlterConfig{{Op: kadm.SetConfig, Name: name, Value: &value}}, topic)
	if err == nil {
		for _, r := range resps {
			err = errors.Join(err, r.Err)
		}
	}
	if err != nil {
		t.Fatalf("kafkatest: setting %s=%s on topic %s: %v", name, value, topic, err)
	}
}

// WaitConsumed waits until consumer group group has committed, on every
// partition of topic, an offset at the partition's end (its last stable
// offset, read again at each check), that is until the group consumed the
// topic to its end. It checks every 50 ms; it returns ctx's error, with
// the end offsets and commits it last saw, when ctx is done first, and
// any other error at once. A group that does not exist yet has committed
// nothing.
func (c *Cluster) WaitConsumed(ctx context.Context, group, topic string) error {
	cl, err := kgo.NewClient(c.Opts()...)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		behind, err := consumedBehind(ctx, adm, group, topic)
		if err != nil && ctx.Err() == nil {
			return err
		}
		if err == nil && len(behind) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkatest: group %s has not consumed %s to its end (partition: [committed, end) %v): %w", group, topic, behind, ctx.Err())
		case <-tick.C:
		}
	}
}

// consumedBehind returns, per partition of topic that group has not
// consumed to its end, the committed offset and the end.
func consumedBehind(ctx context.Context, adm *kadm.Client, group, topic string) (map[int32][2]int64, error) {
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("kafkatest: listing end offsets of %s: %w", topic, err)
	}
	commits, err := adm.FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		commits, err = kadm.OffsetResponses{}, nil
	}
	if err == nil {
		err = commits.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("kafkatest: fetching the offsets of group %s: %w", group, err)
	}
	behind := map[int32][2]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		at := int64(-1)
		if c, ok := commits.Lookup(o.Topic, o.Partition); ok {
			at = c.At
		}
		if o.Offset > 0 && at < o.Offset {
			behind[o.Partition] = [2]int64{at, o.Offset}
		}
	})
	return behind, nil
}
