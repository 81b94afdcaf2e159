package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"effectively.dev/effects"
)

// ErrRevoked is returned (wrapped) by [Source.Ack] for a delivery whose
// partition was revoked or lost before the ack: its offset can no longer be
// committed by this member, and the partition's new owner delivers the
// record again. The effect was done; an idempotent effect replays it.
var ErrRevoked = errors.New("kafka: partition revoked before the ack; its new owner delivers the record again")

// ErrSourceClosed is returned by [Source.Next] after [Source.Close].
var ErrSourceClosed = errors.New("kafka: source closed")

// Source is an [effects.Source] over a Kafka consumer group: side effect
// first, then commit.
//
// Next hands out records one at a time. Ack commits a partition's offset
// only once every earlier delivery of that partition was acked, so acking
// out of order never skips a record: the committed offset advances over
// the contiguous acked prefix and stops at the first unacked delivery. A
// delivery that is never acked (its handler failed) holds back its
// partition's commits, and is delivered again after a restart or a
// rebalance, together with the acked deliveries after it; handlers must be
// idempotent, which is what package effects is for.
//
// When the group revokes partitions, the Source commits what is contiguous
// acked and forgets the rest (the new owner redelivers it); when partitions
// are lost (the member was kicked out) it commits nothing.
//
// Each advancing Ack is one synchronous OffsetCommit round trip: the ack
// returns once the broker stored the offset.
//
// Delivery.ID is the [KeyHeader] header when the record has one (see
// [WithIDHeader]), else "topic/partition/offset"; Delivery.Ordering is
// "topic/partition".
type Source struct {
	cl       *kgo.Client
	idHeader string
	maxPoll  int
	onErr    func(error)

	commitMu sync.Mutex // serializes commits, and commits with revocations

	mu     sync.Mutex
	buf    []*kgo.Record
	parts  map[topicPartition]*partState
	epoch  uint64 // bumped on every revocation, for stale acks
	closed bool
}

var _ effects.Source = (*Source)(nil)

type topicPartition struct {
	topic     string
	partition int32
}

// partState tracks one assigned partition's deliveries.
type partState struct {
	epoch     uint64
	pending   []*delivered // delivered and not yet in the committed prefix, in offset order
	through   kgo.EpochOffset
	committed int64 // offset the group has stored; -1 for none known
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
}

// SourceOption configures a [Source].
type SourceOption func(*Source)

// WithIDHeader names the header Delivery.ID is read from (default
// [KeyHeader]). Records without it get "topic/partition/offset".
func WithIDHeader(name string) SourceOption { return func(s *Source) { s.idHeader = name } }

// WithMaxPoll bounds how many records one poll buffers (default 500).
func WithMaxPoll(n int) SourceOption { return func(s *Source) { s.maxPoll = n } }

// WithFetchErrors receives the fetch errors that franz-go reports and
// retries on its own (an unreachable broker, data loss after a truncation);
// by default they are dropped.
func WithFetchErrors(f func(error)) SourceOption { return func(s *Source) { s.onErr = f } }

// NewSource creates a group consumer from clientOpts, which must name the
// seed brokers, kgo.ConsumerGroup and the topics (kgo.ConsumeTopics).
//
// The Source owns the client and sets what its guarantee needs, after
// clientOpts: kgo.DisableAutoCommit, kgo.BlockRebalanceOnPoll (a rebalance
// waits until polled records are registered, so it never commits offsets
// of partitions it no longer owns), and the OnPartitionsRevoked and
// OnPartitionsLost callbacks (yours would be replaced). Before clientOpts it
// sets kgo.FetchIsolationLevel(kgo.ReadCommitted()), so records of aborted
// transactions are not handed out unless you choose otherwise.
func NewSource(clientOpts []kgo.Opt, opts ...SourceOption) (*Source, error) {
	s := &Source{idHeader: KeyHeader, maxPoll: 500, parts: map[topicPartition]*partState{}}
	for _, o := range opts {
		o(s)
	}
	if s.maxPoll <= 0 {
		return nil, errors.New("kafka.NewSource: max poll must be positive")
	}
	all := append([]kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted())}, clientOpts...)
	all = append(all,
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
	)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("kafka.NewSource: %w", err)
	}
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g == "" {
		cl.Close()
		return nil, errors.New("kafka.NewSource: no consumer group (kgo.ConsumerGroup)")
	}
	s.cl = cl
	return s, nil
}

// Client returns the underlying client, e.g. for kadm. Do not poll or
// commit with it.
func (s *Source) Client() *kgo.Client { return s.cl }

// Next returns the next record. It blocks until one is available, ctx is
// done, or the source is closed ([ErrSourceClosed]).
func (s *Source) Next(ctx context.Context) (effects.Delivery, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return effects.Delivery{}, ErrSourceClosed
		}
		if len(s.buf) > 0 {
			rec := s.buf[0]
			s.buf[0] = nil
			s.buf = s.buf[1:]
			d := s.deliverLocked(rec)
			s.mu.Unlock()
			return d, nil
		}
		s.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return effects.Delivery{}, err
		}
		fs := s.cl.PollRecords(ctx, s.maxPoll)
		s.mu.Lock()
		fs.EachRecord(func(r *kgo.Record) { s.buf = append(s.buf, r) })
		s.mu.Unlock()
		// The records are registered: a revocation may run now and drop
		// the buffered ones of revoked partitions.
		s.cl.AllowRebalance()
		if fs.IsClientClosed() {
			return effects.Delivery{}, ErrSourceClosed
		}
		fs.EachError(func(_ string, _ int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			if s.onErr != nil {
				s.onErr(err)
			}
		})
	}
}

func (s *Source) deliverLocked(rec *kgo.Record) effects.Delivery {
	tp := topicPartition{rec.Topic, rec.Partition}
	p := s.parts[tp]
	if p == nil {
		p = &partState{epoch: s.epoch, committed: -1}
		s.parts[tp] = p
	}
	d := &delivered{rec: rec}
	p.pending = append(p.pending, d)
	headers := make(map[string]string, len(rec.Headers))
	id := ""
	for _, h := range rec.Headers {
		headers[h.Key] = string(h.Value)
		if h.Key == s.idHeader && id == "" {
			id = string(h.Value)
		}
	}
	ordering := rec.Topic + "/" + strconv.FormatInt(int64(rec.Partition), 10)
	if id == "" {
		id = ordering + "/" + strconv.FormatInt(rec.Offset, 10)
	}
	return effects.Delivery{
		ID:       id,
		Ordering: ordering,
		Body:     rec.Value,
		Headers:  headers,
		Token:    &sourceToken{tp: tp, epoch: p.epoch, d: d},
	}
}

// Ack marks d handled and commits its partition's offset if the acked
// prefix grew. It returns the commit's error, if any (the acked prefix
// stays recorded and the next Ack or revocation commits it), and
// [ErrRevoked] if d's partition was revoked since d was delivered. Acking a
// delivery twice does nothing.
func (s *Source) Ack(ctx context.Context, d effects.Delivery) error {
	tok, ok := d.Token.(*sourceToken)
	if !ok {
		return errors.New("kafka.Source.Ack: delivery was not handed out by this source")
	}
	s.mu.Lock()
	p := s.parts[tok.tp]
	if p == nil || p.epoch != tok.epoch {
		s.mu.Unlock()
		return fmt.Errorf("kafka.Source.Ack %s/%d: %w", tok.tp.topic, tok.tp.partition, ErrRevoked)
	}
	tok.d.acked = true
	advanced := false
	for len(p.pending) > 0 && p.pending[0].acked {
		r := p.pending[0].rec
		p.pending[0] = nil
		p.pending = p.pending[1:]
		p.through = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}
		advanced = true
	}
	s.mu.Unlock()
	if !advanced {
		return nil
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	return s.commit(ctx, nil)
}

// commit commits the acked prefix of every assigned partition (or only of
// only, if non-nil) that is ahead of what the group stored. The caller
// holds commitMu.
func (s *Source) commit(ctx context.Context, only map[string][]int32) error {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	epochs := map[topicPartition]uint64{}
	s.mu.Lock()
	for tp, p := range s.parts {
		if only != nil && !contains(only[tp.topic], tp.partition) {
			continue
		}
		if p.through.Offset <= p.committed || p.through.Offset == 0 {
			continue
		}
		if offsets[tp.topic] == nil {
			offsets[tp.topic] = map[int32]kgo.EpochOffset{}
		}
		offsets[tp.topic][tp.partition] = p.through
		epochs[tp] = p.epoch
	}
	s.mu.Unlock()
	if len(offsets) == 0 {
		return nil
	}
	var errs []error
	s.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, t := range resp.Topics {
			for _, rp := range t.Partitions {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					errs = append(errs, fmt.Errorf("%s/%d: %w", t.Topic, rp.Partition, err))
					continue
				}
				tp := topicPartition{t.Topic, rp.Partition}
				if p := s.parts[tp]; p != nil && p.epoch == epochs[tp] {
					p.committed = max(p.committed, offsets[t.Topic][rp.Partition].Offset)
				}
			}
		}
	})
	if len(errs) > 0 {
		return fmt.Errorf("kafka.Source: committing offsets: %w", errors.Join(errs...))
	}
	return nil
}

func contains(ps []int32, p int32) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// onRevoked commits the contiguous acked prefix of the revoked partitions,
// then forgets them: unacked deliveries are redelivered by the new owner.
func (s *Source) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if len(revoked) > 0 {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.commit(cctx, revoked)
		cancel()
		if err != nil && s.onErr != nil {
			s.onErr(err)
		}
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

func (s *Source) forget(parts map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch++
	for topic, ps := range parts {
		for _, p := range ps {
			delete(s.parts, topicPartition{topic, p})
		}
	}
	kept := s.buf[:0]
	for _, r := range s.buf {
		if !contains(parts[r.Topic], r.Partition) {
			kept = append(kept, r)
		}
	}
	clear(s.buf[len(kept):])
	s.buf = kept
}

// Close commits the acked prefixes (waiting at most 10 s), leaves the group
// and closes the client. Unacked deliveries are delivered again to the
// group's next owner of their partitions.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.commitMu.Lock()
	err := s.commit(ctx, nil)
	s.commitMu.Unlock()
	s.cl.CloseAllowingRebalance()
	return err
}
