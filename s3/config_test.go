package s3_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"effectively.dev/effects"
	"effectively.dev/s3"
	"effectively.dev/s3/s3test"
)

// wantConfig fails t unless err is only a configuration error whose
// ConfigError names option (by prefix).
func wantConfig(t *testing.T, err error, option string) {
	t.Helper()
	var ce *effects.ConfigError
	if effects.ClassOf(err) != effects.InvalidConfig || !errors.As(err, &ce) || !strings.HasPrefix(ce.Option, option) ||
		errors.Is(err, effects.ErrRefused) || effects.ClassOf(err) == effects.Retryable {
		t.Fatalf("%v: want only a configuration error naming %s", err, option)
	}
}

// A bucket that does not exist stops the worker: Apply and Check return a
// configuration error naming the bucket (in-process S3), and the same
// Writer works once the bucket is created.
func TestMissingBucketIsAConfigurationError(t *testing.T) {
	srv := s3test.StartInProcess(t)
	client := srv.Client(t)
	w, err := s3.New(client, "receipts-not-created")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err = w.Apply(ctx, "receipt-1", s3.Object{Body: []byte("paid")})
	wantConfig(t, err, "bucket receipts-not-created")
	wantConfig(t, w.Check(ctx), "bucket receipts-not-created")

	bucket := "receipts-not-created"
	if _, err := client.CreateBucket(ctx, &awss3.CreateBucketInput{Bucket: &bucket}); err != nil {
		t.Fatal(err)
	}
	if err := w.Check(ctx); err != nil {
		t.Fatalf("Check after the bucket was created: %v", err)
	}
	if res, err := w.Apply(ctx, "receipt-1", s3.Object{Body: []byte("paid")}); err != nil || res.Status != effects.Applied {
		t.Fatalf("Apply after the bucket was created: %+v, %v", res, err)
	}
}

// Credentials S3 refuses (403: an unknown access key, a wrong secret)
// stop the worker: configuration errors naming the credentials, from
// Apply and Check (versitygw checks signatures), and nothing is written.
func TestRefusedCredentialsAreAConfigurationError(t *testing.T) {
	srv := s3test.Start(t)
	prefix := srv.Prefix(t.Name())
	ctx := context.Background()
	for name, creds := range map[string]credentials.StaticCredentialsProvider{
		"unknown access key": credentials.NewStaticCredentialsProvider("no-such-access-key", srv.SecretKey, ""),
		"wrong secret":       credentials.NewStaticCredentialsProvider(srv.AccessKey, "not-the-secret", ""),
	} {
		t.Run(name, func(t *testing.T) {
			client := srv.Client(t, func(o *awss3.Options) { o.Credentials = creds })
			w, err := s3.New(client, srv.Bucket, s3.WithPrefix(prefix))
			if err != nil {
				t.Fatal(err)
			}
			_, err = w.Apply(ctx, "receipt-1", s3.Object{Body: []byte("paid")})
			wantConfig(t, err, "credentials")
			wantConfig(t, w.Check(ctx), "credentials")
		})
	}
	good, err := s3.New(srv.Client(t), srv.Bucket, s3.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := good.Check(ctx); err != nil {
		t.Errorf("Check with the right credentials: %v", err)
	}
	if n, err := srv.Writes(ctx, good.ObjectKey("receipt-1")); err != nil || n != 0 {
		t.Errorf("%d writes (%v) with refused credentials, want 0", n, err)
	}
}

// Check on a server that is down is retryable: the configuration may be
// right.
func TestCheckOfAStoppedServerIsRetryable(t *testing.T) {
	srv := s3test.StartInProcess(t)
	w, err := s3.New(srv.Client(t, func(o *awss3.Options) { o.RetryMaxAttempts = 1 }), srv.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Check(context.Background()); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := w.Check(context.Background()); effects.ClassOf(err) != effects.Retryable {
		t.Errorf("Check of a stopped server: %v, want a retryable error", err)
	}
}

// Metadata S3 would refuse is refused before any request, as a permanent
// ErrRefused.
func TestBadMetadataIsRefused(t *testing.T) {
	srv := s3test.StartInProcess(t)
	w, err := s3.New(srv.Client(t), srv.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Apply(context.Background(), "k", s3.Object{Body: []byte("x"), Metadata: map[string]string{"bad name": "v"}})
	if effects.ClassOf(err) != effects.Permanent || !errors.Is(err, effects.ErrRefused) {
		t.Errorf("%v: want a permanent ErrRefused", err)
	}
}
