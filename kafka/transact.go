package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
)

// defaultTransactionSize is how many input records one [Transform]
// transaction consumes at most, unless [WithTransactionSize] says otherwise.
const defaultTransactionSize = 1000

type transformConfig struct {
	maxRecords int
}

// WithTransactionSize bounds how many input records one transaction
// consumes (default 1000). Smaller transactions commit sooner and redo less
// after an abort; each costs a few round trips to the transaction
// coordinator. n must be at least 1.
func WithTransactionSize(n int) TransformOption {
	return transformOpt(func(c *transformConfig) { c.maxRecords = n })
}

// TransformStats counts what one call to [Transform] committed.
type TransformStats struct {
	// Transactions is the number of committed transactions.
	Transactions int
	// Records and Outputs count the input records consumed and the output
	// records produced in committed transactions.
	Records, Outputs int
	// Aborted is the number of transactions aborted because the group
	// rebalanced (or the commit failed abortably); their inputs are
	// consumed again.
	Aborted int
}

// Transform runs consume-transform-produce over sess until ctx is done:
// each poll's records are transformed by fn, and the outputs and the
// input offsets are committed in one Kafka transaction. fn maps one input
// record to the records to produce for it (none, one or many; without a
// Topic they go to the client's kgo.DefaultProduceTopic). It runs inside
// the transaction, so it must not have effects outside Kafka: they would
// not roll back with the transaction and would repeat when the input is
// processed again. Inside Kafka this
// is effectively once: the output of every input record becomes visible
// exactly once to readers that use
// kgo.FetchIsolationLevel(kgo.ReadCommitted()) (the default,
// read_uncommitted, also sees records of aborted transactions, so a reader
// with the default sees duplicates). The session should consume with
// read_committed too, if its input is itself transactional.
//
// If the group rebalances before a transaction ends, the session aborts it
// (kgo.GroupTransactSession's rule), the inputs are consumed again (here
// or by the partition's new owner), and Transform goes on. If fn returns
// an error, the transaction is aborted and Transform returns the error
// wrapped: the polled records are not committed, and the next Transform
// (in this process or another member) consumes them again. A produce
// failure aborts and returns too.
//
// Transform returns nil when ctx is done between transactions, and does
// not close sess. A nil sess or fn, or an invalid option, is a
// *[effects.ConfigError], returned before any I/O. It must be the only user of sess while it runs.
func Transform(ctx context.Context, sess *kgo.GroupTransactSession, fn func(ctx context.Context, in *kgo.Record) ([]*kgo.Record, error), opts ...TransformOption) (TransformStats, error) {
	cfg := transformConfig{maxRecords: defaultTransactionSize}
	for _, o := range opts {
		if o != nil {
			o.applyTransform(&cfg)
		}
	}
	var st TransformStats
	switch {
	case sess == nil:
		return st, &effects.ConfigError{Op: "kafka.Transform", Option: "sess", Reason: "nil session"}
	case fn == nil:
		return st, &effects.ConfigError{Op: "kafka.Transform", Option: "fn", Reason: "nil transform function"}
	case cfg.maxRecords < 1:
		return st, &effects.ConfigError{Op: "kafka.Transform", Option: "WithTransactionSize",
			Reason: fmt.Sprintf("%d records; need at least 1", cfg.maxRecords)}
	}
	for {
		fs := sess.PollRecords(ctx, cfg.maxRecords)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return st, nil
		}
		var in []*kgo.Record
		fs.EachRecord(func(r *kgo.Record) { in = append(in, r) })
		if len(in) == 0 {
			continue
		}
		committed, outs, err := transactOnce(ctx, sess, in, fn)
		if err != nil {
			return st, err
		}
		if committed {
			st.Transactions++
			st.Records += len(in)
			st.Outputs += outs
		} else {
			st.Aborted++
		}
	}
}

// transactOnce runs one transaction over in.
func transactOnce(ctx context.Context, sess *kgo.GroupTransactSession, in []*kgo.Record, fn func(context.Context, *kgo.Record) ([]*kgo.Record, error)) (committed bool, outputs int, err error) {
	if err := sess.Begin(); err != nil {
		return false, 0, fmt.Errorf("kafka.Transform: begin: %w", err)
	}
	var (
		mu      sync.Mutex
		produce error
	)
	promise := func(_ *kgo.Record, err error) {
		if err != nil {
			mu.Lock()
			produce = errors.Join(produce, err)
			mu.Unlock()
		}
	}
	var fnErr error
	for _, r := range in {
		outs, err := fn(ctx, r)
		if err != nil {
			fnErr = fmt.Errorf("kafka.Transform: %s/%d/%d: %w", r.Topic, r.Partition, r.Offset, err)
			break
		}
		for _, o := range outs {
			sess.Produce(ctx, o, promise)
			outputs++
		}
	}
	try := kgo.TryCommit
	if fnErr != nil {
		try = kgo.TryAbort
	}
	// End flushes (or aborts) the produced records, so every promise has
	// run when it returns.
	committed, endErr := sess.End(ctx, try)
	mu.Lock()
	perr := produce
	mu.Unlock()
	switch {
	case fnErr != nil:
		return false, 0, errors.Join(fnErr, endErr)
	case endErr != nil:
		return false, 0, fmt.Errorf("kafka.Transform: ending the transaction: %w", errors.Join(endErr, perr))
	case perr != nil && committed:
		// Cannot happen: a failed record makes End abort.
		return false, 0, fmt.Errorf("kafka.Transform: a record failed in a committed transaction: %w", perr)
	case perr != nil:
		return false, 0, fmt.Errorf("kafka.Transform: producing: %w", perr)
	}
	if !committed {
		return false, 0, nil
	}
	return true, outputs, nil
}
