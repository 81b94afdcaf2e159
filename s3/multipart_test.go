package s3_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"effectively.dev/effects"
	"effectively.dev/s3"
)

// uploads counts multipart uploads in progress under the env's prefix.
func (e *env) uploads() int {
	e.t.Helper()
	out, err := e.client.ListMultipartUploads(context.Background(), &awss3.ListMultipartUploadsInput{Bucket: &e.srv.Bucket, Prefix: &e.prefix})
	if err != nil {
		e.t.Fatalf("ListMultipartUploads: %v", err)
	}
	return len(out.Uploads)
}

func isComplete(r *http.Request) bool {
	return r.Method == http.MethodPost && r.URL.Query().Has("uploadId")
}

func TestMultipartCreatesAndReplaysWithoutReuploading(t *testing.T) {
	e, rt := counted(t)
	// Two parts: 5 MiB is the smallest part S3 and versitygw accept.
	w := e.writer(s3.WithMultipartThreshold(1<<20), s3.WithPartSize(5<<20))
	key := effects.MustKey("multipart", "big")
	body := bytes.Repeat([]byte("0123456789abcdef"), (6<<20)/16)
	obj := s3.Object{Body: body, ContentType: "application/pdf"}

	res, err := w.Apply(context.Background(), key, obj)
	if err != nil || res.Status != effects.Applied {
		t.Fatalf("Apply: %+v, %v", res, err)
	}
	if n := rt.count(); n != 5 {
		t.Errorf("%d requests, want 5 (HEAD, create, 2 parts, complete)", n)
	}
	name := w.ObjectKey(key)
	got, out := e.get(name)
	if !bytes.Equal(got, body) {
		t.Errorf("stored %d bytes, not the %d uploaded", len(got), len(body))
	}
	if etag := aws.ToString(out.ETag); !strings.HasSuffix(strings.Trim(etag, `"`), "-2") {
		t.Errorf("ETag %s, want a two-part multipart ETag", etag)
	}
	if out.Metadata[s3.MetaKey] != string(key) || aws.ToString(out.ContentType) != "application/pdf" {
		t.Errorf("metadata %v, content type %s: not carried through the multipart upload", out.Metadata, aws.ToString(out.ContentType))
	}

	before := rt.count()
	res2, err := w.Apply(context.Background(), key, obj)
	if err != nil || res2.Status != effects.Replayed || res2.Ref != res.Ref {
		t.Fatalf("redelivery: %+v, %v, want replayed with ref %q", res2, err, res.Ref)
	}
	if n := rt.count() - before; n != 1 {
		t.Errorf("redelivery made %d requests, want 1 (HEAD, no re-upload)", n)
	}
	if n := e.versions(name); n != 1 {
		t.Errorf("%d versions, want 1", n)
	}
	if n := e.uploads(); n != 0 {
		t.Errorf("%d multipart uploads left in progress", n)
	}
}

// TestMultipartLosingCompleteIsRefused holds writer A's
// CompleteMultipartUpload back until writer B has written the object, so
// A's complete meets the If-None-Match condition: 412, then a replay (same
// payload) or ErrKeyReused (another payload), and A's upload is aborted.
func TestMultipartLosingCompleteIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sameBody bool
	}{
		{"same payload replays", true},
		{"another payload is key reuse", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eA, rtA := counted(t)
			eB := &env{t: t, srv: eA.srv, client: eA.srv.Client(t), prefix: eA.prefix}
			opts := []s3.Option{s3.WithMultipartThreshold(16)}
			wA, wB := eA.writer(opts...), eB.writer(opts...)
			key := effects.MustKey("multipart", "race")
			objA := s3.Object{Body: bytes.Repeat([]byte("a"), 1<<10)}
			objB := objA
			if !tc.sameBody {
				objB = s3.Object{Body: bytes.Repeat([]byte("b"), 1<<10)}
			}

			atComplete, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			rtA.mu.Lock()
			rtA.hooks = func(r *http.Request) {
				if isComplete(r) {
					once.Do(func() { close(atComplete) })
					<-release
				}
			}
			rtA.mu.Unlock()

			type outcome struct {
				res effects.Result
				err error
			}
			doneA := make(chan outcome, 1)
			go func() {
				res, err := wA.Apply(context.Background(), key, objA)
				doneA <- outcome{res, err}
			}()
			<-atComplete
			resB, err := wB.Apply(context.Background(), key, objB)
			if err != nil || resB.Status != effects.Applied {
				t.Fatalf("B: %+v, %v, want applied", resB, err)
			}
			close(release)
			a := <-doneA

			if tc.sameBody {
				if a.err != nil || a.res.Status != effects.Replayed || a.res.Ref != resB.Ref {
					t.Errorf("A after losing the complete: %+v, %v, want replayed with B's ref %q", a.res, a.err, resB.Ref)
				}
			} else if !errors.Is(a.err, effects.ErrKeyReused) {
				t.Errorf("A after losing the complete: %+v, %v, want ErrKeyReused", a.res, a.err)
			}
			name := wA.ObjectKey(key)
			if got, _ := eA.get(name); !bytes.Equal(got, objB.Body) {
				t.Error("stored object is not B's intact")
			}
			if n := eA.versions(name); n != 1 {
				t.Errorf("%d versions, want 1", n)
			}
			if n := eA.uploads(); n != 0 {
				t.Errorf("%d multipart uploads left in progress, want 0 (A's must be aborted)", n)
			}
		})
	}
}

func TestMultipartConcurrentDuplicatesApplyOnce(t *testing.T) {
	e := newEnv(t)
	w := e.writer(s3.WithMultipartThreshold(16))
	key := effects.MustKey("multipart", "concurrent")
	obj := s3.Object{Body: bytes.Repeat([]byte("m"), 4<<10)}
	results, errs := race(16, func(int) (effects.Result, error) {
		return applyRetrying(context.Background(), w, key, obj)
	})
	applied := 0
	for i, err := range errs {
		if err != nil {
			t.Errorf("attempt %d: %v", i, err)
		} else if results[i].Status == effects.Applied {
			applied++
		}
	}
	if applied != 1 {
		t.Errorf("%d attempts applied, want 1", applied)
	}
	if n := e.versions(w.ObjectKey(key)); n != 1 {
		t.Errorf("%d versions, want 1", n)
	}
	if n := e.uploads(); n != 0 {
		t.Errorf("%d multipart uploads left in progress", n)
	}
}

// applyRetrying retries what effects.ClassOf calls Retryable, as a consumer would.
func applyRetrying(ctx context.Context, w *s3.Writer, key effects.Key, obj s3.Object) (effects.Result, error) {
	for i := 0; ; i++ {
		res, err := w.Apply(ctx, key, obj)
		if err == nil || effects.ClassOf(err) != effects.Retryable || i == 20 {
			return res, err
		}
	}
}
