package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/term"
	"golang.org/x/time/rate"

	"effectively.dev/effects"
)

// Limiter paces a replay: Replay calls Wait once before handing each
// record to the handler. *rate.Limiter satisfies it, so one limiter can be
// shared by several replays, or with live traffic.
type Limiter interface {
	Wait(ctx context.Context) error
}

// ReplayOptions selects what [Replay] re-feeds and how fast.
//
// The range is chosen per partition. Its start is the first offset at or
// after From when From is set, else StartOffset (0: the log start); its end
// (exclusive) is the first offset at or after To when To is set, else
// EndOffset (0 or negative: no bound); and it never goes past the
// partition's last stable offset when Replay starts, so a replay ends even
// while producers keep writing. Records of aborted transactions and
// control records are skipped (Replay reads with read_committed).
type ReplayOptions struct {
	// Topic is the topic to replay. Required.
	Topic string
	// Partitions limits the replay to these partitions; nil means all.
	Partitions []int32
	// StartOffset and EndOffset bound the range by offset: [StartOffset,
	// EndOffset).
	StartOffset, EndOffset int64
	// From and To bound the range by record timestamp: [From, To).
	From, To time.Time

	// Rate is the most records per second handed to the handler, Burst
	// how many may go at once (default 1). Rate 0 means no limit.
	Rate  rate.Limit
	Burst int
	// Limiter, if set, paces the replay instead of Rate and Burst.
	Limiter Limiter

	// Progress receives a progress bar, redrawn in place at most ten times
	// a second. Nil means standard error when it is a terminal, and no
	// bar otherwise; io.Discard turns it off.
	Progress io.Writer

	// BatchSize is the most records [ReplayBatch] hands to its handler at
	// once; 0 means [DefaultReplayBatchSize]. Only ReplayBatch heeds it:
	// [Replay] refuses it.
	BatchSize int
}

// DefaultReplayBatchSize is the batch size of [ReplayBatch] when
// ReplayOptions.BatchSize is 0: large enough that the one query and the
// one commit per batch of postgres.ApplyBatch with a pre-check cost little
// per record (a storm of 99% seen keys costs about 1/20 of applying record
// by record; at 100 per batch, about 1/10), small enough that a failed
// batch is cheap to redo.
const DefaultReplayBatchSize = 1000

// ReplayHandler handles one replayed record. Returning an error stops the
// replay.
type ReplayHandler func(ctx context.Context, r *kgo.Record) error

// ReplayBatchHandler handles a batch of replayed records, in offset order
// per partition (records of several partitions may share a batch). It must
// not keep recs after it returns. Returning an error stops the replay, and
// no record of the batch counts as handled.
type ReplayBatchHandler func(ctx context.Context, recs []*kgo.Record) error

// ReplayStats says what a replay did.
type ReplayStats struct {
	// Records is how many records the handler returned nil for.
	Records int
	// Ranges is the replayed range of each partition, [Start, End).
	Ranges map[int32]OffsetRange
	// Next is, per partition, the offset after the last record handled:
	// a replay stopped early resumes with StartOffset = Next[p].
	Next map[int32]int64
}

// OffsetRange is a half-open range of offsets, [Start, End).
type OffsetRange struct {
	Start, End int64
}

// Replay re-feeds a range of a topic through handler, one record at a
// time in offset order per partition, waiting on the rate limiter before
// each record so the replay does not starve live traffic. It is the tool
// for re-running idempotent consumers over past records: effects that
// were done replay, effects that were lost apply. For a replay of mostly
// handled records, [ReplayBatch] with a batch pre-check is much cheaper.
//
// client provides the connection settings (seed brokers, TLS, SASL,
// dialer) and answers the offset lookups; Replay consumes with a client of
// its own built from client.Opts(), so client is not changed and may be a
// group member or a producer, but not transactional (its transactional id
// would be shared). Replay returns when every partition reached
// the end of its range, when handler fails (the error is returned
// wrapped, with the stats up to it), or when ctx is done (ctx's error).
// A missing client, handler or topic, a negative Rate or Burst, or a
// BatchSize (which only ReplayBatch heeds) is an [*effects.ConfigError],
// returned before any I/O.
func Replay(ctx context.Context, client *kgo.Client, opts ReplayOptions, handler ReplayHandler) (ReplayStats, error) {
	const op = "kafka.Replay"
	if opts.BatchSize != 0 {
		return newReplayStats(), &effects.ConfigError{Op: op, Option: "BatchSize", Reason: "only ReplayBatch heeds it"}
	}
	if handler == nil {
		return newReplayStats(), &effects.ConfigError{Op: op, Option: "handler", Reason: "nil"}
	}
	return replay(ctx, op, client, opts, 1, func(ctx context.Context, recs []*kgo.Record) error {
		return handler(ctx, recs[0])
	})
}

// ReplayBatch is [Replay] with a handler that takes up to opts.BatchSize
// records at a time (default [DefaultReplayBatchSize]): the form for a
// handler that does one query or one transaction per batch, such as
// postgres.ApplyBatch with postgres.WithPrecheck, which replays the
// records already handled without a transaction. A batch is handed over
// when it is full or when the range is exhausted; the limiter is waited on
// once per record as it joins the batch. Stats count a batch's records,
// and advance Next past them, only once the handler returned nil, so a
// replay that stopped resumes at the first record of the failed batch. A
// negative BatchSize is an [*effects.ConfigError], like Replay's.
func ReplayBatch(ctx context.Context, client *kgo.Client, opts ReplayOptions, handler ReplayBatchHandler) (ReplayStats, error) {
	const op = "kafka.ReplayBatch"
	size := opts.BatchSize
	switch {
	case size < 0:
		return newReplayStats(), &effects.ConfigError{Op: op, Option: "BatchSize", Reason: "negative; 0 means DefaultReplayBatchSize"}
	case size == 0:
		size = DefaultReplayBatchSize
	}
	if handler == nil {
		return newReplayStats(), &effects.ConfigError{Op: op, Option: "handler", Reason: "nil"}
	}
	return replay(ctx, op, client, opts, size, handler)
}

func newReplayStats() ReplayStats {
	return ReplayStats{Ranges: map[int32]OffsetRange{}, Next: map[int32]int64{}}
}

// replay runs Replay and ReplayBatch: it hands handler batches of up to
// size records.
func replay(ctx context.Context, op string, client *kgo.Client, opts ReplayOptions, size int, handler ReplayBatchHandler) (ReplayStats, error) {
	stats := newReplayStats()
	switch {
	case client == nil:
		return stats, &effects.ConfigError{Op: op, Option: "client", Reason: "nil"}
	case opts.Topic == "":
		return stats, &effects.ConfigError{Op: op, Option: "Topic", Reason: "empty"}
	case opts.Rate < 0:
		return stats, &effects.ConfigError{Op: op, Option: "Rate", Reason: "negative; 0 means no limit"}
	case opts.Burst < 0:
		return stats, &effects.ConfigError{Op: op, Option: "Burst", Reason: "negative; 0 means 1"}
	}
	if vs := client.OptValues(kgo.TransactionalID); len(vs) == 2 && vs[1] == true {
		return stats, &effects.ConfigError{Op: op, Option: "client",
			Reason: "transactional; pass a non-transactional client (Replay builds its consumer from its options)"}
	}
	ranges, err := replayRanges(ctx, kadm.NewClient(client), opts)
	if err != nil {
		return stats, fmt.Errorf("%s %s: %w", op, opts.Topic, err)
	}
	var total int64
	starts := map[int32]kgo.Offset{}
	for p, r := range ranges {
		stats.Ranges[p] = r
		stats.Next[p] = r.Start
		if r.End > r.Start {
			total += r.End - r.Start
			starts[p] = kgo.NewOffset().At(r.Start)
		}
	}
	if len(starts) == 0 {
		return stats, nil
	}
	lim := opts.Limiter
	if lim == nil {
		lim = newLimiter(opts.Rate, opts.Burst)
	}
	bar := newProgress(opts.Progress, opts.Topic, total)
	defer bar.finish()

	rc, err := kgo.NewClient(append(client.Opts(),
		kgo.ConsumerGroup(""),
		kgo.ConsumeTopics(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{opts.Topic: starts}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Control records mark where a transaction ended; we need to see
		// them to know that a range ending on one is done.
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return stats, fmt.Errorf("%s: %w", op, err)
	}
	defer rc.Close()

	left := map[int32]bool{}
	for p := range starts {
		left[p] = true
	}
	var (
		done    int64 // offsets handled, for the progress bar
		batch   = make([]*kgo.Record, 0, size)
		reached = maps.Clone(stats.Next) // per partition, the offset after the last record taken into batch
	)
	// flush hands the batch to the handler and, once it returned nil,
	// counts its records and moves Next up to reached.
	flush := func() error {
		if len(batch) > 0 {
			if err := handler(ctx, batch); err != nil {
				first := batch[0]
				where := fmt.Sprintf("%d/%d", first.Partition, first.Offset)
				if len(batch) > 1 {
					where = fmt.Sprintf("a batch of %d records from %s", len(batch), where)
				}
				return fmt.Errorf("%s %s: handler at %s: %w", op, opts.Topic, where, err)
			}
			stats.Records += len(batch)
			clear(batch) // drop the references for the garbage collector
			batch = batch[:0]
		}
		for p, next := range reached {
			done += next - stats.Next[p]
			stats.Next[p] = next
		}
		bar.update(done, stats.Records)
		return nil
	}
	for len(left) > 0 {
		fs := rc.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return stats, err
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = errors.Join(ferr, err) })
		if ferr != nil {
			return stats, fmt.Errorf("%s %s: fetching: %w", op, opts.Topic, ferr)
		}
		var herr error
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if herr != nil || !left[fp.Partition] {
				return
			}
			r := ranges[fp.Partition]
			for _, rec := range fp.Records {
				if rec.Offset < reached[fp.Partition] {
					continue
				}
				if rec.Offset >= r.End {
					break
				}
				if !rec.Attrs.IsControl() {
					if err := lim.Wait(ctx); err != nil {
						herr = err
						return
					}
					batch = append(batch, rec)
				}
				reached[fp.Partition] = rec.Offset + 1
				if len(batch) == size {
					if herr = flush(); herr != nil {
						return
					}
				}
			}
			if reached[fp.Partition] >= r.End {
				delete(left, fp.Partition)
			}
		})
		if herr != nil {
			return stats, herr
		}
	}
	if err := flush(); err != nil {
		return stats, err
	}
	return stats, nil
}

// replayRanges resolves opts to a range per partition.
func replayRanges(ctx context.Context, adm *kadm.Client, o ReplayOptions) (map[int32]OffsetRange, error) {
	lso, err := adm.ListCommittedOffsets(ctx, o.Topic)
	if err == nil {
		err = lso.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing end offsets: %w", err)
	}
	logStart, err := adm.ListStartOffsets(ctx, o.Topic)
	if err == nil {
		err = logStart.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing start offsets: %w", err)
	}
	var from, to kadm.ListedOffsets
	if !o.From.IsZero() {
		if from, err = afterMilli(ctx, adm, o.From, o.Topic); err != nil {
			return nil, err
		}
	}
	if !o.To.IsZero() {
		if to, err = afterMilli(ctx, adm, o.To, o.Topic); err != nil {
			return nil, err
		}
	}
	out := map[int32]OffsetRange{}
	var bad error
	lso.Each(func(l kadm.ListedOffset) {
		p := l.Partition
		if o.Partitions != nil && !slices.Contains(o.Partitions, p) {
			return
		}
		start := o.StartOffset
		if from != nil {
			start = lookup(from, o.Topic, p, l.Offset)
		}
		if s := lookup(logStart, o.Topic, p, 0); start < s {
			start = s
		}
		end := l.Offset
		if to != nil {
			end = min(end, lookup(to, o.Topic, p, l.Offset))
		} else if o.EndOffset > 0 {
			end = min(end, o.EndOffset)
		}
		out[p] = OffsetRange{Start: start, End: max(start, end)}
	})
	for _, p := range o.Partitions {
		if _, ok := out[p]; !ok {
			bad = errors.Join(bad, fmt.Errorf("partition %d does not exist", p))
		}
	}
	return out, bad
}

func afterMilli(ctx context.Context, adm *kadm.Client, t time.Time, topic string) (kadm.ListedOffsets, error) {
	l, err := adm.ListOffsetsAfterMilli(ctx, t.UnixMilli(), topic)
	if err == nil {
		err = l.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing offsets after %s: %w", t.Format(time.RFC3339Nano), err)
	}
	return l, nil
}

// lookup returns the listed offset of p, or def when there is none (-1
// means "no record at or after that time": the end of the partition).
func lookup(l kadm.ListedOffsets, topic string, p int32, def int64) int64 {
	o, ok := l.Lookup(topic, p)
	if !ok || o.Offset < 0 {
		return def
	}
	return o.Offset
}

// newLimiter returns a limiter for r per second with burst b; r == 0 or
// rate.Inf means none.
func newLimiter(r rate.Limit, b int) Limiter {
	if r == 0 || r == rate.Inf {
		return rate.NewLimiter(rate.Inf, 1)
	}
	return rate.NewLimiter(r, max(b, 1))
}

// progress is a one-line progress bar.
type progress struct {
	w     io.Writer
	label string
	total int64
	done  int64
	recs  int
	start time.Time
	last  time.Time
}

func newProgress(w io.Writer, label string, total int64) *progress {
	if w == nil {
		if term.IsTerminal(int(os.Stderr.Fd())) {
			w = os.Stderr
		} else {
			w = io.Discard
		}
	}
	if w == io.Discard {
		return &progress{}
	}
	return &progress{w: w, label: label, total: total, start: time.Now()}
}

func (p *progress) update(done int64, recs int) {
	if p.w == nil {
		return
	}
	p.done, p.recs = done, recs
	if now := time.Now(); now.Sub(p.last) >= 100*time.Millisecond {
		p.last = now
		p.draw()
	}
}

func (p *progress) draw() {
	const width = 30
	frac := 1.0
	if p.total > 0 {
		frac = min(float64(p.done)/float64(p.total), 1)
	}
	filled := int(frac * width)
	bar := make([]byte, width)
	for i := range bar {
		if i < filled {
			bar[i] = '#'
		} else {
			bar[i] = '-'
		}
	}
	secs := max(time.Since(p.start).Seconds(), 1e-3)
	fmt.Fprintf(p.w, "\rreplay %s [%s] %3.0f%% %d/%d offsets, %d records, %.0f/s", p.label, bar, frac*100, p.done, p.total, p.recs, float64(p.recs)/secs)
}

func (p *progress) finish() {
	if p.w == nil {
		return
	}
	p.draw()
	fmt.Fprintln(p.w)
}
