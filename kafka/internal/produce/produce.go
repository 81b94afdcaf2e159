// Package produce holds what package kafka's Producer and package
// kafka/outbox's relay share: the records they build (the effect key or
// message id in a header), the fingerprint of a record, its reference, the
// check that a client is an idempotent producer, and a produce that never
// waits for the client's linger.
package produce

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
)

// KeyHeader is the record header that carries a record's identity for
// downstream dedup (package kafka exports it as kafka.KeyHeader).
const KeyHeader = "effectively-key"

// ErrNotIdempotent is returned for a client that is not an idempotent,
// acks=all, non-transactional producer (package kafka exports it).
var ErrNotIdempotent = errors.New("kafka: client is not an idempotent acks=all producer")

// CheckClient returns an error wrapping ErrNotIdempotent unless cl keeps
// franz-go's defaults for producing: idempotent writes, acks=all, no
// transactional id.
func CheckClient(cl *kgo.Client) error {
	if v, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); v {
		return fmt.Errorf("%w: kgo.DisableIdempotentWrite is set", ErrNotIdempotent)
	}
	if acks, ok := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); !ok || acks != kgo.AllISRAcks() {
		return fmt.Errorf("%w: set kgo.RequiredAcks(kgo.AllISRAcks()) (the default)", ErrNotIdempotent)
	}
	if vs := cl.OptValues(kgo.TransactionalID); len(vs) == 2 && vs[1] == true {
		return fmt.Errorf("%w: the client is transactional; records outside a transaction fail (use Transform)", ErrNotIdempotent)
	}
	return nil
}

// Record builds the record for id: the given key, or id when key is nil;
// the headers without any named KeyHeader, then KeyHeader = id.
func Record(id effects.Key, topic string, key, value []byte, hs []kgo.RecordHeader) *kgo.Record {
	r := &kgo.Record{Topic: topic, Key: key, Value: value}
	if r.Key == nil {
		r.Key = []byte(id)
	}
	r.Headers = make([]kgo.RecordHeader, 0, len(hs)+1)
	for _, h := range hs {
		if h.Key != KeyHeader {
			r.Headers = append(r.Headers, h)
		}
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: KeyHeader, Value: []byte(id)})
	return r
}

// Fingerprint identifies a record's payload: topic, key, value and
// headers.
func Fingerprint(r *kgo.Record) []byte {
	fields := [][]byte{[]byte(r.Topic), r.Key, r.Value}
	for _, h := range r.Headers {
		fields = append(fields, []byte(h.Key), h.Value)
	}
	return effects.Fingerprint(fields...)
}

// Ref is a produced record's reference, "partition/offset".
func Ref(r *kgo.Record) string {
	return strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10)
}

// Syncer produces records and waits for them without waiting for the
// client's linger, whatever it is. kgo.Client.ProduceSync already ends the
// linger of the partitions it produced to, but only for topics whose
// partitions the client knows: the first records of a topic wait a whole
// linger (10 ms by default, up to a minute) after its metadata loads. So
// until a topic has been produced to once, Syncer produces with a flush
// running beside it, which lingers nothing. A Syncer is safe for
// concurrent use.
type Syncer struct {
	cl     *kgo.Client
	linger bool
	warm   sync.Map // topic → struct{}: produced to once, partitions known
}

// NewSyncer returns a Syncer over cl.
func NewSyncer(cl *kgo.Client) *Syncer {
	linger, _ := cl.OptValue(kgo.ProducerLinger).(time.Duration)
	return &Syncer{cl: cl, linger: linger > 0}
}

// Produce produces recs and waits for every outcome, as ProduceSync does;
// ctx is the records' context, as for ProduceSync.
func (s *Syncer) Produce(ctx context.Context, recs ...*kgo.Record) kgo.ProduceResults {
	if !s.linger || s.allWarm(recs) {
		return s.cl.ProduceSync(ctx, recs...)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		results = make(kgo.ProduceResults, 0, len(recs))
	)
	wg.Add(len(recs))
	for _, r := range recs {
		s.cl.Produce(ctx, r, func(r *kgo.Record, err error) {
			mu.Lock()
			results = append(results, kgo.ProduceResult{Record: r, Err: err})
			mu.Unlock()
			if err == nil {
				s.warm.Store(r.Topic, struct{}{})
			}
			wg.Done()
		})
	}
	// Flush lingers nothing while it runs; it returns when every buffered
	// record is done or when it is cancelled, once ours are.
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		_ = s.cl.Flush(fctx)
	}()
	wg.Wait()
	cancel()
	<-flushed
	return results
}

func (s *Syncer) allWarm(recs []*kgo.Record) bool {
	for _, r := range recs {
		if _, ok := s.warm.Load(r.Topic); !ok {
			return false
		}
	}
	return true
}

// TraceHeaders returns hs followed by the headers that carry the trace of
// ctx, written by o when o is an [effects.Propagator]; a header whose name
// hs already has is not added (the caller's wins). It never writes into
// hs's backing array, and returns hs itself when it adds nothing.
func TraceHeaders(ctx context.Context, o effects.Observer, hs []kgo.RecordHeader) []kgo.RecordHeader {
	p, ok := o.(effects.Propagator)
	if !ok {
		return hs
	}
	out := hs[:len(hs):len(hs)]
	p.Inject(ctx, func(key, value string) {
		for _, h := range hs {
			if h.Key == key {
				return
			}
		}
		out = append(out, kgo.RecordHeader{Key: key, Value: []byte(value)})
	})
	return out
}
