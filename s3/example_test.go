package s3_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"effectively.dev/effects"
	"effectively.dev/s3"
)

// The examples run against a local versitygw gateway; exampleServer and
// exampleClient (main_test.go) stand in for your own endpoint and client.

// Write a receipt once per payment event, however often the event is
// delivered.
func Example() {
	srv := exampleServer("receipts/")
	client, bucket := exampleClient(srv), srv.Bucket // your *s3.Client and bucket

	w, err := s3.New(client, bucket, s3.WithPrefix("receipts/"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	key := effects.MustKey("billing", "evt_1NqG", "receipt") // from the event's id, never random
	receipt := s3.Object{Body: []byte("Paid 42.00 EUR"), ContentType: "text/plain"}

	res, err := w.Apply(ctx, key, receipt)
	fmt.Println(res.Status, err)
	res, err = w.Apply(ctx, key, receipt) // the broker redelivers the event
	fmt.Println(res.Status, err)
	_, err = w.Apply(ctx, key, s3.Object{Body: []byte("Paid 99.00 EUR")}) // a bug reuses the key
	fmt.Println(errors.Is(err, effects.ErrKeyReused), effects.ClassOf(err) == effects.Retryable)
	// Output:
	// applied <nil>
	// replayed <nil>
	// true false
}

// A client for an S3-compatible gateway (versitygw, MinIO, Ceph RGW):
// its endpoint, path-style addressing, and credentials. The Writer adds
// nothing to the client; the SDK's default retryer may stay on.
func ExampleNew_customEndpoint() {
	srv := exampleServer("exports/") // stands in for your gateway's address and credentials
	httpClient := &http.Client{Transport: &http.Transport{}}
	client := awss3.New(awss3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.Endpoint), // e.g. "http://127.0.0.1:7070"
		UsePathStyle: true,                     // http://host/bucket/key, not http://bucket.host/key
		Credentials:  credentials.NewStaticCredentialsProvider(srv.AccessKey, srv.SecretKey, ""),
		HTTPClient:   httpClient,
	})
	defer httpClient.CloseIdleConnections()

	w, err := s3.New(client, srv.Bucket, s3.WithPrefix("exports/"), s3.WithMultipartThreshold(64<<20))
	if err != nil {
		log.Fatal(err)
	}
	res, err := w.Apply(context.Background(), "export-2025-06-01", s3.Object{Body: []byte("id,amount\n1,42\n"), ContentType: "text/csv"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Status, w.ObjectKey("export-2025-06-01"))
	// Output: applied exports/export-2025-06-01
}

// Keys can be mapped to object keys of your own design; the effect key is
// still stored on the object, so a mapping that sends two keys to one
// object is caught as key reuse rather than overwriting.
func ExampleWithObjectKey() {
	client := awss3.New(awss3.Options{Region: "eu-west-1"}) // your client
	asPDF := func(k effects.Key) string { return s3.EscapeKey(k) + ".pdf" }

	w, err := s3.New(client, "invoices", s3.WithPrefix("2025/"), s3.WithObjectKey(asPDF))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(w.ObjectKey(effects.MustKey("acme", "cus_9", "in_1")))
	// Output: 2025/acme:cus_9:in_1.pdf
}

func ExampleEscapeKey() {
	fmt.Println(s3.EscapeKey("billing:evt_1:receipt"))
	fmt.Println(s3.EscapeKey("orders/2025/06"))
	fmt.Println(s3.EscapeKey(effects.MustKey("a:b", "c"))) // NewKey escaped the ':' as %3A
	// Output:
	// billing:evt_1:receipt
	// orders%2F2025%2F06
	// a%253Ab:c
}

// Encrypt, tag and classify every object the Writer creates. The hook sets
// how S3 stores the object; the condition, the object key and the ownership
// metadata stay the adapter's, and a hook that touches them is refused
// before anything is written.
func ExampleWithPutHook() {
	srv := exampleServer("statements/")
	client, bucket := exampleClient(srv), srv.Bucket

	storage := func(key effects.Key, in *awss3.PutObjectInput) error {
		in.ServerSideEncryption = types.ServerSideEncryptionAes256 // SSE-S3; or aws:kms with SSEKMSKeyId
		in.StorageClass = types.StorageClassStandardIa
		in.Tagging = aws.String("team=billing")
		in.CacheControl = aws.String("private, max-age=86400")
		in.ChecksumAlgorithm = types.ChecksumAlgorithmSha256
		return nil
	}
	w, err := s3.New(client, bucket, s3.WithPrefix("statements/"), s3.WithPutHook(storage))
	if err != nil {
		log.Fatal(err)
	}
	res, err := w.Apply(context.Background(), effects.MustKey("billing", "evt_7", "statement"), s3.Object{Body: []byte("statement"), ContentType: "text/plain"})
	fmt.Println(res.Status, err)

	unconditional := func(_ effects.Key, in *awss3.PutObjectInput) error {
		in.IfNoneMatch = nil // would let a redelivery overwrite
		return nil
	}
	w, _ = s3.New(client, bucket, s3.WithPrefix("statements/"), s3.WithPutHook(unconditional))
	_, err = w.Apply(context.Background(), effects.MustKey("billing", "evt_8", "statement"), s3.Object{Body: []byte("statement")})
	var ce *effects.ConfigError
	fmt.Println(errors.As(err, &ce), ce.Option, strings.Contains(ce.Reason, "PutObjectInput.IfNoneMatch"))
	// Output:
	// applied <nil>
	// true WithPutHook true
}

// Check the bucket at start-up, before the first delivery: a bucket that
// does not exist (or credentials S3 refuses) is a configuration error
// that names the setting, so the worker stops instead of failing every
// event.
func ExampleWriter_Check() {
	srv := exampleServer()
	client := exampleClient(srv) // your *s3.Client

	w, err := s3.New(client, "no-such-bucket")
	if err != nil {
		log.Fatal(err)
	}
	err = w.Check(context.Background())
	var ce *effects.ConfigError
	fmt.Println(effects.ClassOf(err) == effects.InvalidConfig, errors.As(err, &ce) && ce.Option == "bucket no-such-bucket")
	// Output: true true
}
