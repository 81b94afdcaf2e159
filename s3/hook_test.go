package s3_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"effectively.dev/effects"
	"effectively.dev/s3"
)

// storageHook sets every kind of storage setting issue 14 names, and
// records the keys it was called with.
type storageHook struct {
	mu   sync.Mutex
	keys []effects.Key
}

func (h *storageHook) hook(key effects.Key, in *awss3.PutObjectInput) error {
	h.mu.Lock()
	h.keys = append(h.keys, key)
	h.mu.Unlock()
	in.ServerSideEncryption = types.ServerSideEncryptionAwsKms
	in.SSEKMSKeyId = aws.String("arn:aws:kms:us-east-1:111122223333:key/receipts")
	in.BucketKeyEnabled = aws.Bool(true)
	in.StorageClass = types.StorageClassStandardIa
	in.Tagging = aws.String("team=billing&retention=7y")
	in.CacheControl = aws.String("private, max-age=31536000, immutable")
	in.ChecksumAlgorithm = types.ChecksumAlgorithmSha256
	in.ACL = types.ObjectCannedACLBucketOwnerFullControl
	return nil
}

// headerRecorder records the headers of the request that creates an
// object: PutObject, or CreateMultipartUpload (POST ?uploads).
type headerRecorder struct {
	mu      sync.Mutex
	creates []http.Header
}

func (r *headerRecorder) record(req *http.Request) {
	q := req.URL.Query()
	if (req.Method == http.MethodPut && !q.Has("partNumber")) || (req.Method == http.MethodPost && q.Has("uploads")) {
		r.mu.Lock()
		r.creates = append(r.creates, req.Header.Clone())
		r.mu.Unlock()
	}
}

// The hook's settings reach S3 on both paths, single PutObject and
// multipart; what versitygw stores (tags, Cache-Control, the SHA-256
// checksum) is read back, and what it accepts without storing (SSE-KMS,
// the storage class, the ACL) is checked on the wire. A redelivery replays.
func TestPutHookSettingsReachS3(t *testing.T) {
	for _, tc := range []struct {
		name      string
		threshold int64
	}{{"PutObject", 16 << 20}, {"multipart", 16}} {
		t.Run(tc.name, func(t *testing.T) {
			e, rt := counted(t)
			rec := &headerRecorder{}
			rt.hooks = rec.record
			h := &storageHook{}
			w := e.writer(s3.WithPutHook(h.hook), s3.WithMultipartThreshold(tc.threshold))
			ctx := context.Background()
			key := effects.MustKey("billing", "evt_hook", "receipt")
			body := []byte("receipt for evt_hook: 42.00 EUR, paid")
			obj := s3.Object{Body: body, ContentType: "text/plain"}

			res, err := w.Apply(ctx, key, obj)
			if err != nil || res.Status != effects.Applied {
				t.Fatalf("Apply = %+v, %v", res, err)
			}
			if len(h.keys) != 1 || h.keys[0] != key {
				t.Errorf("hook called with keys %q, want [%q]", h.keys, key)
			}
			if len(rec.creates) != 1 {
				t.Fatalf("%d object-creating requests, want 1", len(rec.creates))
			}
			hdr := rec.creates[0]
			for name, want := range map[string]string{
				"X-Amz-Server-Side-Encryption":                    "aws:kms",
				"X-Amz-Server-Side-Encryption-Aws-Kms-Key-Id":     "arn:aws:kms:us-east-1:111122223333:key/receipts",
				"X-Amz-Server-Side-Encryption-Bucket-Key-Enabled": "true",
				"X-Amz-Storage-Class":                             "STANDARD_IA",
				"X-Amz-Tagging":                                   "team=billing&retention=7y",
				"Cache-Control":                                   "private, max-age=31536000, immutable",
				"X-Amz-Acl":                                       "bucket-owner-full-control",
				"X-Amz-Meta-Effectively-Key":                      string(key),
			} {
				if got := hdr.Get(name); got != want {
					t.Errorf("request header %s = %q, want %q", name, got, want)
				}
			}
			if tc.name == "PutObject" {
				if got := hdr.Get("If-None-Match"); got != "*" {
					t.Errorf("If-None-Match = %q, want *", got)
				}
			}

			name := w.ObjectKey(key)
			head, err := e.client.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: &e.srv.Bucket, Key: &name, ChecksumMode: types.ChecksumModeEnabled})
			if err != nil {
				t.Fatal(err)
			}
			if got := aws.ToString(head.CacheControl); got != "private, max-age=31536000, immutable" {
				t.Errorf("stored Cache-Control %q", got)
			}
			sum := sha256.Sum256(body)
			switch got := aws.ToString(head.ChecksumSHA256); {
			case tc.name == "PutObject" && got != base64.StdEncoding.EncodeToString(sum[:]):
				t.Errorf("stored SHA-256 checksum %q, want the body's %q", got, base64.StdEncoding.EncodeToString(sum[:]))
			case got == "":
				t.Errorf("no SHA-256 checksum stored: the parts were not uploaded with the hook's algorithm")
			}
			tags, err := e.client.GetObjectTagging(ctx, &awss3.GetObjectTaggingInput{Bucket: &e.srv.Bucket, Key: &name})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, tag := range tags.TagSet {
				got[aws.ToString(tag.Key)] = aws.ToString(tag.Value)
			}
			if len(got) != 2 || got["team"] != "billing" || got["retention"] != "7y" {
				t.Errorf("stored tags %v", got)
			}

			res2, err := w.Apply(ctx, key, obj)
			if err != nil || res2.Status != effects.Replayed || res2.Ref != res.Ref {
				t.Fatalf("redelivery = %+v, %v; want replayed with ref %q", res2, err, res.Ref)
			}
			if n := e.versions(name); n != 1 {
				t.Errorf("%d versions, want 1", n)
			}
		})
	}
}

// A hook that touches the condition, the object key, the ownership
// metadata or the payload is refused with a *ConfigError before any request:
// nothing is written, and the error is a configuration error no retry
// fixes.
func TestPutHookCannotChangeWhatMakesTheWriteOnce(t *testing.T) {
	for _, tc := range []struct {
		field string
		hook  func(*awss3.PutObjectInput)
	}{
		{"IfNoneMatch", func(in *awss3.PutObjectInput) { in.IfNoneMatch = nil }},
		{"IfNoneMatch", func(in *awss3.PutObjectInput) { *in.IfNoneMatch = `"etag"` }},
		{"IfMatch", func(in *awss3.PutObjectInput) { in.IfMatch = aws.String(`"etag"`) }},
		{"WriteOffsetBytes", func(in *awss3.PutObjectInput) { in.WriteOffsetBytes = aws.Int64(0) }},
		{"Key", func(in *awss3.PutObjectInput) { in.Key = aws.String("elsewhere") }},
		{"Key", func(in *awss3.PutObjectInput) { *in.Key += ".pdf" }},
		{"Bucket", func(in *awss3.PutObjectInput) { in.Bucket = aws.String("other-bucket") }},
		{"Metadata", func(in *awss3.PutObjectInput) { in.Metadata[s3.MetaKey] = "someone-else" }},
		{"Metadata", func(in *awss3.PutObjectInput) { delete(in.Metadata, s3.MetaFingerprint) }},
		{"Metadata", func(in *awss3.PutObjectInput) { in.Metadata["owner"] = "me" }},
		{"Metadata", func(in *awss3.PutObjectInput) { in.Metadata = nil }},
		{"Body", func(in *awss3.PutObjectInput) { in.Body = strings.NewReader("other body") }},
		{"Body", func(in *awss3.PutObjectInput) { _, _ = io.ReadAll(in.Body) }},
		{"ContentLength", func(in *awss3.PutObjectInput) { in.ContentLength = aws.Int64(1) }},
		{"ContentType", func(in *awss3.PutObjectInput) { in.ContentType = aws.String("application/pdf") }},
		{"ContentMD5", func(in *awss3.PutObjectInput) { in.ContentMD5 = aws.String("1B2M2Y8AsgTpgAmY7PhCfg==") }},
		{"ChecksumSHA256", func(in *awss3.PutObjectInput) { in.ChecksumSHA256 = aws.String("x") }},
		{"SSECustomerKey", func(in *awss3.PutObjectInput) { in.SSECustomerKey = aws.String("k") }},
		{"RequestPayer", func(in *awss3.PutObjectInput) { in.RequestPayer = types.RequestPayerRequester }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			e, rt := counted(t)
			hook := func(_ effects.Key, in *awss3.PutObjectInput) error {
				in.StorageClass = types.StorageClassStandardIa // allowed, and ignored in the verdict
				tc.hook(in)
				return nil
			}
			for _, threshold := range []int64{16 << 20, 4} {
				w := e.writer(s3.WithPutHook(hook), s3.WithMultipartThreshold(threshold))
				key := effects.MustKey("billing", "evt_bad_hook", "receipt")
				_, err := w.Apply(context.Background(), key, s3.Object{Body: []byte("receipt"), ContentType: "text/plain"})
				var ce *effects.ConfigError
				if !errors.As(err, &ce) || ce.Option != "WithPutHook" || !strings.Contains(ce.Reason, "PutObjectInput."+tc.field+",") ||
					!strings.Contains(ce.Reason, fmt.Sprintf("%q", key)) {
					t.Fatalf("threshold %d: Apply = %v, want a *effects.ConfigError for WithPutHook naming %s and the key", threshold, err, tc.field)
				}
				if !errors.Is(err, effects.ErrInvalidConfig) || effects.ClassOf(err) == effects.Retryable {
					t.Errorf("threshold %d: %v: want ErrInvalidConfig, not retryable", threshold, err)
				}
				if !strings.Contains(err.Error(), "PutObjectInput."+tc.field) || !strings.Contains(err.Error(), "nothing was written") {
					t.Errorf("message %q does not name the field and say nothing was written", err)
				}
			}
			e.nothingSent(rt)
		})
	}
}

// The hook's own error fails Apply before any request, wrapped so callers
// can reach it: refused for good unless it has a class of its own.
func TestPutHookErrorStopsTheWrite(t *testing.T) {
	e, rt := counted(t)
	noKey := errors.New("no KMS key for tenant acme")
	w := e.writer(s3.WithPutHook(func(effects.Key, *awss3.PutObjectInput) error { return noKey }))
	_, err := w.Apply(context.Background(), effects.MustKey("acme", "evt_1", "receipt"), s3.Object{Body: []byte("r")})
	if !errors.Is(err, noKey) || effects.ClassOf(err) != effects.Permanent || !errors.Is(err, effects.ErrRefused) {
		t.Fatalf("Apply = %v, want the hook's error, refused for good", err)
	}
	retry := e.writer(s3.WithPutHook(func(k effects.Key, _ *awss3.PutObjectInput) error {
		return effects.Transient("kms", k, noKey)
	}))
	_, err = retry.Apply(context.Background(), effects.MustKey("acme", "evt_1", "receipt"), s3.Object{Body: []byte("r")})
	if !errors.Is(err, noKey) || effects.ClassOf(err) != effects.Retryable {
		t.Fatalf("Apply with a hook error that is transient = %v, want it retryable", err)
	}
	if n := rt.count(); n != 0 {
		t.Errorf("%d requests made, want none", n)
	}
}

// What the hook sets is not part of the fingerprint: a redelivery whose
// hook sets another storage class replays the stored object.
func TestPutHookSettingsAreNotThePayload(t *testing.T) {
	e := newEnv(t)
	key := effects.MustKey("billing", "evt_class", "receipt")
	obj := s3.Object{Body: []byte("receipt"), ContentType: "text/plain"}
	class := func(c types.StorageClass) s3.Option {
		return s3.WithPutHook(func(_ effects.Key, in *awss3.PutObjectInput) error { in.StorageClass = c; return nil })
	}
	first, err := e.writer(class(types.StorageClassStandard)).Apply(context.Background(), key, obj)
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.writer(class(types.StorageClassGlacierIr)).Apply(context.Background(), key, obj)
	if err != nil || again.Status != effects.Replayed || again.Ref != first.Ref {
		t.Fatalf("redelivery with another storage class = %+v, %v; want replayed", again, err)
	}
}
