package main

// The share mode: "chargehook-worker share [flags]" runs the same plan for
// every payment event, but takes the events from a Kafka share group
// (kafka.ShareSource, KIP-932) instead of a consumer group: records are
// acquired and accepted one by one, any number of workers share the
// partitions, and a record whose acquisition lock expires (a worker frozen
// by SIGSTOP) is delivered to another worker while the first may still run
// it. internal/torture's share torture runs several of these at once.
//
//	chargehook-worker share -brokers 127.0.0.1:9092 -database-url postgres://... \
//	    -topic webhooks -output charged -group workers -migrate
//
// The flags are those of the consumer-group mode, without -instance-id
// and -ack-first, plus -members, -max-poll and -delivery-limit (see
// kafka.WithShareMembers, kafka.WithMaxPoll, kafka.WithDeliveryLimit).
// The -trace lines are the same; "acked" means the record was accepted,
// and "retry <id> lock_expired" reports an Ack refused because the
// record's acquisition lock had expired (the worker was frozen past it).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/kafka"
)

// init dispatches the share subcommand before main parses the
// consumer-group mode's flags.
func init() {
	if len(os.Args) > 1 && os.Args[1] == "share" {
		os.Exit(runShare(os.Args[2:], os.Stdout, os.Stderr))
	}
}

type shareConfig struct {
	config
	members, maxPoll, deliveryLimit int
}

func runShare(args []string, stdout, stderr io.Writer) int {
	var cfg shareConfig
	fs := flag.NewFlagSet("chargehook-worker share", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addCommonFlags(fs, &cfg.config, "share group", "handlers running at once")
	fs.IntVar(&cfg.members, "members", 0, "share-group members (clients) of the source (0: kafka.WithShareMembers's default)")
	fs.IntVar(&cfg.maxPoll, "max-poll", 0, "records one member takes per poll (0: kafka.WithMaxPoll's default)")
	fs.IntVar(&cfg.deliveryLimit, "delivery-limit", 5, "the group's share.delivery.count.limit (Kafka's default: 5)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg.fromEnv()
	missing := cfg.missingFlags()
	if len(missing) > 0 || fs.NArg() > 0 || cfg.concurrency < 1 {
		fmt.Fprintf(stderr, "chargehook-worker share: need %s (and no arguments, a positive -concurrency)\n", strings.Join(missing, ", "))
		fs.Usage()
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := workShare(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "chargehook-worker share:", err)
		return 1
	}
	return 0
}

// workShare runs the consumer over a share group until ctx is done.
func workShare(ctx context.Context, cfg shareConfig, stdout, stderr io.Writer) error {
	tr := &tracer{w: stdout, on: cfg.trace}
	pool, producer, brokers, closeBackends, err := openBackends(ctx, cfg.config)
	if err != nil {
		return err
	}
	defer closeBackends()
	h, err := newHandler(pool, producer, cfg.config, tr)
	if err != nil {
		return err
	}
	opts := []kafka.ShareOption{kafka.WithDeliveryLimit(cfg.deliveryLimit), kafka.WithLogger(stderrLogger(stderr, "chargehook-worker share"))}
	if cfg.members > 0 {
		opts = append(opts, kafka.WithShareMembers(cfg.members))
	}
	if cfg.maxPoll > 0 {
		opts = append(opts, kafka.WithMaxPoll(cfg.maxPoll))
	}
	src, err := kafka.NewShareSource([]kgo.Opt{brokers, kgo.ShareGroup(cfg.group), kgo.ConsumeTopics(cfg.topic)}, opts...)
	if err != nil {
		return err
	}
	c, err := consume.New(&tracingShareSource{ShareSource: src, tr: tr}, h.handle,
		consume.WithConcurrency(cfg.concurrency),
		// Never give up on a failure that may heal: a key can stay leased
		// (ErrInFlight) after a crash until its lease expires. Retries go
		// back to the broker (Release) until the delivery limit, then stay
		// in place. Poison and key reuse go to the dead-letter table at
		// once, as in the group mode.
		consume.WithMaxAttempts(0),
		consume.WithDeadLetter(h.deadLetter),
		consume.WithBackoff(10*time.Millisecond, 500*time.Millisecond),
		consume.WithShutdownGrace(cfg.grace),
		consume.WithObserver(effects.ObserverFunc(func(_ context.Context, ev effects.Event) {
			c := cause(ev.Err)
			if errors.Is(ev.Err, kafka.ErrLockExpired) {
				c = "lock_expired" // a handler outlived its lock: another worker had the record
			}
			tr.line("retry", ev.DeliveryID, c)
		})),
	)
	if err != nil {
		src.Close()
		return err
	}
	tr.line("ready")
	runErr := c.Run(ctx)
	closeErr := src.Close() // releases what was not accepted
	s := c.Stats()
	fmt.Fprintf(stderr, "chargehook-worker share: stopped: %d delivered, %d acked, %d retried, %d released, %d dropped, %d failed\n",
		s.Delivered, s.Acked, s.Retried, s.Released, s.Dropped, s.Failed)
	tr.line("stopped")
	if runErr != nil {
		return runErr
	}
	if closeErr != nil {
		return fmt.Errorf("closing the share source: %w", closeErr)
	}
	return nil
}

// tracingShareSource traces every successful Ack (an accepted record). The
// embedded source's Release and Owns make it an effects.Releaser and an
// effects.OwnershipChecker.
type tracingShareSource struct {
	*kafka.ShareSource
	tr *tracer
}

func (s *tracingShareSource) Ack(ctx context.Context, d effects.Delivery) error {
	err := s.ShareSource.Ack(ctx, d)
	if err == nil {
		s.tr.line("acked", d.ID)
	}
	return err
}
