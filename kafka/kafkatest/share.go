package kafkatest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ShareBrokerConfigs returns the kfake broker configs of a cluster for
// share-group tests: a share acquisition lock of lock (kfake reads it from
// the broker config group.share.record.lock.duration.ms, Kafka from the
// group config share.record.lock.duration.ms), expired locks swept every
// 100 ms, members heartbeating every 100 ms and evicted after 3 s, and
// deliveryLimit deliveries before a record is archived (0: Kafka's
// default, 5). Pass it to [Start] or [New].
func ShareBrokerConfigs(lock time.Duration, deliveryLimit int) kfake.Opt {
	cfg := map[string]string{
		"group.share.record.lock.duration.ms": strconv.FormatInt(lock.Milliseconds(), 10),
		"share.record.lock.sweep.interval.ms": "100",
		"group.share.heartbeat.interval.ms":   "100",
		"group.share.session.timeout.ms":      "3000",
	}
	if deliveryLimit > 0 {
		cfg["group.share.delivery.count.limit"] = strconv.Itoa(deliveryLimit)
	}
	return kfake.BrokerConfigs(cfg)
}

// ShareFromEarliest sets the share group's share.auto.offset.reset to
// "earliest", so that records produced before the group first consumed are
// delivered (the default, "latest", skips them). Call it before any member
// joins.
func (c *Cluster) ShareFromEarliest(t testing.TB, group string) {
	t.Helper()
	if err := c.SetShareFromEarliest(context.Background(), group); err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
}

// SetShareFromEarliest is [Cluster.ShareFromEarliest] without a
// testing.TB.
func (c *Cluster) SetShareFromEarliest(ctx context.Context, group string) error {
	cl, err := kgo.NewClient(c.Opts()...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	cfg.Name = "share.auto.offset.reset"
	v := "earliest"
	cfg.Value = &v
	res.Configs = append(res.Configs, cfg)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("setting share.auto.offset.reset of %s: %w", group, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return fmt.Errorf("setting share.auto.offset.reset of %s: %w", group, err)
		}
	}
	return nil
}
