package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/internal/ratelog"
)

// ErrLockExpired is returned (wrapped) by [ShareSource.Ack] and
// [ShareSource.Release] for a delivery whose acquisition lock ran out
// before the call: the broker hands the record to a member again (perhaps
// another process, perhaps while this handler still runs), and that
// delivery is handled again. The effect was done; an idempotent effect
// replays it.
var ErrLockExpired = errors.New("kafka: share-group acquisition lock expired; the record is delivered again")

// errDeliveryLimit is what [ShareSource.Release] returns (wrapped) for a
// delivery on the group's last allowed delivery ([WithDeliveryLimit]):
// released, the broker would archive it without a handler or the
// dead-letter hook seeing it again, so the source keeps it and the
// consumer retries it in place and then dead-letters it. It wraps
// [effects.ErrNotReleased], so the consumer does not count the refusal as
// a failure.
var errDeliveryLimit = fmt.Errorf("kafka: record on its share group's last allowed delivery: %w", effects.ErrNotReleased)

// Defaults of a [ShareSource], used when the matching option is not given.
const (
	// defaultShareMembers is how many share-group members (clients) one
	// ShareSource runs.
	defaultShareMembers = 4
	// defaultShareMaxPoll is how many records one member fetches at a time.
	defaultShareMaxPoll = 32
	// defaultDeliveryLimit is Kafka's default share.delivery.count.limit:
	// the broker archives a record after this many deliveries.
	defaultDeliveryLimit = 5
	// defaultRenewBefore is how long before its acquisition deadline a held
	// record's lock is renewed (at most half the lock).
	defaultRenewBefore = 10 * time.Second
	// defaultLockMargin is how long before its acquisition deadline a
	// record stops being this source's to start handling (at most a
	// quarter of the lock): the deadline is the client's estimate, and an
	// attempt started at the last moment would mostly run unowned.
	defaultLockMargin = 2 * time.Second
)

// shareCloseTimeout bounds Close's flushing of acks and leaving the group.
const shareCloseTimeout = 10 * time.Second

// shareTick is how often a member's renewer looks for locks to renew.
const shareTick = 200 * time.Millisecond

// ShareSource is an [effects.Source] over a Kafka share group (KIP-932,
// queues for Kafka): every record is acquired, handled and acknowledged on
// its own, any number of members share a partition, and a record stuck in
// a slow handler holds back no partition (only its member client's next
// poll; see "Members and polls" below).
//
// # When to use it
//
// Use [Source] when records of one key must be handled in order: it hands
// out each partition's records in offset order (Delivery.Ordering) and
// commits offsets. Use ShareSource when order does not matter and
// throughput or isolation does: deliveries have no Ordering, so a
// consumer runs as many at once as it has handlers (more handlers than
// partitions is the point), and a slow or failing record does not block
// the records behind it.
//
// # Acquisition and acknowledgement
//
// The broker lends each record to one member for an acquisition lock
// (share.record.lock.duration.ms, 30 s by default). Next hands out the
// records its members acquired; [ShareSource.Ack] accepts a record (the
// consumer calls it after the handler's effects committed);
// [ShareSource.Release] hands it back for redelivery, raising its
// delivery count; [ShareSource.Close] releases everything not acked.
// franz-go sends the acknowledgements in the background, batched per
// partition (at once with the next fetch, else within a second), and Close
// and every poll flush them first. Delivery.Attempt is the record's
// delivery count, so [effectively.dev/effects/consume.WithMaxAttempts] counts across members and
// processes.
//
// Acknowledgements travel in batches per partition: if the broker refuses
// one record's (its lock had expired), it refuses the partition's batch,
// and those records are delivered again once their locks expire. An
// effectively-once handler replays them.
//
// # Effects longer than the lock
//
// A record a handler is running, or one the consumer holds for a retry's
// backoff, is renewed in the background (KIP-1222, Kafka 4.2) when less
// than 10 s (at most half the lock) of its lock is left. A handler that outlives its
// lock anyway (a process frozen by a debugger, SIGSTOP or a long GC pause
// cannot renew) loses the record: the broker delivers it to another member
// while the first may still run, and both run the effect concurrently,
// which is the duplicate an effectively-once effect absorbs (postgres's
// claim, Stripe's idempotency key). [ShareSource.Owns] says whether a
// delivery's lock still holds, so the consumer does not start an attempt
// on a record whose lock it lost, and Ack of such a record returns
// [ErrLockExpired] instead of sending an acknowledgement the broker
// refuses.
//
// # Delivery limit and retries
//
// The broker archives a record after share.delivery.count.limit
// deliveries (5 by default) without delivering it again. A consumer
// configured with [effectively.dev/effects/consume.WithMaxAttempts] higher than that would never
// see its dead-letter hook run: the broker would drop the record first.
// So Release refuses (an error wrapping [effects.ErrNotReleased]) to
// release a record on its last allowed delivery; the consumer keeps it,
// retries it in place (renewed by the source), and gives it to the
// dead-letter hook when its attempts run out. Set [WithDeliveryLimit] to the group's configured limit.
//
// # Dead letters: accepted
//
// After the dead-letter hook took a delivery, the consumer acks it, and
// Ack accepts it (AckAccept), like every other ack: the hook handled the
// record (moved it aside for a human), and the group is done with it.
// Rejecting it (AckReject) would archive it too, but would report as
// unprocessable a record the application did process; and an Ack cannot
// tell a dead-lettered delivery from a handled one anyway.
//
// # Members and polls
//
// franz-go accepts, at the next poll, every record of the previous poll
// not yet acknowledged (Renews do not persist across polls). So a member
// polls again only once every record of its previous poll was accepted,
// released, or its lock expired (then the source releases it), and each
// poll takes everything the client fetched, so that no record waits
// acquired in the client's buffer. A record stuck in a handler so holds
// back its member's next poll, not the source: the source runs
// [WithShareMembers] members (clients), each fetching at most
// [WithMaxPoll] records at a time (kgo.ShareMaxRecords with
// kgo.ShareMaxRecordsStrict), and the others go on. A member's client may
// have fetched one more batch before its poll was held back: those
// records wait behind the stuck one, unrenewed (if their locks expire
// first, the broker gives them to other members), which is the
// head-of-line blocking left, bounded by the poll size.
//
// # Crashes and the delivery limit
//
// Every acquisition counts toward share.delivery.count.limit, including
// those that end in a crash, a frozen process or a Close (kfake also lets
// a closing member's in-flight fetch acquire a record once more). A record
// delivered that many times without an accept is archived by the broker
// without a handler seeing it again: with the default limit of 5, a
// record caught in five crashes is lost to the consumer. Raise the
// group's limit (Kafka allows up to 10) where crashes are frequent, and
// watch the group's archived records.
//
// Delivery.ID comes from the id header ([KeyHeader] by default, see
// [WithIDHeader]), else "topic/partition/offset"; a header that is
// present but empty gives an empty ID, as with [Source] (NewKey refuses it:
// the consumer dead-letters the delivery). Delivery.Ordering is empty.
type ShareSource struct {
	cfg     shareConfig
	members []*shareMember
	rep     ratelog.Reporter

	startOnce sync.Once
	stop      chan struct{} // closed by Close
	runCtx    context.Context
	cancelRun context.CancelFunc
	loops     sync.WaitGroup // the members' pollers and renewers

	mu     sync.Mutex
	queue  []*shareHeld  // polled, not handed out
	avail  chan struct{} // a record was queued (capacity 1)
	closed bool
}

var (
	_ effects.Source           = (*ShareSource)(nil)
	_ effects.Releaser         = (*ShareSource)(nil)
	_ effects.OwnershipChecker = (*ShareSource)(nil)
)

// shareMember is one client in the share group, and the records of its
// last poll.
type shareMember struct {
	cl    *kgo.Client
	batch []*shareHeld  // the last poll's records
	held  int           // of batch, not yet settled
	wake  chan struct{} // held reached 0, or a lock may have expired (capacity 1)

	// refused collects the partitions whose acknowledgements the broker
	// refused while a renewal of this member's locks is being flushed
	// (nil otherwise): their renewals do not extend a deadline.
	refused map[string]bool
}

// shareHeld is one acquired record: Delivery.Token.
type shareHeld struct {
	rec      *kgo.Record
	m        *shareMember
	lock     time.Duration // the lock's length, as seen at the poll
	deadline time.Time     // the source's estimate of the lock's end
	settled  bool          // accepted, released, or given up as expired
	accepted bool
}

type shareConfig struct {
	common
	consumer      consumerCommon
	members       int
	deliveryLimit int
	renewBefore   time.Duration
	lockMargin    time.Duration
}

// WithShareMembers sets how many share-group members (kgo clients, each
// with its own connections and heartbeat) the source runs (default 4). A
// record stuck in a handler holds back one member's polls: n is how many
// stuck records the source absorbs before it stops taking new ones. n must
// be at least 1.
func WithShareMembers(n int) ShareOption {
	return shareOpt(func(c *shareConfig) { c.members = n })
}

// WithDeliveryLimit tells the source the group's share.delivery.count.limit
// (default 5, Kafka's default): Release refuses a delivery whose delivery
// count reached it ([effects.ErrNotReleased]), so the broker does not archive it
// unseen. 0 lets Release release every delivery (the broker's limit then
// decides). n must not be negative.
func WithDeliveryLimit(n int) ShareOption {
	return shareOpt(func(c *shareConfig) { c.deliveryLimit = n })
}

// withRenewBefore sets how long before a held record's acquisition deadline
// the source renews its lock (default 10 s; at most half the lock is used).
// d must be positive.
func withRenewBefore(d time.Duration) ShareOption {
	return shareOpt(func(c *shareConfig) { c.renewBefore = d })
}

// withLockMargin sets how long before its acquisition deadline a record
// stops being owned ([ShareSource.Owns]; default 2 s; at most a quarter of
// the lock is used). d must not be negative and must be less than the renew
// lead ([withRenewBefore]).
func withLockMargin(d time.Duration) ShareOption {
	return shareOpt(func(c *shareConfig) { c.lockMargin = d })
}

// NewShareSource creates a share-group consumer from clientOpts, which
// must name the seed brokers, kgo.ShareGroup and the topics
// (kgo.ConsumeTopics), and must not name a kgo.ConsumerGroup. Nil options
// are ignored; an invalid option or a missing share group is a
// *[effects.ConfigError].
//
// The source creates [WithShareMembers] clients from clientOpts, all in
// the same share group. Before clientOpts it sets kgo.ShareMaxRecords to
// the poll size and kgo.ShareMaxRecordsStrict; after them,
// kgo.ShareAckCallback (yours would be replaced). The group's share.auto.offset.reset (a group config, "latest"
// by default) decides whether records produced before the group first
// consumed are delivered.
//
// Fetching starts with the first call to Next.
func NewShareSource(clientOpts []kgo.Opt, opts ...ShareOption) (*ShareSource, error) {
	const ctor = "kafka.NewShareSource"
	cfg, err := newShareConfig(ctor, opts)
	if err != nil {
		return nil, err
	}
	s := &ShareSource{cfg: cfg, rep: cfg.reporter(), stop: make(chan struct{}), avail: make(chan struct{}, 1)}
	s.runCtx, s.cancelRun = context.WithCancel(context.Background())
	fail := func(option, format string, args ...any) (*ShareSource, error) {
		for _, m := range s.members {
			m.cl.Close()
		}
		s.cancelRun()
		return nil, effects.ConfigErrorf(ctor, option, format, args...)
	}
	for range cfg.members {
		all := append([]kgo.Opt{kgo.ShareMaxRecords(int32(min(cfg.consumer.maxPoll, 1<<30))), kgo.ShareMaxRecordsStrict()}, clientOpts...)
		all = append(all, kgo.ShareAckCallback(s.onAcks))
		cl, err := kgo.NewClient(all...)
		if err != nil {
			return fail("clientOpts", "%v", err)
		}
		s.members = append(s.members, &shareMember{cl: cl, wake: make(chan struct{}, 1)})
		if g, _ := cl.OptValue(kgo.ShareGroup).(string); g == "" {
			return fail("clientOpts", "no share group (kgo.ShareGroup)")
		}
		if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g != "" {
			return fail("clientOpts", "consumer group %q with a share group: a ShareSource is a share-group member only (use NewSource for a consumer group)", g)
		}
		if topics, _ := cl.OptValue(kgo.ConsumeTopics).([]string); len(topics) == 0 {
			return fail("clientOpts", "no topics (kgo.ConsumeTopics)")
		}
	}
	return s, nil
}

// newShareConfig applies opts over the defaults and validates them.
func newShareConfig(ctor string, opts []ShareOption) (shareConfig, error) {
	cfg := shareConfig{
		consumer:      consumerCommon{idHeader: KeyHeader, maxPoll: defaultShareMaxPoll},
		members:       defaultShareMembers,
		deliveryLimit: defaultDeliveryLimit,
		renewBefore:   defaultRenewBefore,
		lockMargin:    defaultLockMargin,
	}
	for _, o := range opts {
		if o != nil {
			o.applyShare(&cfg)
		}
	}
	if err := checkConsumer(ctor, &cfg.common, &cfg.consumer); err != nil {
		return cfg, err
	}
	switch {
	case cfg.members < 1:
		return cfg, effects.ConfigErrorf(ctor, "WithShareMembers", "%d members; need at least 1", cfg.members)
	case cfg.deliveryLimit < 0:
		return cfg, effects.ConfigErrorf(ctor, "WithDeliveryLimit", "negative limit %d; 0 means no limit", cfg.deliveryLimit)
	case cfg.renewBefore <= 0:
		return cfg, effects.ConfigErrorf(ctor, "withRenewBefore", "%v; need a positive duration", cfg.renewBefore)
	case cfg.lockMargin < 0:
		return cfg, effects.ConfigErrorf(ctor, "withLockMargin", "negative margin %v", cfg.lockMargin)
	case cfg.lockMargin >= cfg.renewBefore:
		return cfg, effects.ConfigErrorf(ctor, "withLockMargin", "margin %v is not less than the renew lead %v (withRenewBefore): locks would lapse before their renewal", cfg.lockMargin, cfg.renewBefore)
	}
	return cfg, nil
}

// Clients returns the source's clients, one per member, e.g. for kadm. Do
// not poll or acknowledge with them.
func (s *ShareSource) Clients() []*kgo.Client {
	out := make([]*kgo.Client, len(s.members))
	for i, m := range s.members {
		out[i] = m.cl
	}
	return out
}

// start starts the members' pollers and renewers, once.
func (s *ShareSource) start() {
	s.startOnce.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			return
		}
		s.loops.Add(2 * len(s.members))
		for _, m := range s.members {
			go s.poll(m)
			go s.renewer(m)
		}
	})
}

// Next returns the next acquired record, skipping (and releasing) those
// whose lock ran out while they were queued. It blocks until one is
// available, ctx is done, or the source is closed ([ErrSourceClosed]).
// The first call starts fetching.
func (s *ShareSource) Next(ctx context.Context) (effects.Delivery, error) {
	s.start()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return effects.Delivery{}, ErrSourceClosed
		}
		now := time.Now()
		for len(s.queue) > 0 {
			h := s.queue[0]
			s.queue[0] = nil
			s.queue = s.queue[1:]
			if len(s.queue) == 0 {
				s.wakeAllLocked() // members may poll
			}
			if h.settled {
				continue
			}
			if !s.ownsLocked(h, now) {
				s.settleLocked(h, kgo.AckRelease)
				continue
			}
			more := len(s.queue) > 0
			s.mu.Unlock()
			if more {
				signal(s.avail)
			}
			return s.delivery(h), nil
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

// delivery makes h's record a Delivery.
func (s *ShareSource) delivery(h *shareHeld) effects.Delivery {
	rec := h.rec
	id, headers := recordID(rec, s.cfg.consumer.idHeader)
	return effects.Delivery{
		ID:      id,
		Body:    rec.Value,
		Headers: headers,
		Attempt: int(rec.DeliveryCount()),
		Token:   h,
	}
}

// signal wakes whoever waits on ch (capacity 1).
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (s *ShareSource) wakeAllLocked() {
	for _, m := range s.members {
		signal(m.wake)
	}
}

// heldOf returns d's record, or an error naming op if d was not handed out
// by this source.
func (s *ShareSource) heldOf(op string, d effects.Delivery) (*shareHeld, error) {
	h, ok := d.Token.(*shareHeld)
	if !ok || h == nil {
		return nil, fmt.Errorf("kafka.ShareSource.%s: delivery was not handed out by a ShareSource", op)
	}
	for _, m := range s.members {
		if h.m == m {
			return h, nil
		}
	}
	return nil, fmt.Errorf("kafka.ShareSource.%s: delivery was handed out by another ShareSource", op)
}

// Ack accepts d's record (after its handler's effects committed): the
// group is done with it. The acknowledgement goes to the broker in the
// background, within about a second, and at once on the member's next
// poll or on Close. Ack returns [ErrLockExpired] if d's acquisition lock
// ran out (the record is delivered again), and [ErrSourceClosed] after
// Close (Close released it). Acking a delivery twice does nothing.
func (s *ShareSource) Ack(_ context.Context, d effects.Delivery) error {
	h, err := s.heldOf("Ack", d)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case h.accepted:
		return nil
	case s.closed:
		return fmt.Errorf("kafka.ShareSource.Ack %s: %w", d.ID, ErrSourceClosed)
	case h.settled:
		return fmt.Errorf("kafka.ShareSource.Ack %s: released before the ack: %w", d.ID, ErrLockExpired)
	case !time.Now().Before(h.deadline):
		s.settleLocked(h, kgo.AckRelease)
		return fmt.Errorf("kafka.ShareSource.Ack %s: %w", d.ID, ErrLockExpired)
	}
	s.settleLocked(h, kgo.AckAccept)
	return nil
}

// Release hands d's record back to the broker for redelivery (AckRelease),
// to this source or another member, with its delivery count raised. It
// refuses (an error wrapping [effects.ErrNotReleased]) a record on its
// last allowed delivery ([WithDeliveryLimit]), and returns
// [ErrLockExpired] for one whose lock ran out: in both cases the consumer
// keeps the delivery and retries it in place.
func (s *ShareSource) Release(_ context.Context, d effects.Delivery) error {
	h, err := s.heldOf("Release", d)
	if err != nil {
		return err
	}
	if n := int(h.rec.DeliveryCount()); s.cfg.deliveryLimit > 0 && n >= s.cfg.deliveryLimit {
		return fmt.Errorf("kafka.ShareSource.Release %s: delivery %d of at most %d: %w", d.ID, n, s.cfg.deliveryLimit, errDeliveryLimit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return fmt.Errorf("kafka.ShareSource.Release %s: %w", d.ID, ErrSourceClosed)
	case h.accepted:
		return fmt.Errorf("kafka.ShareSource.Release %s: already accepted", d.ID)
	case h.settled || !time.Now().Before(h.deadline):
		s.settleLocked(h, kgo.AckRelease)
		return fmt.Errorf("kafka.ShareSource.Release %s: %w", d.ID, ErrLockExpired)
	}
	s.settleLocked(h, kgo.AckRelease)
	return nil
}

// Owns reports whether d's acquisition lock still holds, with a safety
// margin (2 s, at most a quarter of the lock), so that an attempt started now is not
// running on a record the broker gave to another member. The source
// renews the locks of the records it holds, so Owns turns false only for
// a record whose renewal failed to keep up (a frozen process) or that was
// acked, released, or closed.
func (s *ShareSource) Owns(d effects.Delivery) bool {
	h, ok := d.Token.(*shareHeld)
	if !ok || h == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || h.settled {
		return false
	}
	if s.ownsLocked(h, time.Now()) {
		return true
	}
	// Its lock is about to lapse, or did: the consumer drops it, so give
	// it up now. Left held, it would be renewed for nobody and hold back
	// its member's next poll for good.
	s.settleLocked(h, kgo.AckRelease)
	return false
}

func (s *ShareSource) ownsLocked(h *shareHeld, now time.Time) bool {
	margin := min(s.cfg.lockMargin, h.lock/4)
	return now.Before(h.deadline.Add(-margin))
}

// settleLocked gives h's record its final status, once, and lets its
// member poll again when its batch is all settled.
func (s *ShareSource) settleLocked(h *shareHeld, status kgo.AckStatus) {
	if h.settled {
		return
	}
	h.settled = true
	h.accepted = status == kgo.AckAccept
	h.rec.Ack(status)
	h.m.held--
	if h.m.held == 0 {
		signal(h.m.wake)
	}
}

// poll runs one member until Close: it polls when every record of its
// previous poll is settled and the queue is not full, after flushing its
// acknowledgements (franz-go would accept at the poll whatever is left).
func (s *ShareSource) poll(m *shareMember) {
	defer s.loops.Done()
	for {
		if !s.waitToPoll(m) {
			return
		}
		fctx, cancel := context.WithTimeout(s.runCtx, commitTimeout)
		if err := m.cl.FlushAcks(fctx); err != nil && s.runCtx.Err() == nil {
			s.report(fmt.Errorf("kafka.ShareSource: flushing acknowledgements: %w", err))
		}
		cancel()
		// Everything the client fetched: records left in its buffer
		// would stay acquired, and unrenewed, until the next poll, which
		// waits for this one's records to settle.
		fs := m.cl.PollFetches(s.runCtx)
		if fs.IsClientClosed() || s.runCtx.Err() != nil {
			return
		}
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				s.report(fmt.Errorf("kafka.ShareSource: fetch: %w", err))
			}
		})
		s.take(m, fs)
	}
}

// waitToPoll waits until m may poll: its previous poll's records all
// settled (those whose lock expired are released here) and the queue
// shorter than one poll. It returns false on Close.
func (s *ShareSource) waitToPoll(m *shareMember) bool {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return false
		}
		now := time.Now()
		next := now.Add(time.Second)
		for _, h := range m.batch {
			if h.settled {
				continue
			}
			if !now.Before(h.deadline) {
				s.settleLocked(h, kgo.AckRelease) // the broker took it back
				continue
			}
			if h.deadline.Before(next) {
				next = h.deadline
			}
		}
		if m.held == 0 && len(s.queue) < s.cfg.consumer.maxPoll {
			clear(m.batch)
			m.batch = m.batch[:0]
			s.mu.Unlock()
			return true
		}
		s.mu.Unlock()
		t := time.NewTimer(time.Until(next))
		select {
		case <-m.wake:
		case <-s.stop:
		case <-t.C:
		}
		t.Stop()
	}
}

// take queues a poll's records.
func (s *ShareSource) take(m *shareMember, fs kgo.Fetches) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	fs.EachRecord(func(rec *kgo.Record) {
		dl := rec.AcquisitionDeadline()
		h := &shareHeld{rec: rec, m: m, lock: dl.Sub(now), deadline: dl}
		m.batch = append(m.batch, h)
		m.held++
		if s.closed || h.lock <= 0 {
			s.settleLocked(h, kgo.AckRelease)
			return
		}
		s.queue = append(s.queue, h)
	})
	if len(s.queue) > 0 {
		signal(s.avail)
	}
}

// renewer renews, until Close, the locks of m's held records near their
// deadline, and flushes the renewals at once. Each member has its own, so
// a slow flush of one client's acknowledgements never delays another's
// renewals.
func (s *ShareSource) renewer(m *shareMember) {
	defer s.loops.Done()
	t := time.NewTicker(shareTick)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-s.stop:
			return
		}
		s.renew(m)
	}
}

// renew renews m's held records whose deadline is near.
//
// A deadline moves only once the broker confirmed the renewal: a renewal
// that arrives after the broker's lock expired is refused (the record is
// another member's by then), and extending the deadline anyway would make
// Owns and Ack claim a record this member lost.
func (s *ShareSource) renew(m *shareMember) {
	var held []*shareHeld
	var recs []*kgo.Record
	now := time.Now()
	s.mu.Lock()
	for _, h := range m.batch {
		if h.settled || !now.Before(h.deadline) {
			continue
		}
		if h.deadline.Sub(now) < min(s.cfg.renewBefore, h.lock/2) {
			held = append(held, h)
			recs = append(recs, h.rec)
		}
	}
	if len(recs) > 0 {
		m.refused = map[string]bool{}
	}
	s.mu.Unlock()
	if len(recs) == 0 {
		return
	}
	m.cl.MarkAcks(kgo.AckRenew, recs...)
	ctx, cancel := context.WithTimeout(s.runCtx, commitTimeout)
	defer cancel()
	err := m.cl.FlushAcks(ctx)
	if err != nil && s.runCtx.Err() == nil {
		s.report(fmt.Errorf("kafka.ShareSource: renewing %d locks: %w", len(recs), err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range held {
		// The broker restarted the lock when the renewal arrived, after
		// now: now+lock is a lower bound.
		if err == nil && !h.settled && !m.refused[partitionKey(h.rec.Topic, h.rec.Partition)] {
			h.deadline = now.Add(h.lock)
		}
	}
	m.refused = nil
}

// partitionKey names a topic's partition, "topic/partition".
func partitionKey(topic string, partition int32) string {
	return topic + "/" + strconv.FormatInt(int64(partition), 10)
}

// onAcks reports acknowledgements the broker refused.
func (s *ShareSource) onAcks(cl *kgo.Client, rs kgo.ShareAckResults) {
	s.mu.Lock()
	for _, m := range s.members {
		if m.cl != cl || m.refused == nil {
			continue
		}
		for _, r := range rs {
			if r.Err != nil {
				m.refused[partitionKey(r.Topic, r.Partition)] = true
			}
		}
	}
	s.mu.Unlock()
	for _, r := range rs {
		if r.Err != nil && !errors.Is(r.Err, context.Canceled) {
			s.report(fmt.Errorf("kafka.ShareSource: acknowledgements of %s/%d refused (their records are delivered again): %w", r.Topic, r.Partition, r.Err))
		}
	}
}

// report hands err to the observer, or logs it.
func (s *ShareSource) report(err error) {
	s.rep.Report(s.runCtx, effects.Event{Kind: effects.EventFailed, Component: "kafka.ShareSource", Err: err},
		slog.LevelWarn, "kafka.ShareSource: retrying after an error")
}

// Close stops fetching, releases every record not acked (handed out or
// queued), flushes the acknowledgements, leaves the group and closes the
// clients, waiting at most 10 s for the broker. Released records are
// delivered again to the group's other members. Next, Ack and Release
// return [ErrSourceClosed] afterwards.
func (s *ShareSource) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for _, m := range s.members {
		for _, h := range m.batch {
			s.settleLocked(h, kgo.AckRelease)
		}
	}
	s.queue = nil
	s.mu.Unlock()
	close(s.stop)
	s.cancelRun()
	s.loops.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), shareCloseTimeout)
	defer cancel()
	errs := make([]error, len(s.members))
	var wg sync.WaitGroup
	for i, m := range s.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Leaving stops the client's fetches first (a fetch now
			// would acquire records only to release them), then sends
			// the pending acknowledgements with the session's close.
			if err := m.cl.LeaveGroupContext(ctx); err != nil {
				errs[i] = fmt.Errorf("kafka.ShareSource.Close: acknowledging and leaving the group: %w", err)
			}
			m.cl.Close()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
