package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
)

// classify maps a failed produce onto the effects error kinds.
//
// franz-go's idempotent producer fails a record only when it is safe for
// its sequence numbers: never sent, or sent and answered. It still cannot
// rule out that an earlier, unanswered request carrying the record was
// written, and some answers (REQUEST_TIMED_OUT,
// NOT_ENOUGH_REPLICAS_AFTER_APPEND) mean "maybe written". Those outcomes,
// and a context or client shutdown that ended the record, are ambiguous.
// A retryable broker error is transient. Anything else (unknown topic,
// record too large, authorization) is permanent and not retried.
func classify(op string, key effects.Key, err error) error {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries),
		errors.Is(err, kgo.ErrClientClosed), errors.Is(err, kgo.ErrAborting),
		errors.Is(err, kerr.RequestTimedOut), errors.Is(err, kerr.NotEnoughReplicasAfterAppend):
		return effects.Ambiguous(op, key, err)
	case errors.Is(err, kgo.ErrMaxBuffered), kerr.IsRetriable(err):
		return effects.Transient(op, key, err)
	}
	return fmt.Errorf("%s key %q: %w (permanent: fix the cause before retrying)", op, string(key), err)
}
