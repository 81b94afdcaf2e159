package kafka

import (
	"bytes"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"effectively.dev/effects"
	"effectively.dev/kafka/internal/produce"
)

// FuzzRecordFingerprint: the fingerprint of a produced record (topic,
// record key, value and headers), which the producer's journal and the
// outbox keep to detect a message id reused with another payload, is
// deterministic, the same for the producer and the outbox, and differs
// whenever the record differs.
//
// Records are compared byte-wise, so a nil value and an empty one count
// as equal here, as they do for the fingerprint; Kafka tells them apart (a
// nil value is a tombstone on a compacted topic), so a message id reused
// to turn an empty value into a tombstone is not detected.
func FuzzRecordFingerprint(f *testing.F) {
	f.Add("payments", "evt_1", []byte("acct_1"), []byte(`{"cents":100}`), "trace", []byte("t1"), "payments", []byte("acct_1"), []byte(`{"cents":100}`), "trace", []byte("t1"))
	f.Add("payments", "evt_1", []byte{}, []byte("v"), "", []byte{}, "payments", []byte("evt_1"), []byte("v"), "", []byte{})
	f.Add("ab", "evt_1", []byte("c"), []byte("v"), "h", []byte("x"), "a", []byte("bc"), []byte("v"), "h", []byte("x"))
	f.Add("t", "evt_1", []byte("k"), []byte("v"), KeyHeader, []byte("other"), "t", []byte("k"), []byte("v"), "", []byte{})
	f.Fuzz(func(t *testing.T, topic1, id string, key1, value1 []byte, hk1 string, hv1 []byte, topic2 string, key2, value2 []byte, hk2 string, hv2 []byte) {
		k, err := effects.NewKey(id)
		if err != nil || topic1 == "" || topic2 == "" {
			return
		}
		m1 := Message{Key: key1, Value: value1, Headers: []kgo.RecordHeader{{Key: hk1, Value: hv1}}}
		m2 := Message{Key: key2, Value: value2, Headers: []kgo.RecordHeader{{Key: hk2, Value: hv2}}}
		r1 := produce.Record(k, topic1, m1.Key, m1.Value, m1.Headers)
		r2 := produce.Record(k, topic2, m2.Key, m2.Value, m2.Headers)
		fp1 := produce.Fingerprint(r1)
		if !bytes.Equal(fp1, produce.Fingerprint(produce.Record(k, topic1, m1.Key, m1.Value, m1.Headers))) {
			t.Fatalf("fingerprint of %+v is not deterministic", r1)
		}
		if o := produce.Record(k, topic1, key1, value1, m1.Headers); !bytes.Equal(fp1, produce.Fingerprint(o)) {
			t.Fatalf("producer and outbox fingerprint %+v differently: %+v", r1, o)
		}
		if got, want := bytes.Equal(fp1, produce.Fingerprint(r2)), sameRecord(r1, r2); got != want {
			t.Fatalf("produce.Fingerprint(%+v) == produce.Fingerprint(%+v) is %t, want %t", r1, r2, got, want)
		}
		changed := []*kgo.Record{
			{Topic: r1.Topic + "x", Key: r1.Key, Value: r1.Value, Headers: r1.Headers},
			{Topic: r1.Topic, Key: append(slices.Clone(r1.Key), 'x'), Value: r1.Value, Headers: r1.Headers},
			{Topic: r1.Topic, Key: r1.Key, Value: append(slices.Clone(r1.Value), 'x'), Headers: r1.Headers},
			{Topic: r1.Topic, Key: r1.Value, Value: r1.Key, Headers: r1.Headers},
			{Topic: r1.Topic, Key: r1.Key, Value: r1.Value, Headers: r1.Headers[len(r1.Headers)-1:]},
			{Topic: r1.Topic, Key: r1.Key, Value: r1.Value, Headers: append(slices.Clone(r1.Headers), kgo.RecordHeader{Key: hk1})},
			{Topic: r1.Topic, Key: r1.Key, Value: r1.Value, Headers: append([]kgo.RecordHeader{{Key: hk1 + "x", Value: hv1}}, r1.Headers[len(r1.Headers)-1:]...)},
			{Topic: r1.Topic, Key: r1.Key, Value: r1.Value, Headers: append([]kgo.RecordHeader{{Key: hk1, Value: append(slices.Clone(hv1), 'x')}}, r1.Headers[len(r1.Headers)-1:]...)},
		}
		for _, c := range changed {
			if !sameRecord(r1, c) && bytes.Equal(fp1, produce.Fingerprint(c)) {
				t.Fatalf("produce.Fingerprint(%+v) == produce.Fingerprint(%+v)", r1, c)
			}
		}
	})
}

// sameRecord compares what a fingerprint covers, byte-wise.
func sameRecord(a, b *kgo.Record) bool {
	return a.Topic == b.Topic && bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Value, b.Value) &&
		slices.EqualFunc(a.Headers, b.Headers, func(x, y kgo.RecordHeader) bool { return x.Key == y.Key && bytes.Equal(x.Value, y.Value) })
}
