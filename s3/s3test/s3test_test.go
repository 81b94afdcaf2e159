package s3test_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"go.uber.org/goleak"

	"effectively.dev/effects"
	"effectively.dev/s3"
	"effectively.dev/s3/s3test"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// kinds runs fn against both kinds of server.
func kinds(t *testing.T, fn func(t *testing.T, srv *s3test.Server)) {
	for name, start := range map[string]func(testing.TB) *s3test.Server{
		"versitygw":  s3test.Start,
		"in-process": s3test.StartInProcess,
	} {
		t.Run(name, func(t *testing.T) { fn(t, start(t)) })
	}
}

func put(t *testing.T, c *awss3.Client, bucket, key, body string, conditional bool) error {
	t.Helper()
	in := &awss3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader(body)}
	if conditional {
		in.IfNoneMatch = aws.String("*")
	}
	_, err := c.PutObject(context.Background(), in)
	return err
}

func writes(t *testing.T, srv *s3test.Server, key string) int {
	t.Helper()
	n, err := srv.Writes(context.Background(), key)
	if err != nil {
		t.Fatalf("Writes(%s): %v", key, err)
	}
	return n
}

// Writes sees an overwrite that a listing cannot: two plain PUTs of one key
// leave one object and count 2; a conditional PUT refused with 412 counts
// nothing.
func TestWritesCountsOverwrites(t *testing.T) {
	kinds(t, func(t *testing.T, srv *s3test.Server) {
		c := srv.Client(t)
		prefix := srv.Prefix(t.Name())
		key := prefix + "receipt"
		if n := writes(t, srv, key); n != 0 {
			t.Fatalf("Writes before any PUT = %d", n)
		}
		for _, body := range []string{"one", "two"} {
			if err := put(t, c, srv.Bucket, key, body, false); err != nil {
				t.Fatalf("PutObject: %v", err)
			}
		}
		list, err := c.ListObjectsV2(context.Background(), &awss3.ListObjectsV2Input{Bucket: &srv.Bucket, Prefix: &prefix})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Contents) != 1 {
			t.Fatalf("listing shows %d objects, want 1", len(list.Contents))
		}
		if n := writes(t, srv, key); n != 2 {
			t.Errorf("Writes after two PUTs = %d, want 2 (the overwrite counts)", n)
		}
		var api smithy.APIError
		if err := put(t, c, srv.Bucket, key, "three", true); !errors.As(err, &api) || api.ErrorCode() != "PreconditionFailed" {
			t.Fatalf("conditional PUT of an existing key: %v, want PreconditionFailed", err)
		}
		if err := put(t, c, srv.Bucket, prefix+"other", "x", true); err != nil {
			t.Fatal(err)
		}
		got, err := srv.WritesUnder(context.Background(), prefix)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[key] != 2 || got[prefix+"other"] != 1 {
			t.Errorf("WritesUnder = %v, want %s:2 and %sother:1 (the refused PUT not counted)", got, key, prefix)
		}
		// A key that only shares a prefix with another is counted apart.
		if n := writes(t, srv, prefix+"rec"); n != 0 {
			t.Errorf("Writes of a prefix of a key = %d, want 0", n)
		}
	})
}

// Of 16 concurrent conditional PUTs of one key exactly one writes, on both
// kinds, through package s3: the guarantee the S3 adapter rests on.
func TestConcurrentConditionalPutsWriteOnce(t *testing.T) {
	kinds(t, func(t *testing.T, srv *s3test.Server) {
		w, err := s3.New(srv.Client(t), srv.Bucket, s3.WithPrefix(srv.Prefix(t.Name())))
		if err != nil {
			t.Fatal(err)
		}
		for round := range 3 {
			key := effects.MustKey("test", "evt_"+string(rune('a'+round)), "receipt")
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				applied int
			)
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := w.Apply(context.Background(), key, s3.Object{Body: []byte("receipt"), ContentType: "text/plain"})
					if err != nil {
						if effects.ClassOf(err) != effects.Retryable {
							t.Error(err)
						}
						return
					}
					if !res.Replayed() {
						mu.Lock()
						applied++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if n := writes(t, srv, w.ObjectKey(key)); n != 1 || applied != 1 {
				t.Errorf("round %d: %d writes, %d Applied results; want 1 and 1", round, n, applied)
			}
		}
	})
}

// The in-process server also counts CopyObject to a key and completed
// multipart uploads: both write the key.
func TestInProcessCountsCopiesAndMultipartUploads(t *testing.T) {
	srv := s3test.StartInProcess(t)
	c := srv.Client(t)
	ctx := context.Background()
	if err := put(t, c, srv.Bucket, "src", "body", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CopyObject(ctx, &awss3.CopyObjectInput{Bucket: &srv.Bucket, Key: aws.String("dst"), CopySource: aws.String(srv.Bucket + "/src")}); err != nil {
		t.Fatalf("CopyObject: %v", err)
	}
	up, err := c.CreateMultipartUpload(ctx, &awss3.CreateMultipartUploadInput{Bucket: &srv.Bucket, Key: aws.String("big")})
	if err != nil {
		t.Fatal(err)
	}
	part, err := c.UploadPart(ctx, &awss3.UploadPartInput{Bucket: &srv.Bucket, Key: aws.String("big"), UploadId: up.UploadId,
		PartNumber: aws.Int32(1), Body: bytes.NewReader([]byte("part"))})
	if err != nil {
		t.Fatal(err)
	}
	if n := writes(t, srv, "big"); n != 0 {
		t.Errorf("Writes after UploadPart = %d, want 0: nothing is visible before the upload completes", n)
	}
	if _, err := c.CompleteMultipartUpload(ctx, &awss3.CompleteMultipartUploadInput{Bucket: &srv.Bucket, Key: aws.String("big"), UploadId: up.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: []types.CompletedPart{{PartNumber: aws.Int32(1), ETag: part.ETag}}}}); err != nil {
		t.Fatalf("CompleteMultipartUpload: %v", err)
	}
	got, err := srv.WritesUnder(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got["src"] != 1 || got["dst"] != 1 || got["big"] != 1 {
		t.Errorf("WritesUnder = %v, want src, dst and big written once each", got)
	}
}

func TestRestartKeepsDataAndCounts(t *testing.T) {
	kinds(t, func(t *testing.T, srv *s3test.Server) {
		if srv.External() {
			t.Skip("cannot restart an external endpoint")
		}
		c := srv.Client(t)
		ctx := context.Background()
		key := srv.Prefix(t.Name()) + "object"
		if err := put(t, c, srv.Bucket, key, "kept", false); err != nil {
			t.Fatalf("PutObject: %v", err)
		}
		endpoint := srv.Endpoint
		if err := srv.Stop(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: &srv.Bucket, Key: &key}); err == nil {
			t.Fatal("HeadObject succeeded while the server was stopped")
		}
		if err := srv.Restart(ctx); err != nil {
			t.Fatalf("Restart: %v", err)
		}
		if srv.Endpoint != endpoint {
			t.Errorf("endpoint moved from %s to %s", endpoint, srv.Endpoint)
		}
		// The client's pooled connection died with the old server; the SDK's
		// retryer re-dials.
		if _, err := c.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: &srv.Bucket, Key: &key}); err != nil {
			t.Fatalf("HeadObject after restart: %v", err)
		}
		if n := writes(t, srv, key); n != 1 {
			t.Errorf("Writes after restart = %d, want 1", n)
		}
	})
}

func TestStartServesAVersionedBucket(t *testing.T) {
	srv := s3test.Start(t)
	out, err := srv.Client(t).GetBucketVersioning(context.Background(), &awss3.GetBucketVersioningInput{Bucket: &srv.Bucket})
	if err != nil {
		t.Fatal(err)
	}
	if out.Status != types.BucketVersioningStatusEnabled {
		t.Errorf("versioning %q, want Enabled", out.Status)
	}
	if srv.InProcess() {
		t.Error("Start reports InProcess")
	}
}

func TestStartInProcessIgnoresTheEndpointVariable(t *testing.T) {
	t.Setenv("S3TEST_ENDPOINT", "http://127.0.0.1:1")
	srv := s3test.StartInProcess(t)
	if srv.External() || !srv.InProcess() || !strings.HasPrefix(srv.Endpoint, "http://127.0.0.1:") || srv.Endpoint == "http://127.0.0.1:1" {
		t.Fatalf("StartInProcess with S3TEST_ENDPOINT set: endpoint %s, external %t", srv.Endpoint, srv.External())
	}
}

func TestExternalEndpointNeedsCredentials(t *testing.T) {
	t.Setenv("S3TEST_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("S3TEST_ACCESS_KEY", "")
	_, err := s3test.New()
	if err == nil || !strings.Contains(err.Error(), "S3TEST_ACCESS_KEY") {
		t.Fatalf("New with S3TEST_ENDPOINT and no credentials: %v, want an error naming S3TEST_ACCESS_KEY", err)
	}
}

func TestBinaryFromEnvironment(t *testing.T) {
	t.Setenv("S3TEST_ENDPOINT", "")
	t.Setenv("S3TEST_VERSITYGW", "/nonexistent/versitygw")
	if _, err := s3test.New(); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "S3TEST_VERSITYGW") {
		t.Fatalf("New with a missing S3TEST_VERSITYGW: %v, want not exist, naming the variable", err)
	}
}

// When versitygw cannot be built (here: the module proxy is off and the
// module cache empty), the error says what to install or set.
func TestBinaryBuildFailureSaysWhatToDo(t *testing.T) {
	t.Setenv("S3TEST_VERSITYGW", "")
	t.Setenv("XDG_CACHE_HOME", t.TempDir()) // no cached build
	t.Setenv("GOMODCACHE", t.TempDir())     // no module sources
	t.Setenv("GOPROXY", "off")
	t.Setenv("S3TEST_ENDPOINT", "")
	_, err := s3test.New()
	if err == nil {
		t.Fatal("New succeeded without a cached build and without the module proxy")
	}
	for _, want := range []string{"versitygw", "v1.8.0", "S3TEST_VERSITYGW", "S3TEST_ENDPOINT", "GOPROXY"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s:\n%v", want, err)
		}
	}
}

func TestPrefixIsUniqueAndSafe(t *testing.T) {
	srv := s3test.StartInProcess(t)
	a, b := srv.Prefix("Test/x y"), srv.Prefix("Test/x y")
	if a == b || !strings.HasSuffix(a, "/") || strings.ContainsAny(strings.TrimSuffix(a, "/"), "/ ") {
		t.Errorf("Prefix = %q, %q: want distinct, one path component ending in /", a, b)
	}
}

func TestAgeMovesLastModifiedBack(t *testing.T) {
	srv := s3test.Start(t)
	if srv.External() {
		t.Skip("cannot age an external endpoint")
	}
	c := srv.Client(t)
	ctx := context.Background()
	key := aws.String(srv.Prefix(t.Name()) + "object")
	if _, err := c.PutObject(ctx, &awss3.PutObjectInput{Bucket: &srv.Bucket, Key: key, Body: bytes.NewReader([]byte("old"))}); err != nil {
		t.Fatalf("PutObject: %v", err)
	}
	const age = 400 * 24 * time.Hour
	if err := srv.Age(age); err != nil {
		t.Fatalf("Age: %v", err)
	}
	head, err := c.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: &srv.Bucket, Key: key})
	if err != nil {
		t.Fatalf("HeadObject after Age: %v", err)
	}
	if lm := aws.ToTime(head.LastModified); time.Since(lm) < age-time.Hour {
		t.Errorf("Last-Modified %v is %v ago after Age(%v)", lm, time.Since(lm), age)
	}
}
