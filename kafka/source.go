package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"effectively.dev/effects"
	"effectively.dev/effects/retry"
	"effectively.dev/internal/ratelog"
)

// ErrRevoked is returned (wrapped) by [Source.Ack] for a delivery whose
// partition was revoked or lost before the ack: this member cannot commit
// its offset any more, and the partition's new owner delivers the
// record again. The effect was done; an idempotent effect replays it.
var ErrRevoked = errors.New("kafka: partition revoked before the ack; its new owner delivers the record again")

// ErrSourceClosed is returned by [Source.Next], [Source.Ack] and
// [Source.Flush] after [Source.Close].
var ErrSourceClosed = errors.New("kafka: source closed")

// Defaults of a [Source], used when the matching option is not given.
const (
	// defaultMaxPoll is how many records one poll of the client takes.
	defaultMaxPoll = 500
	// defaultMaxPendingPerPartition bounds, per partition, the records
	// fetched and not yet acked.
	defaultMaxPendingPerPartition = 256
	// defaultCommitInterval is the shortest time between the starts of two
	// group commits.
	defaultCommitInterval = 100 * time.Millisecond
	// defaultFetchMaxWait is the kgo.FetchMaxWait a Source sets unless the
	// client options set another: Kafka's own consumer default, instead of
	// franz-go's 5 s, because a partition the Source resumes waits for the
	// fetch in flight.
	defaultFetchMaxWait = 500 * time.Millisecond
	// defaultCloseTimeout bounds [Source.Close]: the final commit and
	// leaving the group. It matches the consumer's default shutdown grace, so a
	// process that got SIGTERM stops within about twice that.
	defaultCloseTimeout = 10 * time.Second
)

// commitTimeout bounds the commit of a revocation and of Close, and each
// group commit.
const commitTimeout = 10 * time.Second

// Source is an [effects.Source] over a Kafka consumer group: side effect
// first, then commit.
//
// # Handing out
//
// A goroutine polls the client in the background and keeps each partition's
// records in a queue of its own. Next hands out records one at a time, from
// the partition with the fewest deliveries handed out and not yet acked
// (the partitions take turns among equals), so that a consumer's workers
// all get work even when a fetch returned long runs of one partition, and
// a consumer whose window is full refills first the partitions about to
// run dry. Each partition may have at most [WithMaxPendingPerPartition]
// records fetched and not yet acked: past that, Next skips the partition,
// and the Source pauses fetching it (kgo's PauseFetchPartitions) until its
// acks bring it down to half. A partition stuck behind a failing record so
// holds a bounded number of records, and the others go on.
//
// # Acks and group commit
//
// Ack records that a delivery was handled and advances its partition's
// mark over the contiguous acked prefix: the mark stops at the first
// delivery not yet acked, so acking out of order never skips a record. It
// does not wait for the broker. A committer sends the advanced marks of
// every partition in one OffsetCommit request, when the previous one
// returned and at least [WithCommitInterval] after it started; the
// Source also commits the marks when the group revokes partitions and on
// [Source.Close], and [Source.Flush] commits them at once and waits.
//
// What an Ack's nil return means: the delivery counts as handled and its
// offset will be committed with the next group commit, unless the process
// dies first or its partition is revoked first (the acks that arrive once a
// revocation started get [ErrRevoked]). In both cases the record is
// delivered again, to this process after a restart or to the partition's
// new owner, together with the acked records after it that were not yet
// committed; handlers must be idempotent, which is what package effects is
// for. A committed offset never passes a record that was not acked: a
// delivery that is never acked (its handler keeps failing) holds back its
// partition's commits, while the other partitions' commits advance.
//
// When the group revokes partitions, the Source commits their marks and
// forgets the rest (the new owner redelivers it); when partitions are lost
// (the member was kicked out) it commits nothing. From the revocation on,
// [Source.Owns] reports the partition's deliveries as not owned, so a
// [effectively.dev/effects/consume.Consumer] drops those it still holds instead of running
// their handlers for nothing.
//
// Failed group commits are retried with a backoff and reported to the
// observer ([WithObserver]), as are the fetch errors franz-go retries on
// its own; without an observer they are logged ([WithLogger];
// slog.Default() by default), rate-limited.
//
// Delivery.ID is the [KeyHeader] header when the record has one (see
// [WithIDHeader]), else "topic/partition/offset"; Delivery.Ordering is
// "topic/partition". The fallback applies only when the header is absent:
// a record whose id header is present but empty is handed out with an
// empty Delivery.ID, because the position of a resent event differs from
// the original's, and keying its effects on the position would apply them
// twice. [effects.NewKey] refuses the empty id with [effects.ErrInvalidKey],
// which a [effectively.dev/effects/consume.Consumer] treats as permanent: the delivery goes to the
// dead-letter hook at its first attempt. The header's bytes are taken as
// they are (NewKey escapes bytes that are not UTF-8, so ids that differ
// only in them stay apart); of several id headers, the first counts.
type Source struct {
	cl         *kgo.Client
	group      string   // kgo.ConsumerGroup
	topics     []string // kgo.ConsumeTopics: names, or patterns with regex
	regex      bool     // kgo.ConsumeRegex
	instanceID *string  // kgo.InstanceID, for static members
	cfg        sourceConfig
	rep        ratelog.Reporter

	startOnce sync.Once
	stop      chan struct{} // closed by Close: stops the poller and the committer
	runCtx    context.Context
	cancelRun context.CancelFunc
	// clientCtx is the client's context (kgo.WithContext): Close cancels
	// it when its bound expires, which interrupts a join or sync in flight.
	clientCtx    context.Context
	cancelClient context.CancelFunc
	loops        sync.WaitGroup // the poller and the committer

	commitMu sync.Mutex    // one commit at a time; revocations commit under it too
	dirty    chan struct{} // a mark advanced (capacity 1)

	mu     sync.Mutex
	parts  map[topicPartition]*partState
	ready  []*partState  // partitions Next may take a record from
	turn   int           // where pickLocked starts looking, for turns among equals
	avail  chan struct{} // a record became ready (capacity 1)
	epoch  uint64        // bumped on every revocation, for stale acks
	closed bool
	fatal  error // the start-up check's configuration error: Next returns it

	topicIDs map[string][16]byte // for OffsetCommit v10+
}

var (
	_ effects.Source           = (*Source)(nil)
	_ effects.OwnershipChecker = (*Source)(nil)
)

type topicPartition struct {
	topic     string
	partition int32
}

// partState is one assigned partition: its records fetched and not yet
// handed out, and its deliveries not yet in the committed prefix.
type partState struct {
	tp      topicPartition
	epoch   uint64
	buf     []*kgo.Record // fetched, not handed out, in offset order
	pending []*delivered  // handed out and not yet behind the mark, in offset order
	unacked int           // handed out and not acked
	inReady bool          // in Source.ready
	paused  bool          // fetching paused by the Source
	revoked bool          // a revocation started: acks are refused

	// gone is set, with revoked, when a revocation starts or the
	// partition is lost: this assignment's deliveries are no longer ours
	// (Owns reads it without the lock). A later assignment of the same
	// partition gets a new partState.
	gone atomic.Bool

	through   kgo.EpochOffset // the mark: offset after the contiguous acked prefix
	committed int64           // offset the group has stored; -1 for none known
}

type delivered struct {
	rec   *kgo.Record
	acked bool
}

// sourceToken is Delivery.Token.
type sourceToken struct {
	tp    topicPartition
	epoch uint64
	d     *delivered
	part  *partState // the assignment it was handed out in, for Owns
}

type sourceConfig struct {
	common
	consumer       consumerCommon
	maxPerPart     int
	commitInterval time.Duration
	closeTimeout   time.Duration
}

// WithMaxPendingPerPartition bounds how many records of one partition the
// Source holds fetched and not yet acked (default 256): Next hands out no
// more of the partition, and its fetching pauses, until acks bring it down
// to half. The bound is what a partition stuck behind a failing record can
// take of a consumer's window
// ([effectively.dev/effects/consume.WithMaxPending]), and it caps a batch's
// run of one partition ([effectively.dev/effects/consume.WithBatch]): keep
// it at least twice the batch size. The cost is memory: up to n records per
// assigned partition. n must be at least 1.
func WithMaxPendingPerPartition(n int) SourceOption {
	return sourceOpt(func(c *sourceConfig) { c.maxPerPart = n })
}

// WithCommitInterval sets the shortest time between the starts of two group
// commits (default 100 ms). A commit is sent only when a mark advanced and
// the previous commit returned; 0 sends the next one as soon as the
// previous returned. Longer intervals send fewer OffsetCommit requests and
// redeliver more after a crash. d must not be negative.
func WithCommitInterval(d time.Duration) SourceOption {
	return sourceOpt(func(c *sourceConfig) { c.commitInterval = d })
}

// WithCloseTimeout bounds [Source.Close] (default 10 s): the final commit
// of the acked offsets and leaving the group, which otherwise waits for a
// rebalance in progress to finish (up to the group's rebalance timeout, a
// minute by default). d must be positive.
func WithCloseTimeout(d time.Duration) SourceOption {
	return sourceOpt(func(c *sourceConfig) { c.closeTimeout = d })
}

// NewSource creates a group consumer from clientOpts, which must name the
// seed brokers, kgo.ConsumerGroup and the topics (kgo.ConsumeTopics). Nil
// options are ignored; an invalid option, no consumer group or no topics
// (NewSource(nil) among them) is a *[effects.ConfigError] naming what is
// missing. NewSource sends no request: [Source.Check] asks the cluster
// whether the topics exist, and Next does once when it starts fetching.
//
// The Source owns the client and sets what its guarantee needs, after
// clientOpts: kgo.DisableAutoCommit, kgo.BlockRebalanceOnPoll (a rebalance
// waits until polled records are registered, so it never commits offsets
// of partitions it lost), and the OnPartitionsRevoked and
// OnPartitionsLost callbacks (yours would be replaced). Before clientOpts it
// sets kgo.FetchIsolationLevel(kgo.ReadCommitted()), so records of aborted
// transactions are not handed out unless you choose otherwise, and
// kgo.FetchMaxWait(500 * time.Millisecond), Kafka's own consumer default
// (franz-go's is 5 s), because a partition the Source resumes waits for
// the fetch in flight.
//
// It also sets kgo.WithContext, after clientOpts (yours would be replaced),
// with a context that only [Source.Close] cancels, when its bound expires.
//
// Fetching starts with the first call to Next.
func NewSource(clientOpts []kgo.Opt, opts ...SourceOption) (*Source, error) {
	const ctor = "kafka.NewSource"
	cfg, err := newSourceConfig(ctor, opts)
	if err != nil {
		return nil, err
	}
	s := &Source{
		cfg:   cfg,
		rep:   cfg.reporter(),
		stop:  make(chan struct{}),
		dirty: make(chan struct{}, 1),
		parts: map[topicPartition]*partState{},
		avail: make(chan struct{}, 1),
	}
	s.runCtx, s.cancelRun = context.WithCancel(context.Background())
	s.clientCtx, s.cancelClient = context.WithCancel(context.Background())
	all := append([]kgo.Opt{
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(defaultFetchMaxWait),
	}, clientOpts...)
	all = append(all,
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
		kgo.WithContext(s.clientCtx),
	)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		s.cancelRun()
		s.cancelClient()
		// franz-go refuses the options the Source adds when clientOpts
		// name no group: say that, in our words.
		if group, ok := groupOf(clientOpts); ok && group == "" {
			return nil, effects.ConfigErrorf(ctor, "clientOpts", "no consumer group (kgo.ConsumerGroup): a Source commits a group's offsets")
		}
		return nil, effects.ConfigErrorf(ctor, "clientOpts", "%v", err)
	}
	s.group, _ = cl.OptValue(kgo.ConsumerGroup).(string)
	s.topics, _ = cl.OptValue(kgo.ConsumeTopics).([]string)
	s.regex, _ = cl.OptValue(kgo.ConsumeRegex).(bool)
	if s.group == "" || len(s.topics) == 0 {
		cl.Close()
		s.cancelRun()
		s.cancelClient()
		if s.group == "" {
			return nil, effects.ConfigErrorf(ctor, "clientOpts", "no consumer group (kgo.ConsumerGroup): a Source commits a group's offsets")
		}
		return nil, effects.ConfigErrorf(ctor, "clientOpts", "no topics (kgo.ConsumeTopics): the Source would wait for records for ever")
	}
	if id, _ := cl.OptValue(kgo.InstanceID).(string); id != "" {
		s.instanceID = &id
	}
	s.cl = cl
	return s, nil
}

// newSourceConfig applies opts over the defaults and validates them.
func newSourceConfig(ctor string, opts []SourceOption) (sourceConfig, error) {
	cfg := sourceConfig{
		consumer:       consumerCommon{idHeader: KeyHeader, maxPoll: defaultMaxPoll},
		maxPerPart:     defaultMaxPendingPerPartition,
		commitInterval: defaultCommitInterval,
		closeTimeout:   defaultCloseTimeout,
	}
	for _, o := range opts {
		if o != nil {
			o.applySource(&cfg)
		}
	}
	if err := checkConsumer(ctor, &cfg.common, &cfg.consumer); err != nil {
		return cfg, err
	}
	switch {
	case cfg.maxPerPart < 1:
		return cfg, effects.ConfigErrorf(ctor, "WithMaxPendingPerPartition", "%d records; need at least 1", cfg.maxPerPart)
	case cfg.commitInterval < 0:
		return cfg, effects.ConfigErrorf(ctor, "WithCommitInterval", "negative interval %v", cfg.commitInterval)
	case cfg.closeTimeout <= 0:
		return cfg, effects.ConfigErrorf(ctor, "WithCloseTimeout", "%v; need a positive bound", cfg.closeTimeout)
	}
	return cfg, nil
}

// Client returns the underlying client, e.g. for kadm. Do not poll,
// commit, or pause and resume partitions with it.
func (s *Source) Client() *kgo.Client { return s.cl }

// start starts the poller and the committer, once.
func (s *Source) start() {
	s.startOnce.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			return
		}
		s.loops.Add(3)
		go s.poll()
		go s.committer()
		go s.checkAtStart()
	})
}

// Next returns the next record (see [Source] for which partition's). It
// blocks until one is available, ctx is done, or the source is closed
// ([ErrSourceClosed]). The first call starts fetching.
func (s *Source) Next(ctx context.Context) (effects.Delivery, error) {
	s.start()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return effects.Delivery{}, ErrSourceClosed
		}
		if s.fatal != nil {
			err := s.fatal
			s.mu.Unlock()
			s.signal() // the other callers of Next get it too
			return effects.Delivery{}, err
		}
		if p := s.pickLocked(); p != nil {
			rec := p.buf[0]
			p.buf[0] = nil
			p.buf = p.buf[1:]
			d := s.deliverLocked(p, rec)
			if len(p.buf) == 0 || p.unacked >= s.cfg.maxPerPart {
				s.unreadyLocked(p)
			}
			more := len(s.ready) > 0
			s.mu.Unlock()
			if more {
				s.signal() // another caller of Next may take the next one
			}
			return d, nil
		}
		s.mu.Unlock()
		select {
		case <-s.avail:
		case <-s.stop:
		case <-ctx.Done():
			return effects.Delivery{}, ctx.Err()
		}
	}
}

// signal wakes a waiting Next.
func (s *Source) signal() {
	select {
	case s.avail <- struct{}{}:
	default:
	}
}

// pickLocked returns the ready partition Next takes a record from: the
// one with the fewest deliveries handed out and not acked, so that a
// consumer whose window is full refills first the Orderings that are about
// to run dry; among equals, the partitions take turns.
func (s *Source) pickLocked() *partState {
	n := len(s.ready)
	best := -1
	for k := range n {
		i := (s.turn + k) % n
		if best < 0 || s.ready[i].unacked < s.ready[best].unacked {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	s.turn = best + 1
	return s.ready[best]
}

// markReadyLocked adds p to the partitions Next may take a record from,
// if it has one Next may hand out.
func (s *Source) markReadyLocked(p *partState) {
	if !p.inReady && !p.revoked && len(p.buf) > 0 && p.unacked < s.cfg.maxPerPart {
		p.inReady = true
		s.ready = append(s.ready, p)
	}
}

// unreadyLocked removes p from the ready partitions.
func (s *Source) unreadyLocked(p *partState) {
	if i := slices.Index(s.ready, p); i >= 0 {
		s.ready = slices.Delete(s.ready, i, i+1)
	}
	p.inReady = false
}

// deliverLocked hands out rec of p.
func (s *Source) deliverLocked(p *partState, rec *kgo.Record) effects.Delivery {
	d := &delivered{rec: rec}
	p.pending = append(p.pending, d)
	p.unacked++
	id, headers := recordID(rec, s.cfg.consumer.idHeader)
	ordering := partitionKey(rec.Topic, rec.Partition)
	return effects.Delivery{
		ID:       id,
		Ordering: ordering,
		Body:     rec.Value,
		Headers:  headers,
		Token:    &sourceToken{tp: p.tp, epoch: p.epoch, d: d, part: p},
	}
}

// poll fetches in the background until Close, and queues the records per
// partition.
func (s *Source) poll() {
	defer s.loops.Done()
	for {
		fs := s.cl.PollRecords(s.runCtx, s.cfg.consumer.maxPoll)
		stopped := fs.IsClientClosed() || s.runCtx.Err() != nil
		if !stopped {
			s.queue(fs)
		}
		// The records are registered: a revocation may run now and drop
		// the queued ones of revoked partitions.
		s.cl.AllowRebalance()
		if stopped {
			return
		}
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				s.report(fmt.Errorf("kafka.Source: fetch: %w", err))
			}
		})
	}
}

// queue adds polled records to their partitions' queues, and pauses the
// partitions that hold too many.
func (s *Source) queue(fs kgo.Fetches) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pause map[string][]int32
	woke := false
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		if len(fp.Records) == 0 {
			return
		}
		tp := topicPartition{fp.Topic, fp.Partition}
		p := s.parts[tp]
		if p == nil {
			p = &partState{tp: tp, epoch: s.epoch, committed: -1}
			s.parts[tp] = p
		}
		p.buf = append(p.buf, fp.Records...)
		if !p.paused && len(p.buf)+p.unacked >= s.cfg.maxPerPart {
			p.paused = true
			if pause == nil {
				pause = map[string][]int32{}
			}
			pause[tp.topic] = append(pause[tp.topic], tp.partition)
		}
		if !p.inReady {
			s.markReadyLocked(p)
			woke = woke || p.inReady
		}
	})
	if pause != nil {
		// Under s.mu, so that a resume decided by an Ack cannot overtake
		// it. The client strips the paused partitions' buffered records
		// and fetches them again after the resume.
		s.cl.PauseFetchPartitions(pause)
	}
	if woke {
		s.signal()
	}
}

// Ack marks d handled and advances its partition's mark over the
// contiguous acked prefix; the committer commits the mark with the next
// group commit (see [Source] for what a nil return promises). It returns
// [ErrRevoked] if d's partition was revoked (or a revocation started) since
// d was delivered, and [ErrSourceClosed] after Close: in both cases the
// record will be delivered again. Acking a delivery twice does nothing.
func (s *Source) Ack(_ context.Context, d effects.Delivery) error {
	tok, ok := d.Token.(*sourceToken)
	if !ok {
		return errors.New("kafka.Source.Ack: delivery was not handed out by this source")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("kafka.Source.Ack %s/%d: %w", tok.tp.topic, tok.tp.partition, ErrSourceClosed)
	}
	p := s.parts[tok.tp]
	if p == nil || p.epoch != tok.epoch || p.revoked {
		return fmt.Errorf("kafka.Source.Ack %s/%d: %w", tok.tp.topic, tok.tp.partition, ErrRevoked)
	}
	if tok.d.acked {
		return nil
	}
	tok.d.acked = true
	p.unacked--
	advanced := false
	for len(p.pending) > 0 && p.pending[0].acked {
		r := p.pending[0].rec
		p.pending[0] = nil
		p.pending = p.pending[1:]
		p.through = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}
		advanced = true
	}
	if p.paused && len(p.buf)+p.unacked <= s.cfg.maxPerPart/2 {
		p.paused = false
		s.cl.ResumeFetchPartitions(map[string][]int32{tok.tp.topic: {tok.tp.partition}})
	}
	if !p.inReady {
		s.markReadyLocked(p)
		if p.inReady {
			s.signal()
		}
	}
	if advanced {
		select {
		case s.dirty <- struct{}{}:
		default:
		}
	}
	return nil
}

// Owns reports whether d's partition is still assigned to this member in
// the assignment d was handed out in: false once the group revoked it or
// it was lost (the member missed its session, a frozen process), also if
// the group assigned it back since. A [effectively.dev/effects/consume.Consumer]
// asks before every attempt and drops the deliveries this member lost (see
// [effects.OwnershipChecker]): their acks would fail with [ErrRevoked],
// and the partition's new owner handles them. Owns does not block; it
// reads one atomic flag. It reports false for a delivery this Source did
// not hand out.
func (s *Source) Owns(d effects.Delivery) bool {
	tok, ok := d.Token.(*sourceToken)
	return ok && tok.part != nil && !tok.part.gone.Load()
}

// Record returns the Kafka record a [Source] or a [ShareSource] handed
// out as d, and false for a delivery neither handed out. It is for a
// dead-letter hook that keeps the record's topic, partition and offset
// (its identity when Delivery.ID is empty or cannot be trusted), key or
// headers; do not modify the record.
func Record(d effects.Delivery) (*kgo.Record, bool) {
	switch tok := d.Token.(type) {
	case *sourceToken:
		if tok != nil && tok.d != nil {
			return tok.d.rec, true
		}
	case *shareHeld:
		if tok != nil {
			return tok.rec, true
		}
	}
	return nil, false
}

// committer sends group commits until Close: one at a time, each when a
// mark advanced, the previous commit returned and the interval since its
// start passed. A failed commit is retried with a backoff.
func (s *Source) committer() {
	defer s.loops.Done()
	var (
		last     time.Time
		failures int
	)
	for {
		select {
		case <-s.dirty:
		case <-s.stop:
			return
		}
		wait := s.cfg.commitInterval
		if failures > 0 {
			wait = max(wait, retry.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}.Delay(failures))
		}
		if d := wait - time.Since(last); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-s.stop:
				t.Stop()
				return
			}
		}
		last = time.Now()
		ctx, cancel := context.WithTimeout(s.runCtx, commitTimeout)
		s.commitMu.Lock()
		err := s.commitLocked(ctx)
		s.commitMu.Unlock()
		cancel()
		if err == nil {
			failures = 0
			continue
		}
		if s.runCtx.Err() != nil {
			return // closing: Close commits
		}
		failures++
		s.report(err)
		select { // try again
		case s.dirty <- struct{}{}:
		default:
		}
	}
}

// Flush commits every partition's mark now, if it advanced since the last
// commit, and waits for the broker's answer (after the commit in flight, if
// any). It returns the commit's error, and [ErrSourceClosed] after Close.
// Flush is not needed for correctness; it is for tests, and for programs
// that want the offsets stored at a point of their choosing.
func (s *Source) Flush(ctx context.Context) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ErrSourceClosed
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	return s.commitLocked(ctx)
}

// commitLocked commits the mark of every partition that advanced past what
// the group stored. The caller holds commitMu.
//
// The request carries the member id and generation read before the marks
// were: kgo's CommitOffsetsSync would wait out a rebalance in progress and
// then send the marks of the old assignment with the new generation, which
// the coordinator accepts from any member, for any partition. After a
// member was dropped and rejoined, that moved a partition's offset back
// below what its new owner had committed meanwhile (seen in the rebalance
// torture). Pinned to the generation of the marks, such a commit is
// refused (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID) and retried with fresh
// marks.
func (s *Source) commitLocked(ctx context.Context) error {
	member, generation := s.cl.GroupMetadata()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.MemberID, req.Generation = s.group, member, generation
	req.InstanceID = s.instanceID
	offsets := map[topicPartition]int64{}
	epochs := map[topicPartition]uint64{}
	byTopic := map[string]int{}
	s.mu.Lock()
	for tp, p := range s.parts {
		if p.through.Offset <= p.committed || p.through.Offset == 0 {
			continue
		}
		i, ok := byTopic[tp.topic]
		if !ok {
			i = len(req.Topics)
			byTopic[tp.topic] = i
			t := kmsg.NewOffsetCommitRequestTopic()
			t.Topic = tp.topic
			req.Topics = append(req.Topics, t)
		}
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset, rp.LeaderEpoch = tp.partition, p.through.Offset, p.through.Epoch
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
		offsets[tp], epochs[tp] = p.through.Offset, p.epoch
	}
	s.mu.Unlock()
	if len(offsets) == 0 {
		return nil
	}
	if member == "" || generation < 0 {
		return errors.New("kafka.Source: committing offsets: not in the group yet")
	}
	// OffsetCommit v10 names topics by id.
	names := map[[16]byte]string{}
	for i := range req.Topics {
		id, err := s.topicID(ctx, req.Topics[i].Topic)
		if err != nil {
			return fmt.Errorf("kafka.Source: committing offsets: %w", err)
		}
		req.Topics[i].TopicID, names[id] = id, req.Topics[i].Topic
	}
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return fmt.Errorf("kafka.Source: committing offsets: %w", err)
	}
	var errs []error
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range resp.Topics {
		if t.Topic == "" {
			t.Topic = names[t.TopicID]
		}
		for _, rp := range t.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				errs = append(errs, fmt.Errorf("%s/%d: %w", t.Topic, rp.Partition, err))
				continue
			}
			tp := topicPartition{t.Topic, rp.Partition}
			if p := s.parts[tp]; p != nil && p.epoch == epochs[tp] {
				p.committed = max(p.committed, offsets[tp])
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("kafka.Source: committing offsets: %w", errors.Join(errs...))
	}
	return nil
}

// topicID returns topic's id, from a metadata request the first time.
func (s *Source) topicID(ctx context.Context, topic string) ([16]byte, error) {
	s.mu.Lock()
	id, ok := s.topicIDs[topic]
	s.mu.Unlock()
	if ok {
		return id, nil
	}
	req := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return id, fmt.Errorf("looking up the id of topic %s: %w", topic, err)
	}
	for _, rt := range resp.Topics {
		if rt.Topic != nil && *rt.Topic == topic {
			if err := kerr.ErrorForCode(rt.ErrorCode); err != nil {
				return id, fmt.Errorf("looking up the id of topic %s: %w", topic, err)
			}
			s.mu.Lock()
			if s.topicIDs == nil {
				s.topicIDs = map[string][16]byte{}
			}
			s.topicIDs[topic] = rt.TopicID
			s.mu.Unlock()
			return rt.TopicID, nil
		}
	}
	return id, fmt.Errorf("looking up the id of topic %s: not in the metadata response", topic)
}

// report hands err to the observer, or logs it.
func (s *Source) report(err error) {
	s.rep.Report(s.runCtx, effects.Event{Kind: effects.EventFailed, Component: "kafka.Source", Err: err},
		slog.LevelWarn, "kafka.Source: retrying after an error")
}

// onRevoked commits the marks, then forgets the revoked partitions:
// their unacked deliveries, and acks that arrive from now on, are
// redelivered by the new owner.
func (s *Source) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	if len(revoked) == 0 {
		return
	}
	s.mu.Lock()
	for topic, ps := range revoked {
		for _, p := range ps {
			if st := s.parts[topicPartition{topic, p}]; st != nil {
				st.revoked = true
				st.gone.Store(true)
				s.unreadyLocked(st) // its records go to the new owner
			}
		}
	}
	s.mu.Unlock()
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, commitTimeout)
	err := s.commitLocked(cctx)
	cancel()
	if err != nil {
		s.report(err)
	}
	s.forget(revoked)
}

// onLost forgets lost partitions without committing: the member no longer
// belongs to the group, so its commits would be refused.
func (s *Source) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.forget(lost)
}

// forget drops the state of parts, and resumes those the Source paused, so
// that fetching starts afresh if the group assigns them again.
func (s *Source) forget(parts map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch++
	var resume map[string][]int32
	for topic, ps := range parts {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			st := s.parts[tp]
			if st == nil {
				continue
			}
			st.gone.Store(true)
			if st.paused {
				if resume == nil {
					resume = map[string][]int32{}
				}
				resume[topic] = append(resume[topic], p)
			}
			delete(s.parts, tp)
		}
	}
	s.ready = slices.DeleteFunc(s.ready, func(p *partState) bool {
		if s.parts[p.tp] == p {
			return false
		}
		p.inReady = false
		return true
	})
	if resume != nil {
		s.cl.ResumeFetchPartitions(resume)
	}
}

// Close stops fetching, commits the marks, leaves the group and closes the
// client, within [WithCloseTimeout]'s bound (default 10 s). Unacked
// deliveries are delivered again to the group's next owner of their
// partitions. Next, Ack and Flush return [ErrSourceClosed] afterwards.
//
// The commit and the leave can each wait for a rebalance in progress (the
// broker parks the member's JoinGroup until every member rejoined or the
// rebalance timeout passed; kgo holds commits meanwhile). When the bound
// expires, Close cancels the client's requests and returns: acked
// deliveries whose offsets were not committed by then are delivered again,
// to the partition's next owner, and replayed by the idempotent handler
// (the same as after a crash), and the member, which did not leave, stays
// in the group until its session times out, holding its partitions that
// long. Close returns the commit's error, or the bound's
// (context.DeadlineExceeded) if it expired.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	s.cancelRun() // the poller's poll and the committer's commit
	s.loops.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.closeTimeout)
	defer cancel()
	s.commitMu.Lock()
	err := s.commitLocked(ctx)
	s.commitMu.Unlock()
	left := make(chan struct{})
	go func() {
		defer close(left)
		s.cl.CloseAllowingRebalance()
	}()
	select {
	case <-left:
	case <-ctx.Done():
		// A join or sync in flight: interrupt it, and with it the leave.
		s.cancelClient()
		<-left
		if err == nil {
			err = fmt.Errorf("kafka.Source.Close: leaving the group: %w", ctx.Err())
		}
	}
	s.cancelClient()
	return err
}

// recordID returns rec's delivery id and its headers as a map. The id is
// the first header named idHeader, even when it is empty: an empty one is
// handed out as an empty id (which NewKey refuses, so a consumer
// dead-letters the delivery), never replaced by the record's position,
// which changes when an event is resent. Only a record without the header
// gets "topic/partition/offset".
func recordID(rec *kgo.Record, idHeader string) (id string, headers map[string]string) {
	headers = make(map[string]string, len(rec.Headers))
	found := false
	for _, h := range rec.Headers {
		if _, dup := headers[h.Key]; dup {
			continue // the first of several headers with one name counts, as for the id
		}
		headers[h.Key] = string(h.Value)
		if h.Key == idHeader {
			id, found = string(h.Value), true
		}
	}
	if !found {
		id = partitionKey(rec.Topic, rec.Partition) + "/" + strconv.FormatInt(rec.Offset, 10)
	}
	return id, headers
}

// groupOf reads the consumer group clientOpts name, with a client that
// consumes nothing and is closed at once (no request is sent). It reports
// false when franz-go refuses clientOpts themselves.
func groupOf(clientOpts []kgo.Opt) (string, bool) {
	probe, err := kgo.NewClient(append(slices.Clip(clientOpts), kgo.ConsumeTopics(), kgo.ConsumePartitions(nil))...)
	if err != nil {
		return "", false
	}
	defer probe.Close()
	group, _ := probe.OptValue(kgo.ConsumerGroup).(string)
	return group, true
}

// startRecheck is how long the start-up check waits before asking again
// about a topic the cluster did not know: a topic created just before the
// Source started may take that long to reach every broker's metadata.
const startRecheck = time.Second

// checkAtStart runs [Source.Check] once fetching started. A configuration
// error (a topic the cluster does not have, a refused authorization) that
// a second check confirms makes Next return it, so that a consumer stops
// instead of waiting for records that cannot come; any other failure is
// reported ([WithObserver]) while franz-go keeps trying.
func (s *Source) checkAtStart() {
	defer s.loops.Done()
	check := func() error {
		ctx, cancel := context.WithTimeout(s.runCtx, commitTimeout)
		defer cancel()
		return s.Check(ctx)
	}
	err := check()
	if effects.ClassOf(err) == effects.InvalidConfig {
		select {
		case <-s.stop:
			return
		case <-time.After(startRecheck):
		}
		err = check()
	}
	switch {
	case err == nil || s.runCtx.Err() != nil:
	case effects.ClassOf(err) == effects.InvalidConfig:
		s.report(err)
		s.mu.Lock()
		s.fatal = err
		s.mu.Unlock()
		s.signal()
	default:
		s.report(err)
	}
}

// Check asks the cluster about the Source's configuration (see
// [effects.Checker]): that the brokers answer, that every topic named
// with kgo.ConsumeTopics exists and may be read, and that the client may
// use the consumer group. It returns nil when they do; a configuration
// error (errors.Is [effects.ErrInvalidConfig], naming the topic or the
// group) for a topic the cluster does not have or a refused
// authorization; [effects.ErrTransient] when the brokers do not answer
// before ctx ends. Topics given as patterns (kgo.ConsumeRegex) are not
// checked. Check sends a Metadata and a DescribeGroups request; it does
// not join the group.
//
// Next runs it once when fetching starts: a configuration error found
// then (and confirmed a second later) is what Next returns from then on,
// and reported to the observer ([WithObserver]), so a misspelled topic stops
// a consumer instead of leaving it idle.
func (s *Source) Check(ctx context.Context) error {
	const op = "kafka.Source.Check"
	if !s.regex {
		if err := checkTopics(ctx, op, s.cl, s.topics); err != nil {
			return err
		}
	}
	return checkGroup(ctx, op, s.cl, s.group)
}

var _ effects.Checker = (*Source)(nil)
