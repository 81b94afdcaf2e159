package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
)

// classify maps a failed produce onto the effects classes ([effects.ClassOf]):
//
//   - ambiguous: franz-go's idempotent producer fails a record only when it
//     is safe for its sequence numbers (never sent, or sent and answered),
//     but it cannot rule out that an earlier, unanswered request carrying
//     the record was written, and some answers (REQUEST_TIMED_OUT,
//     NOT_ENOUGH_REPLICAS_AFTER_APPEND) mean "maybe written". Those, and a
//     context or client shutdown that ended the record, are
//     [effects.ErrAmbiguous].
//   - configuration: a topic the cluster does not have (after franz-go's
//     kgo.UnknownTopicRetries) and a refused authorization or
//     authentication are a *[effects.ConfigError] naming the topic or the
//     credentials: no retry fixes them.
//   - transient: a retryable broker error, or a full client buffer, wrote
//     nothing: [effects.ErrTransient].
//   - permanent: every other broker refusal (MESSAGE_TOO_LARGE,
//     INVALID_RECORD, a policy violation) is [effects.ErrRefused]: the same
//     record is refused again.
func classify(op, topic string, key effects.Key, err error) error {
	if cerr := configError(op, topic, err); cerr != nil {
		return cerr
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries),
		errors.Is(err, kgo.ErrClientClosed), errors.Is(err, kgo.ErrAborting),
		errors.Is(err, kerr.RequestTimedOut), errors.Is(err, kerr.NotEnoughReplicasAfterAppend):
		return effects.Ambiguous(op, key, err)
	case errors.Is(err, kgo.ErrMaxBuffered), kerr.IsRetriable(err):
		return effects.Transient(op, key, err)
	}
	return effects.Refused(op, key, err)
}

// configError returns a configuration error for a failure no retry can
// fix (an unknown topic, a refused authorization or authentication), and
// nil otherwise. It unwraps to a *[effects.ConfigError] and to err.
func configError(op, topic string, err error) error {
	var option, reason string
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID),
		errors.Is(err, kerr.InvalidTopicException):
		option, reason = "topic "+topic, "the cluster has no such topic; check its name, or create it"
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		option, reason = "topic "+topic, "not authorized for this topic; check the client's credentials and the topic's ACLs"
	case errors.Is(err, kerr.GroupAuthorizationFailed):
		option, reason = "kgo.ConsumerGroup", "not authorized for this group; check the client's credentials and the group's ACLs"
	case errors.Is(err, kerr.ClusterAuthorizationFailed), errors.Is(err, kerr.TransactionalIDAuthorizationFailed),
		errors.Is(err, kerr.DelegationTokenAuthorizationFailed):
		option, reason = "kgo.SASL", "not authorized by the cluster; check the client's credentials and ACLs"
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.IllegalSaslState),
		errors.Is(err, kerr.UnsupportedSaslMechanism):
		option, reason = "kgo.SASL", "the brokers refused the client's authentication; check the SASL mechanism and credentials"
	default:
		return nil
	}
	return fmt.Errorf("%w (no retry fixes this): %w", &effects.ConfigError{Op: op, Option: option, Reason: reason}, err)
}
