package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
)

// checkTopics asks the cluster, through cl, for the metadata of topics. It
// returns nil when every topic exists and may be read; a configuration
// error naming the first topic the cluster does not have or refuses; and
// an [effects.ErrTransient] error when the brokers could not be reached or
// did not answer (the configuration may be right).
func checkTopics(ctx context.Context, op string, cl *kgo.Client, topics []string) error {
	details, err := kadm.NewClient(cl).ListTopics(ctx, topics...)
	if err != nil {
		if cerr := configError(op, "", err); cerr != nil {
			return cerr
		}
		return effects.Transient(op, "", fmt.Errorf("asking the brokers for the topics' metadata: %w", err))
	}
	for _, t := range slices.Sorted(slices.Values(topics)) {
		d, ok := details[t]
		terr := d.Err
		if !ok {
			terr = kerr.UnknownTopicOrPartition
		}
		if terr == nil {
			continue
		}
		if cerr := configError(op, t, terr); cerr != nil {
			return cerr
		}
		return effects.Transient(op, "", fmt.Errorf("topic %s: %w", t, terr))
	}
	return nil
}

// checkGroup describes group through cl: it returns a configuration error
// when the cluster refuses the client access to it, and nil when the group
// may be used (a group nobody joined yet is fine).
func checkGroup(ctx context.Context, op string, cl *kgo.Client, group string) error {
	groups, err := kadm.NewClient(cl).DescribeGroups(ctx, group)
	if err == nil {
		err = groups[group].Err
	}
	if err == nil || errors.Is(err, kerr.GroupIDNotFound) {
		return nil // a group nobody joined yet
	}
	if cerr := configError(op, "", err); cerr != nil {
		return cerr
	}
	return effects.Transient(op, "", fmt.Errorf("describing group %s: %w", group, err))
}

// Check asks the cluster whether the producer's topic exists and may be
// written (see [effects.Checker]): nil when it does; a configuration error
// (errors.Is [effects.ErrInvalidConfig], naming the topic) for a topic the
// cluster does not have or a refused authorization; [effects.ErrTransient]
// when the brokers cannot be reached before ctx ends. It sends one
// Metadata request and produces nothing.
func (p *Producer) Check(ctx context.Context) error {
	return checkTopics(ctx, "kafka.Producer.Check", p.client, []string{p.topic})
}

var _ effects.Checker = (*Producer)(nil)
