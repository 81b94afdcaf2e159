package s3

import (
	"bytes"
	"maps"
	"net/url"
	"strings"
	"testing"

	"effectively.dev/effects"
)

// FuzzPayloadFingerprint: the payload fingerprint stored with each object
// (x-amz-meta-effectively-fingerprint), which tells a replay from a key
// reused with another payload after a 412, is deterministic and differs
// whenever the body, the content type or the user metadata differ, with
// metadata names compared case-insensitively as S3 does. The key marker
// stored beside it decodes back to the key.
func FuzzPayloadFingerprint(f *testing.F) {
	f.Add("receipts:evt_1", []byte("%PDF-1.7"), "application/pdf", "order", "42", []byte("%PDF-1.7"), "application/pdf", "order", "42")
	f.Add("receipts:evt_1", []byte("ab"), "c", "n", "v", []byte("a"), "bc", "n", "v")
	f.Add("k", []byte{}, "", "Order", "42", []byte{}, "", "order", "42")
	f.Add("k", []byte("x"), "text/plain", "n", "v w", []byte("x"), "text/plain", "n", "v")
	f.Add("a b/c%d", []byte("x"), "", "effectively-key", "v", []byte("x"), "", "n", "v")
	f.Fuzz(func(t *testing.T, key string, body1 []byte, ct1, name1, value1 string, body2 []byte, ct2, name2, value2 string) {
		k := effects.Key(key)
		if k.Validate() != nil {
			return
		}
		o1 := Object{Body: body1, ContentType: ct1, Metadata: map[string]string{name1: value1, "fixed": ct2}}
		o2 := Object{Body: body2, ContentType: ct2, Metadata: map[string]string{name2: value2, "fixed": ct2}}
		meta1, fp1, err := prepare(k, o1)
		if err != nil {
			return // refused before any I/O: names must be tokens, values printable ASCII
		}
		if meta1[MetaFingerprint] != fp1 {
			t.Fatalf("stored fingerprint %q, computed %q", meta1[MetaFingerprint], fp1)
		}
		if got, err := url.PathUnescape(meta1[MetaKey]); err != nil || got != key {
			t.Fatalf("key marker %q decodes to %q (%v), want %q", meta1[MetaKey], got, err, key)
		}
		if _, again, _ := prepare(k, o1); again != fp1 {
			t.Fatalf("fingerprint of %+v is not deterministic", o1)
		}
		if _, fp2, err := prepare(k, o2); err == nil {
			if got, want := fp1 == fp2, samePayload(o1, o2); got != want {
				t.Fatalf("fingerprint(%+v) == fingerprint(%+v) is %t, want %t", o1, o2, got, want)
			}
		}
		changed := []Object{
			{Body: append(bytes.Clone(body1), 'x'), ContentType: ct1, Metadata: o1.Metadata},
			{Body: body1, ContentType: ct1 + "x", Metadata: o1.Metadata},
			{Body: []byte(ct1), ContentType: string(body1), Metadata: o1.Metadata},
			{Body: body1, ContentType: ct1, Metadata: map[string]string{name1: value1 + "x", "fixed": ct2}},
			{Body: body1, ContentType: ct1, Metadata: map[string]string{name1 + "x": value1, "fixed": ct2}},
			{Body: body1, ContentType: ct1, Metadata: map[string]string{"fixed": ct2}},
		}
		for _, c := range changed {
			if _, fp, err := prepare(k, c); err == nil && fp == fp1 && !samePayload(o1, c) {
				t.Fatalf("fingerprint(%+v) == fingerprint(%+v)", o1, c)
			}
		}
	})
}

// samePayload compares what the fingerprint covers, with metadata names
// in lower case.
func samePayload(a, b Object) bool {
	lower := func(m map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			out[strings.ToLower(k)] = v
		}
		return out
	}
	return bytes.Equal(a.Body, b.Body) && a.ContentType == b.ContentType && maps.Equal(lower(a.Metadata), lower(b.Metadata))
}
