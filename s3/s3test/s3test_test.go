package s3test_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	"go.uber.org/goleak"

	"effectively.dev/s3/s3test"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartServesAVersionedBucket(t *testing.T) {
	srv := s3test.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	key := aws.String(srv.Prefix(t.Name()) + "object")
	for _, body := range []string{"one", "two"} {
		if _, err := c.PutObject(ctx, &awss3.PutObjectInput{Bucket: &srv.Bucket, Key: key, Body: bytes.NewReader([]byte(body))}); err != nil {
			t.Fatalf("PutObject: %v", err)
		}
	}
	out, err := c.ListObjectVersions(ctx, &awss3.ListObjectVersionsInput{Bucket: &srv.Bucket, Prefix: key})
	if err != nil {
		t.Fatalf("ListObjectVersions: %v", err)
	}
	if len(out.Versions) != 2 {
		t.Errorf("two PUTs left %d versions, want 2 (versioning on)", len(out.Versions))
	}
}

func TestConditionalPutIsEnforced(t *testing.T) {
	srv := s3test.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	key := aws.String(srv.Prefix(t.Name()) + "object")
	put := func() error {
		_, err := c.PutObject(ctx, &awss3.PutObjectInput{Bucket: &srv.Bucket, Key: key, Body: bytes.NewReader(nil), IfNoneMatch: aws.String("*")})
		return err
	}
	if err := put(); err != nil {
		t.Fatalf("first conditional PUT: %v", err)
	}
	var api smithy.APIError
	if err := put(); !errors.As(err, &api) || api.ErrorCode() != "PreconditionFailed" {
		t.Fatalf("second conditional PUT: %v, want PreconditionFailed", err)
	}
}

func TestRestartKeepsData(t *testing.T) {
	srv := s3test.Start(t)
	if srv.External() {
		t.Skip("cannot restart an external endpoint")
	}
	c := srv.Client(t)
	ctx := context.Background()
	key := aws.String(srv.Prefix(t.Name()) + "object")
	if _, err := c.PutObject(ctx, &awss3.PutObjectInput{Bucket: &srv.Bucket, Key: key, Body: bytes.NewReader([]byte("kept"))}); err != nil {
		t.Fatalf("PutObject: %v", err)
	}
	endpoint := srv.Endpoint
	if err := srv.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if srv.Endpoint != endpoint {
		t.Errorf("endpoint moved from %s to %s", endpoint, srv.Endpoint)
	}
	// The client's pooled connection died with the old process; the SDK's
	// retryer re-dials.
	if _, err := c.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: &srv.Bucket, Key: key}); err != nil {
		t.Fatalf("HeadObject after restart: %v", err)
	}
}

func TestExternalEndpointNeedsCredentials(t *testing.T) {
	t.Setenv(s3test.EnvEndpoint, "http://127.0.0.1:1")
	t.Setenv(s3test.EnvAccessKey, "")
	if _, err := s3test.New(); err == nil {
		t.Fatal("New with S3TEST_ENDPOINT and no credentials succeeded")
	}
}

func TestBinaryFromEnvironment(t *testing.T) {
	t.Setenv(s3test.EnvBinary, "/nonexistent/versitygw")
	if _, err := s3test.Binary(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Binary with a missing S3TEST_VERSITYGW: %v, want not exist", err)
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
