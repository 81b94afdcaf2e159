package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/internal/ratelog"
	"effectively.dev/kafka/internal/produce"
)

type redriveConfig struct {
	from, to time.Time
	keep     func(DeadLetter) bool // nil: every dead letter
	keepSet  bool
	limit    int
	topic    string
	idHeader string
	dry      bool
	dryRun   io.Writer
	limiter  Limiter
	limSet   bool
	progress io.Writer
	limitSet bool
	allowed  map[string]bool // nil: every destination
	group    string
}

// WithFilter moves only the dead letters keep returns true for; keep
// gets each one's headers, parsed ([ParseDeadLetter]: its delivery id,
// class, error, attempts, source topic and time). The others are counted
// in RedriveStats.Skipped. For the retryable ones:
//
//	kafka.WithFilter(func(d kafka.DeadLetter) bool { return d.Class == "retryable" })
//
// keep must not be nil.
func WithFilter(keep func(d DeadLetter) bool) RedriveOption {
	return redriveOpt(func(c *redriveConfig) { c.keep, c.keepSet = keep, true })
}

// WithLimit stops after n dead letters moved (or, dry, selected). n must
// be at least 1.
func WithLimit(n int) RedriveOption {
	return redriveOpt(func(c *redriveConfig) { c.limit, c.limitSet = n, true })
}

// WithTopic produces every moved record to topic instead of its
// [HeaderDLQTopic]: for dead letters of deliveries that did not come from
// Kafka, or to move them somewhere else.
func WithTopic(topic string) RedriveOption {
	return redriveOpt(func(c *redriveConfig) { c.topic = topic })
}

// WithAllowTopics moves dead letters only to topics: a dead letter whose
// destination ([HeaderDLQTopic], which whoever can write to the
// dead-letter topic can forge) is not one of them is skipped and counted
// in RedriveStats.NotAllowed. The topic of [WithTopic] is allowed without
// it. Without this option every destination is allowed.
func WithAllowTopics(topics ...string) RedriveOption {
	return redriveOpt(func(c *redriveConfig) {
		if c.allowed == nil {
			c.allowed = map[string]bool{}
		}
		for _, t := range topics {
			c.allowed[t] = true
		}
	})
}

// WithGroup records the redrive's progress under the consumer group group
// on the dead-letter topic, so that a redrive stopped part-way (killed,
// cancelled, or at its [WithLimit]) and run again with the same group
// resumes after the last dead letter it moved: it starts at the group's
// committed offsets, and commits each partition's offset after each dead
// letter it moved, once the broker acked the moved record, and at the end
// of the run past every dead letter it read (selected or not: use one
// group per selection). Each commit made while the run moves records is
// stamped with its time (the commits at the end of a run that stopped
// cleanly are not); a run that resumes from a stamped commit first looks
// in the destination of the partition's next dead letter for a record
// written since, whose effectively-redriven-from header names it (moved by a run
// killed before its commit), and skips it if there is one. A dry run
// reads from the group's offsets and commits nothing. group must not be a
// group that consumers of the dead-letter topic use.
func WithGroup(group string) RedriveOption {
	return redriveOpt(func(c *redriveConfig) { c.group = group })
}

// WithDryRun moves nothing: Redrive writes one line per selected dead
// letter to w (when it was dead-lettered, where it is, its delivery id,
// class, destination and error; nothing for a nil w) and counts it in
// RedriveStats.Moved; a dead letter it would not move (cut, or to a topic
// not allowed) gets a line that says so.
func WithDryRun(w io.Writer) RedriveOption {
	return redriveOpt(func(c *redriveConfig) {
		c.dry, c.dryRun = true, w
		if w == nil {
			c.dryRun = io.Discard
		}
	})
}

// RedriveStats says what [Redrive] did.
type RedriveStats struct {
	// Read is how many dead letters it read; Moved how many it produced to
	// their source topic (or would have, dry); Skipped how many the
	// selection left out; Repeated how many were skipped as a delivery id
	// already moved in this run (a dead letter written twice); NotAllowed
	// how many were skipped because their destination is not allowed
	// ([WithAllowTopics]); Cut how many were skipped because they
	// were cut to fit the dead-letter topic ([HeaderDLQCut]: their body
	// or id is not whole); NoDestination how many dead letters without
	// [HeaderDLQTopic] a dry run listed (without [WithTopic], such a
	// dead letter stops a run that moves).
	Read, Moved, Skipped, Repeated, NotAllowed, Cut, NoDestination int
	// Moves counts the dead letters moved (or, dry, that would move) per
	// destination topic and class, sorted by topic then class.
	Moves []RedriveMove
}

// RedriveMove counts the dead letters [Redrive] moved to one topic with
// one class, and the first and last of their dead-lettering times
// ([HeaderDLQTime], else the record's timestamp).
type RedriveMove struct {
	Topic, Class string
	Count        int
	First, Last  time.Time
}

// count adds a dead letter of class to topic, dead-lettered at at.
func (s *RedriveStats) count(topic, class string, at time.Time) {
	i, found := slices.BinarySearchFunc(s.Moves, RedriveMove{Topic: topic, Class: class}, func(a, b RedriveMove) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Class, b.Class))
	})
	if !found {
		s.Moves = slices.Insert(s.Moves, i, RedriveMove{Topic: topic, Class: class, First: at, Last: at})
	}
	m := &s.Moves[i]
	m.Count++
	if at.Before(m.First) {
		m.First = at
	}
	if at.After(m.Last) {
		m.Last = at
	}
}

// errRedriveDone stops the replay once the limit is reached.
var errRedriveDone = errors.New("redrive limit reached")

// Redrive reads the dead-letter topic dlq (written by [DeadLetterTopic])
// and produces the selected dead letters back to their source topic
// ([HeaderDLQTopic]), through client, an idempotent producer as for
// [NewProducer] (any client for [WithDryRun]). Each moved record
// has the dead letter's key, body and headers, without the headers
// [DeadLetterTopic] added (those starting with [DeadLetterHeaderPrefix]),
// and keeps the delivery id header ([HeaderDLQIDHeader], else
// [WithIDHeader]): a consumer of the source topic gets a delivery
// with the same ID, so the effects its handler completed before the
// delivery was dead-lettered replay, and only the rest apply. Deploy the
// fix first: a delivery that fails again is dead-lettered again.
//
// It reads the topic from its start (or from [WithGroup]'s
// committed offsets) to its end when Redrive starts (see [Replay]), waits
// for each record's ack before the next, and moves each delivery id once
// per run (dead letters with an empty id each time). A record whose
// produce has started is finished even when ctx is cancelled, so a
// cancelled run knows what it moved. Without [WithGroup] it is at
// least once, like the dead letters: a Redrive that fails, or is run
// twice, moves records again, and the consumers' effects dedup them. With
// a group, a rerun resumes after the last dead letter moved, and each
// moved record carries the header effectively-redriven-from
// ("TOPIC/PARTITION/OFFSET" of the dead letter), so that a rerun after a
// process killed between a record's ack and its offset commit finds that
// record in its destination and does not move it again. The dead letters
// stay in dlq. A dead letter cut to fit ([HeaderDLQCut]) is never moved.
//
// A dead letter without [HeaderDLQTopic] and no [WithTopic] is an
// error that stops the run (with the stats up to it), as is a failed
// produce or a failed offset commit.
func Redrive(ctx context.Context, client *kgo.Client, dlq string, opts ...RedriveOption) (RedriveStats, error) {
	const op = "kafka.Redrive"
	cfg, err := newRedriveConfig(op, client, dlq, opts)
	if err != nil {
		return RedriveStats{}, err
	}
	r := &redriver{cfg: cfg, client: client, dlq: dlq, sync: produce.NewSyncer(client),
		lim: orUnlimited(cfg.limiter), seen: map[string]bool{}, next: map[int32]int64{}}
	rcfg, err := newReplayConfig(op, client, dlq, []ReplayOption{WithTimeRange(cfg.from, cfg.to), WithProgress(cfg.progress)})
	if err != nil {
		return r.stats, err
	}
	if cfg.group != "" {
		if rcfg.starts, err = r.committed(ctx); err != nil {
			return r.stats, fmt.Errorf("%s %s: group %q: %w", op, dlq, cfg.group, err)
		}
	}
	_, err = replay(ctx, op, client, dlq, rcfg, func(ctx context.Context, recs []*kgo.Record) error {
		return r.handle(ctx, recs[0])
	})
	if errors.Is(err, errRedriveDone) {
		err = nil
	}
	// No produce is in flight once the run ends, unless a produce failed
	// (its record may still have been written): only then do the commits
	// keep their time stamps for the next run to look for it.
	clean := err == nil || ctx.Err() != nil
	if cerr := r.commit(ctx, clean); cerr != nil && err == nil {
		err = fmt.Errorf("%s %s: %w", op, dlq, cerr)
	}
	return r.stats, err // replay's errors name op and dlq
}

// newRedriveConfig applies opts and validates them with client and dlq.
func newRedriveConfig(op string, client *kgo.Client, dlq string, opts []RedriveOption) (redriveConfig, error) {
	cfg := redriveConfig{idHeader: KeyHeader}
	for _, o := range opts {
		if o != nil {
			o.applyRedrive(&cfg)
		}
	}
	switch {
	case client == nil:
		return cfg, effects.ConfigErrorf(op, "client", "nil")
	case dlq == "":
		return cfg, effects.ConfigErrorf(op, "dlq", "empty topic")
	case cfg.limitSet && cfg.limit < 1:
		return cfg, effects.ConfigErrorf(op, "WithLimit", "%d records; need at least 1", cfg.limit)
	case cfg.idHeader == "":
		return cfg, effects.ConfigErrorf(op, "WithIDHeader", "empty name")
	case cfg.limSet && cfg.limiter == nil:
		return cfg, effects.ConfigErrorf(op, "WithLimiter", "nil; leave the option out for no limit")
	case cfg.keepSet && cfg.keep == nil:
		return cfg, effects.ConfigErrorf(op, "WithFilter", "nil; leave the option out to move every dead letter")
	case cfg.allowed != nil && len(cfg.allowed) == 0:
		return cfg, effects.ConfigErrorf(op, "WithAllowTopics", "no topics; leave the option out to allow every destination")
	}
	if cfg.allowed != nil && cfg.topic != "" {
		cfg.allowed[cfg.topic] = true
	}
	if !cfg.dry {
		if err := produce.CheckClient(client); err != nil {
			return cfg, fmt.Errorf("%s: %w", op, err)
		}
	}
	return cfg, nil
}

// redriver is the state of one Redrive.
type redriver struct {
	cfg    redriveConfig
	client *kgo.Client
	dlq    string
	sync   *produce.Syncer
	lim    Limiter
	stats  RedriveStats
	seen   map[string]bool // delivery ids moved in this run
	next   map[int32]int64 // per partition, the offset after the last dead letter read
	done   map[int32]int64 // per partition, the offset committed
	// stampless: the final commit, after which no move is pending
	stampless bool
}

// handle takes one dead letter: it counts it, skips it, or moves it, and,
// once it did, counts it as read past.
func (r *redriver) handle(ctx context.Context, dl *kgo.Record) error {
	err := r.take(ctx, dl)
	if err == nil || errors.Is(err, errRedriveDone) {
		r.next[dl.Partition] = dl.Offset + 1
	}
	return err
}

// take counts, skips or moves one dead letter.
func (r *redriver) take(ctx context.Context, dl *kgo.Record) error {
	r.stats.Read++
	d, _ := ParseDeadLetter(dl)
	switch {
	case !r.cfg.selects(d):
		r.stats.Skipped++
		return nil
	case d.ID != "" && r.seen[d.ID]: // an empty id (refused by effects.NewKey) names no delivery
		r.stats.Repeated++
		return nil
	}
	rec, err := r.cfg.redriven(dl, d)
	if err != nil && r.cfg.dry {
		r.stats.NoDestination++
		r.print(dl, d, &kgo.Record{}, " (no destination: name one with WithTopic)")
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case d.Cut:
		r.stats.Cut++
		r.print(dl, d, rec, " (cut to fit the dead-letter topic: not moved)")
		return nil
	case r.cfg.allowed != nil && !r.cfg.allowed[rec.Topic]:
		r.stats.NotAllowed++
		r.print(dl, d, rec, " (destination not allowed: not moved)")
		return nil
	}
	if r.cfg.dry {
		r.print(dl, d, rec, "")
	} else if err := r.move(ctx, dl, rec, d.ID); err != nil {
		return err
	}
	r.seen[d.ID] = true
	r.stats.Moved++
	r.stats.count(rec.Topic, d.Class, d.Time)
	if r.cfg.limitSet && r.stats.Moved >= r.cfg.limit {
		return errRedriveDone
	}
	return nil
}

// print writes a dry run's line for dl (parsed as d), redriven as rec,
// with note.
func (r *redriver) print(dl *kgo.Record, d DeadLetter, rec *kgo.Record, note string) {
	if !r.cfg.dry {
		return
	}
	fmt.Fprintf(r.cfg.dryRun, "%s %s/%d/%d delivery %q class %s -> %s%s: %s\n",
		d.Time.UTC().Format(time.RFC3339), dl.Topic, dl.Partition, dl.Offset, ratelog.Bound(d.ID), d.Class, rec.Topic, note, d.Error)
}

// move produces rec, the redriven form of dl, and records the progress.
func (r *redriver) move(ctx context.Context, dl, rec *kgo.Record, id string) error {
	if err := r.lim.Wait(ctx); err != nil {
		return err
	}
	// A produce that started is finished: a cancelled run then knows
	// whether it moved the record, and commits it.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := r.sync.Produce(pctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("producing dead letter %d/%d (delivery %q) to %s: %w", dl.Partition, dl.Offset, ratelog.Bound(id), rec.Topic, err)
	}
	return r.commitAt(pctx, map[int32]int64{dl.Partition: dl.Offset + 1}, false)
}

// headerRedrivenFrom is the header [Redrive] adds to each record it
// moves: where the dead letter was, "TOPIC/PARTITION/OFFSET" of the
// dead-letter topic. With [WithGroup], a redrive that resumes after
// a kill looks for it to tell whether the dead letter it was moving when
// it died was moved.
const headerRedrivenFrom = "effectively-redriven-from"

// committed returns the group's committed offsets on the dead-letter
// topic, per partition, after making sure of the one dead letter per
// partition a killed run may have moved without committing it: if the
// destination holds a record redriven from it since the commit, the start
// moves past it. It then commits the starts, stamped with the time, so
// that the next run can do the same.
func (r *redriver) committed(ctx context.Context) (map[int32]int64, error) {
	adm := kadm.NewClient(r.client)
	starts := map[int32]int64{}
	os, err := adm.FetchOffsets(ctx, r.cfg.group)
	if err == nil {
		err = os.Error()
	}
	switch {
	case errors.Is(err, kerr.GroupIDNotFound): // a first run: nothing committed yet
	case err != nil:
		return nil, fmt.Errorf("fetching committed offsets: %w", err)
	}
	for p, o := range os[r.dlq] {
		if o.At < 0 {
			continue
		}
		starts[p] = o.At
		if since, err := strconv.ParseInt(o.Metadata, 10, 64); err == nil && !r.cfg.dry {
			moved, err := r.movedSince(ctx, p, o.At, time.UnixMilli(since))
			if err != nil {
				return nil, err
			}
			if moved {
				starts[p] = o.At + 1
			}
		}
	}
	if r.cfg.dry {
		return starts, nil
	}
	logStart, err := adm.ListStartOffsets(ctx, r.dlq)
	if err == nil {
		err = logStart.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing start offsets: %w", err)
	}
	next := map[int32]int64{}
	logStart.Each(func(l kadm.ListedOffset) { next[l.Partition] = max(l.Offset, starts[l.Partition]) })
	r.done = map[int32]int64{}
	return starts, r.commitAt(ctx, next, true)
}

// errFound stops a scan once it found what it looked for.
var errFound = errors.New("found")

// movedSince reports whether the dead letter at offset off of partition p
// was moved at or after since: whether its destination holds a record
// whose headerRedrivenFrom names it, written since then.
func (r *redriver) movedSince(ctx context.Context, p int32, off int64, since time.Time) (bool, error) {
	var dest string
	_, err := Replay(ctx, r.client, r.dlq, func(_ context.Context, dls []*kgo.Record) error {
		d, _ := ParseDeadLetter(dls[0])
		if rec, err := r.cfg.redriven(dls[0], d); err == nil {
			dest = rec.Topic
		}
		return nil
	}, WithPartitions(p), WithOffsetRange(off, off+1), WithProgress(io.Discard))
	if err != nil || dest == "" {
		return false, err
	}
	from := fmt.Sprintf("%s/%d/%d", r.dlq, p, off)
	_, err = Replay(ctx, r.client, dest, func(_ context.Context, recs []*kgo.Record) error {
		if v, _ := headerValue(recs[0], headerRedrivenFrom); v == from {
			return errFound
		}
		return nil
	}, WithTimeRange(since.Add(-time.Second), time.Time{}), WithProgress(io.Discard))
	if errors.Is(err, errFound) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("looking for %s in %s: %w", from, dest, err)
	}
	return false, nil
}

// commit records, under the group, the offsets after the dead letters the
// run read; clean, without time stamps (no move is pending: the next run
// need not look in the destinations), on every partition the run
// committed. It does nothing for a dry run or without a group.
func (r *redriver) commit(ctx context.Context, clean bool) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if !clean {
		return r.commitAt(cctx, r.next, false)
	}
	final := maps.Clone(r.done)
	if final == nil {
		final = map[int32]int64{}
	}
	for p, o := range r.next {
		final[p] = max(final[p], o)
	}
	r.stampless = true
	return r.commitAt(cctx, final, true)
}

// commitAt commits next, each offset stamped with the time (the earliest
// its next dead letter can be moved), unless r.stampless; all commits
// even offsets already committed.
func (r *redriver) commitAt(ctx context.Context, next map[int32]int64, all bool) error {
	if r.cfg.group == "" || r.cfg.dry {
		return nil
	}
	if r.done == nil {
		r.done = map[int32]int64{}
	}
	stamp := strconv.FormatInt(time.Now().UnixMilli(), 10)
	if r.stampless {
		stamp = ""
	}
	var os kadm.Offsets
	for p, o := range next {
		if done, ok := r.done[p]; ok && done >= o && !all {
			continue
		}
		os.Add(kadm.Offset{Topic: r.dlq, Partition: p, At: o, LeaderEpoch: -1, Metadata: stamp})
	}
	if len(os) == 0 {
		return nil
	}
	resp, err := kadm.NewClient(r.client).CommitOffsets(ctx, r.cfg.group, os)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("committing the redrive's progress under group %q: %w", r.cfg.group, err)
	}
	os.Each(func(o kadm.Offset) { r.done[o.Partition] = o.At })
	return nil
}

// selects reports whether the selection takes dead letter d.
func (c *redriveConfig) selects(d DeadLetter) bool { return c.keep == nil || c.keep(d) }

// redriven builds the record that moves dl (parsed as d) back to its
// source topic.
func (c *redriveConfig) redriven(dl *kgo.Record, d DeadLetter) (*kgo.Record, error) {
	topic := cmp.Or(c.topic, d.Topic)
	if topic == "" {
		return nil, fmt.Errorf("dead letter %d/%d (delivery %q) has no %s header; name the topic with WithTopic",
			dl.Partition, dl.Offset, d.ID, HeaderDLQTopic)
	}
	rec := &kgo.Record{Topic: topic, Key: dl.Key, Value: dl.Value}
	named, _ := headerValue(dl, HeaderDLQIDHeader)
	hasID := false
	for _, h := range dl.Headers {
		if strings.HasPrefix(h.Key, DeadLetterHeaderPrefix) {
			continue
		}
		if h.Key == headerRedrivenFrom {
			continue // an earlier redrive's
		}
		hasID = hasID || h.Key == c.idHeader || (named != "" && h.Key == named)
		rec.Headers = append(rec.Headers, h)
	}
	if !hasID && d.ID != "" {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: c.idHeader, Value: []byte(d.ID)})
	}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: headerRedrivenFrom,
		Value: []byte(fmt.Sprintf("%s/%d/%d", dl.Topic, dl.Partition, dl.Offset))})
	return rec, nil
}

// headerValue returns the value of r's first header named name, and
// whether it has one.
func headerValue(r *kgo.Record, name string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}
