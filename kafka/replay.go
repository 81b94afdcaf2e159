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

// Limiter paces a replay or a redrive ([WithLimiter]): Replay calls Wait
// once before each record joins a batch for the handler, Redrive before
// each dead letter it moves. *rate.Limiter satisfies it.
type Limiter interface {
	Wait(ctx context.Context) error
}

type replayConfig struct {
	partitions    []int32 // nil: all
	partitionsSet bool
	start, end    int64
	from, to      time.Time
	limiter       Limiter
	limiterSet    bool
	progress      io.Writer
	batchSize     int
	starts        map[int32]int64 // per partition, a start no earlier than cfg's (Redrive's group offsets)
}

// WithPartitions limits the replay to partitions ps (default: all
// partitions of the topic). ps must name at least one partition, none
// negative; a partition the topic does not have is an error of the replay.
func WithPartitions(ps ...int32) ReplayOption {
	ps = slices.Clone(ps)
	return replayOpt(func(c *replayConfig) { c.partitions, c.partitionsSet = ps, true })
}

// WithOffsetRange bounds the replay by offset: [start, end). start 0 (the
// default) means the log start, and an end of 0 or less means no bound
// (the default). start must not be negative, nor after a positive end. A
// [WithTimeRange] bound that is set takes the place of the offset bound
// on its side.
func WithOffsetRange(start, end int64) ReplayOption {
	return replayOpt(func(c *replayConfig) { c.start, c.end = start, end })
}

// WithBatchSize sets the most records [Replay] hands to its handler at
// once (default 1). A batch is handed over when it is full or when the
// range is exhausted. A handler that does one query or one transaction
// per batch, such as postgres.ApplyBatch with postgres.WithPrecheck
// (which replays the records already handled without a transaction),
// wants a large batch: at 1000 records, a storm of 99% seen keys costs
// about 1/20 of handling record by record (at 100, about 1/10), and a
// failed batch is still cheap to redo. n must be at least 1.
func WithBatchSize(n int) ReplayOption {
	return replayOpt(func(c *replayConfig) { c.batchSize = n })
}

// ReplayStats says what a replay did.
type ReplayStats struct {
	// Records is how many records the handler returned nil for.
	Records int
	// Ranges is the replayed range of each partition, [Start, End).
	Ranges map[int32]OffsetRange
	// Next is, per partition, the offset after the last record handled:
	// a replay of partition p stopped early resumes with
	// WithPartitions(p) and WithOffsetRange(Next[p], end).
	Next map[int32]int64
}

// OffsetRange is a half-open range of offsets, [Start, End).
type OffsetRange struct {
	Start, End int64
}

// Replay re-feeds a range of topic through handler, in offset order per
// partition, one record per call or up to [WithBatchSize] records at a
// time, waiting on the rate limiter before each record joins a batch so
// the replay does not starve live traffic. It is the tool for re-running
// idempotent consumers over past records: effects that were done replay,
// effects that were lost apply. Without options it replays every
// partition from the log start to the last stable offset, one record at
// a time, with no rate limit.
//
// The range is chosen per partition. Its start is the first offset at or
// after the [WithTimeRange] from when it is set, else the
// [WithOffsetRange] start (default 0: the log start); its end (exclusive)
// is the first offset at or after the time range's to when it is set,
// else the offset range's end (default 0: no bound); and it never goes
// past the partition's last stable offset when Replay starts, so a replay
// ends even while producers keep writing. Records of aborted transactions
// and control records are skipped (Replay reads with read_committed).
//
// handler gets the records in offset order per partition (records of
// several partitions may share a batch) and must not keep recs after it
// returns. Stats count a batch's records, and advance Next past them,
// only once the handler returned nil, so a replay that stopped resumes at
// the first record of the failed batch.
//
// client provides the connection settings (seed brokers, TLS, SASL,
// dialer) and answers the offset lookups; Replay consumes with a client of
// its own built from client.Opts(), so client is not changed and may be a
// group member or a producer, but not transactional (its transactional id
// would be shared). Replay returns when every partition reached
// the end of its range, when handler fails (the error is returned
// wrapped, with the stats up to it), or when ctx is done (ctx's error).
// A missing client, handler or topic, or an invalid option, is an
// [*effects.ConfigError], returned before any I/O.
func Replay(ctx context.Context, client *kgo.Client, topic string, handler func(ctx context.Context, recs []*kgo.Record) error, opts ...ReplayOption) (ReplayStats, error) {
	const op = "kafka.Replay"
	if handler == nil {
		return newReplayStats(), effects.ConfigErrorf(op, "handler", "nil")
	}
	cfg, err := newReplayConfig(op, client, topic, opts)
	if err != nil {
		return newReplayStats(), err
	}
	return replay(ctx, op, client, topic, cfg, handler)
}

// newReplayConfig applies opts and validates them with client and topic.
// It does no I/O.
func newReplayConfig(op string, client *kgo.Client, topic string, opts []ReplayOption) (replayConfig, error) {
	cfg := replayConfig{batchSize: 1}
	for _, o := range opts {
		if o != nil {
			o.applyReplay(&cfg)
		}
	}
	return cfg, cfg.check(op, client, topic)
}

// check validates the configuration with client and topic.
func (cfg *replayConfig) check(op string, client *kgo.Client, topic string) error {
	switch {
	case client == nil:
		return effects.ConfigErrorf(op, "client", "nil")
	case topic == "":
		return effects.ConfigErrorf(op, "topic", "empty")
	case cfg.partitionsSet && len(cfg.partitions) == 0:
		return effects.ConfigErrorf(op, "WithPartitions", "no partitions; leave the option out to replay them all")
	case slices.ContainsFunc(cfg.partitions, func(p int32) bool { return p < 0 }):
		return effects.ConfigErrorf(op, "WithPartitions", "negative partition in %v", cfg.partitions)
	case cfg.start < 0:
		return effects.ConfigErrorf(op, "WithOffsetRange", "negative start %d; 0 means the log start", cfg.start)
	case cfg.end > 0 && cfg.end < cfg.start:
		return effects.ConfigErrorf(op, "WithOffsetRange", "end %d before start %d", cfg.end, cfg.start)
	case !cfg.from.IsZero() && !cfg.to.IsZero() && cfg.to.Before(cfg.from):
		return effects.ConfigErrorf(op, "WithTimeRange", "to %s before from %s", cfg.to.Format(time.RFC3339Nano), cfg.from.Format(time.RFC3339Nano))
	case cfg.limiterSet && cfg.limiter == nil:
		return effects.ConfigErrorf(op, "WithLimiter", "nil; leave the option out for no limit")
	case cfg.batchSize < 1:
		return effects.ConfigErrorf(op, "WithBatchSize", "%d records; need at least 1", cfg.batchSize)
	}
	if vs := client.OptValues(kgo.TransactionalID); len(vs) == 2 && vs[1] == true {
		return effects.ConfigErrorf(op, "client", "transactional; pass a non-transactional client (Replay builds its consumer from its options)")
	}
	return nil
}

func newReplayStats() ReplayStats {
	return ReplayStats{Ranges: map[int32]OffsetRange{}, Next: map[int32]int64{}}
}

// replay runs Replay: it resolves the ranges, then hands
// handler batches of up to cfg.batchSize records from a consumer of its
// own until every partition reached its range's end.
func replay(ctx context.Context, op string, client *kgo.Client, topic string, cfg replayConfig, handler func(context.Context, []*kgo.Record) error) (ReplayStats, error) {
	stats := newReplayStats()
	ranges, err := replayRanges(ctx, kadm.NewClient(client), topic, cfg)
	if err != nil {
		return stats, fmt.Errorf("%s %s: %w", op, topic, err)
	}
	starts, total := replayStarts(ranges, &stats)
	if len(starts) == 0 {
		return stats, nil
	}
	rc, err := kgo.NewClient(append(client.Opts(),
		kgo.ConsumerGroup(""),
		kgo.ConsumeTopics(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: starts}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Control records mark where a transaction ended; we need to see
		// them to know that a range ending on one is done.
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return stats, fmt.Errorf("%s: %w", op, err)
	}
	defer rc.Close()
	rr := &replayRun{op: op, topic: topic, ranges: ranges, handler: handler, lim: orUnlimited(cfg.limiter), stats: &stats,
		batch: make([]*kgo.Record, 0, cfg.batchSize), size: cfg.batchSize,
		reached: maps.Clone(stats.Next), left: map[int32]bool{}, bar: newProgress(cfg.progress, topic, total)}
	defer rr.bar.finish()
	for p := range starts {
		rr.left[p] = true
	}
	if err := rr.run(ctx, rc); err != nil {
		return stats, err
	}
	return stats, nil
}

// replayStarts records ranges in stats and returns the partitions that
// have records to replay, with their start offsets, and how many offsets
// they span in all.
func replayStarts(ranges map[int32]OffsetRange, stats *ReplayStats) (map[int32]kgo.Offset, int64) {
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
	return starts, total
}

// replayRun is the state of one replay's fetch loop.
type replayRun struct {
	op, topic string
	ranges    map[int32]OffsetRange
	handler   func(context.Context, []*kgo.Record) error
	lim       Limiter
	stats     *ReplayStats
	bar       *progress

	size    int
	batch   []*kgo.Record
	reached map[int32]int64 // per partition, the offset after the last record taken into batch
	left    map[int32]bool  // partitions not at their range's end
	done    int64           // offsets handled, for the progress bar
}

// run polls rc until every partition reached its range's end, then
// flushes the last batch.
func (rr *replayRun) run(ctx context.Context, rc *kgo.Client) error {
	for len(rr.left) > 0 {
		fs := rc.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = errors.Join(ferr, err) })
		if ferr != nil {
			return fmt.Errorf("%s %s: fetching: %w", rr.op, rr.topic, ferr)
		}
		var herr error
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if herr == nil && rr.left[fp.Partition] {
				herr = rr.take(ctx, fp)
			}
		})
		if herr != nil {
			return herr
		}
	}
	return rr.flush(ctx)
}

// take adds the records of fp within its partition's range to the batch,
// waiting on the limiter for each, and flushes each full batch.
func (rr *replayRun) take(ctx context.Context, fp kgo.FetchTopicPartition) error {
	r := rr.ranges[fp.Partition]
	for _, rec := range fp.Records {
		if rec.Offset < rr.reached[fp.Partition] {
			continue
		}
		if rec.Offset >= r.End {
			break
		}
		if !rec.Attrs.IsControl() {
			if err := rr.lim.Wait(ctx); err != nil {
				return err
			}
			rr.batch = append(rr.batch, rec)
		}
		rr.reached[fp.Partition] = rec.Offset + 1
		if len(rr.batch) == rr.size {
			if err := rr.flush(ctx); err != nil {
				return err
			}
		}
	}
	if rr.reached[fp.Partition] >= r.End {
		delete(rr.left, fp.Partition)
	}
	return nil
}

// flush hands the batch to the handler and, once it returned nil, counts
// its records and moves Next up to reached.
func (rr *replayRun) flush(ctx context.Context) error {
	if len(rr.batch) > 0 {
		if err := rr.handler(ctx, rr.batch); err != nil {
			first := rr.batch[0]
			where := fmt.Sprintf("%d/%d", first.Partition, first.Offset)
			if len(rr.batch) > 1 {
				where = fmt.Sprintf("a batch of %d records from %s", len(rr.batch), where)
			}
			return fmt.Errorf("%s %s: handler at %s: %w", rr.op, rr.topic, where, err)
		}
		rr.stats.Records += len(rr.batch)
		clear(rr.batch) // drop the references for the garbage collector
		rr.batch = rr.batch[:0]
	}
	for p, next := range rr.reached {
		rr.done += next - rr.stats.Next[p]
		rr.stats.Next[p] = next
	}
	rr.bar.update(rr.done, rr.stats.Records)
	return nil
}

// replayRanges resolves cfg to a range per partition of topic.
func replayRanges(ctx context.Context, adm *kadm.Client, topic string, cfg replayConfig) (map[int32]OffsetRange, error) {
	lso, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = lso.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing end offsets: %w", err)
	}
	logStart, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = logStart.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing start offsets: %w", err)
	}
	var from, to kadm.ListedOffsets
	if !cfg.from.IsZero() {
		if from, err = afterMilli(ctx, adm, cfg.from, topic); err != nil {
			return nil, err
		}
	}
	if !cfg.to.IsZero() {
		if to, err = afterMilli(ctx, adm, cfg.to, topic); err != nil {
			return nil, err
		}
	}
	out := map[int32]OffsetRange{}
	var bad error
	lso.Each(func(l kadm.ListedOffset) {
		p := l.Partition
		if cfg.partitions != nil && !slices.Contains(cfg.partitions, p) {
			return
		}
		start := cfg.start
		if from != nil {
			start = lookup(from, topic, p, l.Offset)
		}
		if s := lookup(logStart, topic, p, 0); start < s {
			start = s
		}
		if s, ok := cfg.starts[p]; ok && start < s {
			start = s
		}
		end := l.Offset
		if to != nil {
			end = min(end, lookup(to, topic, p, l.Offset))
		} else if cfg.end > 0 {
			end = min(end, cfg.end)
		}
		out[p] = OffsetRange{Start: start, End: max(start, end)}
	})
	for _, p := range cfg.partitions {
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

// orUnlimited returns lim, or a limiter that never waits for a nil lim.
func orUnlimited(lim Limiter) Limiter {
	if lim == nil {
		return rate.NewLimiter(rate.Inf, 1)
	}
	return lim
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
