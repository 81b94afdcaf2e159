package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/kafka"
	"effectively.dev/postgres"
)

// Variant names.
const (
	libDefaults = "defaults"
	pipelined   = "pipelined"
	libBatch    = "batch"
	consumerSQL = "consumer-sql"
	handWritten = "hand-written"
	// control is hand-written again, the same code under another name:
	// its ratio to hand-written is the run's noise.
	control = "control"
	floor   = "floor"
	// noGroup is defaults with postgres.WithoutGroupCommit: every Apply
	// in a transaction of its own. Not in the default set.
	noGroup = "defaults-nogroup"
	// fetchWait100 is consumer-sql with the Source's fetch wait at 100 ms
	// instead of the Source's default (500 ms): a resumed partition
	// waits for the fetch in flight. Run it with -variants to compare the
	// two in one run. Not in the default set.
	fetchWait100 = "consumer-sql-wait100"
)

// variants runs one variant until ctx is done (it returns nil) or it
// fails.
var variants = map[string]func(ctx context.Context, r *runEnv) error{
	libDefaults: func(ctx context.Context, r *runEnv) error { return runDefaults(ctx, r) },
	pipelined:   runPipelined,
	libBatch:    runBatch,
	consumerSQL: runConsumerSQL,
	fetchWait100: func(ctx context.Context, r *runEnv) error {
		return runDefaultConsumer(ctx, r, func(ctx context.Context, d effects.Delivery) error {
			return r.essayTx(ctx, d.Body)
		}, kgo.FetchMaxWait(100*time.Millisecond))
	},
	handWritten: func(ctx context.Context, r *runEnv) error { return runByHand(ctx, r, r.essayHandler) },
	control:     func(ctx context.Context, r *runEnv) error { return runByHand(ctx, r, r.essayHandler) },
	noGroup:     func(ctx context.Context, r *runEnv) error { return runDefaults(ctx, r, postgres.WithoutGroupCommit()) },
	floor:       func(ctx context.Context, r *runEnv) error { return runByHand(ctx, r, r.plainInsert) },
}

var describe = map[string]string{
	libDefaults:  "kafka.NewSource → consume.New (WithoutDeadLetter only) → postgres.New(...).Apply, ledger INSERT … RETURNING id as the ref",
	noGroup:      "defaults with postgres.WithoutGroupCommit: every Apply in a transaction of its own",
	control:      "hand-written again, the same code: its ratio to hand-written is the noise of the run",
	pipelined:    "defaults with postgres.NewPipelined: the ledger INSERT as a statement, sent with the key's row and COMMIT (the event's id as the ref)",
	libBatch:     "kafka.NewSource → consume.New(WithBatch) → postgres.ApplyBatch + BatchErrors",
	consumerSQL:  "kafka.NewSource → consume.New (WithoutDeadLetter only) → the hand-written handler's transaction: the library's consumer alone",
	fetchWait100: "consumer-sql with kgo.FetchMaxWait(100ms) instead of the Source's default 500 ms",
	handWritten:  "franz-go + pgx: per poll, partitions in parallel; per record BEGIN; claim ON CONFLICT DO NOTHING; INSERT; COMMIT; offsets committed after each poll",
	floor:        "the same loop with one autocommitted ledger INSERT and no dedup",
}

func variantNames() []string {
	return []string{libDefaults, pipelined, libBatch, consumerSQL, handWritten, control, floor}
}

// allVariantNames adds the variants that run only when named.
func allVariantNames() []string { return append(variantNames(), fetchWait100, noGroup) }

// variantTag makes a name usable in table and topic names.
func variantTag(name string) string { return strings.ReplaceAll(name, "-", "") }

const insertLedger = `INSERT INTO %s (event_id, account, cents) VALUES ($1, $2, $3)`

// runDefaults is the README's path with every default (and opts).
func runDefaults(ctx context.Context, r *runEnv, opts ...postgres.EffectOption) error {
	ledger, err := postgres.New(r.pool, r.scope, func(ctx context.Context, tx pgx.Tx, ev event) (string, error) {
		var id string
		err := tx.QueryRow(ctx, fmt.Sprintf(insertLedger, r.ledger)+` RETURNING id::text`, ev.ID, ev.Account, ev.Cents).Scan(&id)
		return id, err
	}, opts...)
	if err != nil {
		return err
	}
	return runEffect(ctx, r, ledger)
}

// runPipelined is runDefaults with postgres.NewPipelined: the ledger
// INSERT goes as a statement with the key's row and COMMIT, and the
// event's id is the ref.
func runPipelined(ctx context.Context, r *runEnv) error {
	write := fmt.Sprintf(insertLedger, r.ledger)
	ledger, err := postgres.NewPipelined(r.pool, r.scope, func(_ context.Context, _ effects.Key, ev event) (string, []postgres.Statement, error) {
		return ev.ID, []postgres.Statement{{SQL: write, Args: []any{ev.ID, ev.Account, ev.Cents}}}, nil
	})
	if err != nil {
		return err
	}
	return runEffect(ctx, r, ledger)
}

// runEffect applies ledger to every event, behind the default Source and
// Consumer.
func runEffect(ctx context.Context, r *runEnv, ledger effects.Effect[event]) error {
	return runDefaultConsumer(ctx, r, func(ctx context.Context, d effects.Delivery) error {
		var ev event
		if err := json.Unmarshal(d.Body, &ev); err != nil {
			return fmt.Errorf("%w: %w", effects.ErrPoison, err)
		}
		key, err := effects.NewKey(r.scope, d.ID, "ledger")
		if err != nil {
			return err
		}
		_, err = ledger.Apply(ctx, key, ev)
		return err
	})
}

// runDefaultConsumer runs handle behind kafka.NewSource and
// consume.New, both with their defaults (the client's with extra
// options after them), and counts its successes.
func runDefaultConsumer(ctx context.Context, r *runEnv, handle consume.Handler, extra ...kgo.Opt) error {
	src, err := kafka.NewSource(append(r.groupOpts(), extra...))
	if err != nil {
		return err
	}
	defer src.Close()
	c, err := consume.New(src, func(ctx context.Context, d effects.Delivery) error {
		if err := handle(ctx, d); err != nil {
			return err
		}
		r.progress.handled(1)
		return nil
	}, consume.WithoutDeadLetter()) // as the hand-written handler: nothing is moved aside
	if err != nil {
		return err
	}
	return runConsumer(ctx, c, src)
}

// runConsumerSQL runs the hand-written handler's transaction behind the
// library's Source and Consumer: the consumer's cost (or gain) alone.
func runConsumerSQL(ctx context.Context, r *runEnv) error {
	return runDefaultConsumer(ctx, r, func(ctx context.Context, d effects.Delivery) error {
		return r.essayTx(ctx, d.Body)
	})
}

// runBatch is the batch path on the same partition-ordered Source.
func runBatch(ctx context.Context, r *runEnv) error {
	src, err := kafka.NewSource(r.groupOpts())
	if err != nil {
		return err
	}
	defer src.Close()
	write := fmt.Sprintf(insertLedger, r.ledger)
	c, err := consume.New(src, nil, consume.WithBatch(r.cfg.batch, r.cfg.linger,
		func(ctx context.Context, ds []effects.Delivery) []error {
			evs := make([]event, len(ds))
			items := make([]postgres.BatchItem, len(ds))
			for i, d := range ds {
				if err := json.Unmarshal(d.Body, &evs[i]); err != nil {
					return repeat(fmt.Errorf("%w: %w", effects.ErrPoison, err), len(ds))
				}
				key, err := effects.NewKey(r.scope, d.ID, "ledger")
				if err != nil {
					return repeat(err, len(ds))
				}
				items[i] = postgres.BatchItem{Key: key, Fingerprint: d.Body}
			}
			res, err := postgres.ApplyBatch(ctx, r.pool, r.scope, items, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
				_, err := tx.Exec(ctx, write, evs[i].ID, evs[i].Account, evs[i].Cents)
				return "", err
			})
			errs := postgres.BatchErrors(len(ds), res, err)
			ok := 0
			for _, e := range errs {
				if e == nil {
					ok++
				}
			}
			r.progress.handled(ok)
			return errs
		}), consume.WithoutDeadLetter())
	if err != nil {
		return err
	}
	return runConsumer(ctx, c, src)
}

func repeat(err error, n int) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// runConsumer runs c until ctx is done, then closes src (which commits).
func runConsumer(ctx context.Context, c *consume.Consumer, src *kafka.Source) error {
	err := c.Run(ctx)
	if cerr := src.Close(); err == nil {
		err = cerr
	}
	if st := c.Stats(); st.Failed > 0 || st.Retried > 0 {
		err = errors.Join(err, fmt.Errorf("consumer stats %+v: attempts failed", st))
	}
	return err
}

func (r *runEnv) groupOpts() []kgo.Opt {
	return append(append([]kgo.Opt(nil), r.brokers...), kgo.ConsumerGroup(r.group), kgo.ConsumeTopics(r.topic))
}

// runByHand is the consumer loop a team writes with franz-go: poll,
// handle each partition's records in order on a goroutine of its own,
// wait, commit the polled offsets.
func runByHand(ctx context.Context, r *runEnv, handle func(ctx context.Context, rec *kgo.Record) error) error {
	cl, err := kgo.NewClient(append(r.groupOpts(), kgo.DisableAutoCommit())...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return nil
		}
		if err := fs.Err(); err != nil {
			return err
		}
		var wg sync.WaitGroup
		errs := make(chan error, 1)
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, rec := range p.Records {
					if err := handle(ctx, rec); err != nil {
						select {
						case errs <- err:
						default:
						}
						return
					}
					r.progress.handled(1)
				}
			}()
		})
		wg.Wait()
		select {
		case err := <-errs:
			if ctx.Err() != nil {
				return nil
			}
			return err
		default:
		}
		if err := cl.CommitUncommittedOffsets(context.WithoutCancel(ctx)); err != nil {
			return err
		}
	}
}

// essayHandler is the essay's fixed handler: the claim and the ledger row
// in one transaction.
func (r *runEnv) essayHandler(ctx context.Context, rec *kgo.Record) error {
	return r.essayTx(ctx, rec.Value)
}

// essayTx is the essay's transaction for one event's JSON.
func (r *runEnv) essayTx(ctx context.Context, body []byte) error {
	var ev event
	if err := json.Unmarshal(body, &ev); err != nil {
		return err
	}
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it does nothing
	tag, err := tx.Exec(ctx, `INSERT INTO `+r.seen+` (event_id, processed_at) VALUES ($1, now()) ON CONFLICT (event_id) DO NOTHING`, ev.ID)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 1 {
		if _, err := tx.Exec(ctx, fmt.Sprintf(insertLedger, r.ledger), ev.ID, ev.Account, ev.Cents); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// plainInsert writes the ledger row without any dedup.
func (r *runEnv) plainInsert(ctx context.Context, rec *kgo.Record) error {
	var ev event
	if err := json.Unmarshal(rec.Value, &ev); err != nil {
		return err
	}
	_, err := r.pool.Exec(ctx, fmt.Sprintf(insertLedger, r.ledger), ev.ID, ev.Account, ev.Cents)
	return err
}
