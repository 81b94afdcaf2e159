package s3test_test

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"effectively.dev/s3/s3test"
)

// An in-process server counts every write of a key, which a listing of an
// unversioned bucket cannot show: a retried plain PUT overwrites the
// object and the bucket still holds one. In a test, call
// s3test.StartInProcess(t) instead: it closes the server when t ends.
func ExampleNewInProcess() {
	srv, err := s3test.NewInProcess()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	client, closeIdle := srv.NewClient()
	defer closeIdle()
	ctx := context.Background()

	for _, conditional := range []bool{false, false, true} { // a plain PUT, its retry, then a conditional PUT
		in := &awss3.PutObjectInput{Bucket: &srv.Bucket, Key: aws.String("receipts/evt_1"), Body: strings.NewReader("receipt")}
		if conditional {
			in.IfNoneMatch = aws.String("*") // refused with 412: the object exists
		}
		_, err := client.PutObject(ctx, in)
		fmt.Println("PUT error:", err != nil)
	}
	n, err := srv.Writes(ctx, "receipts/evt_1")
	fmt.Println("writes:", n, err)
	// Output:
	// PUT error: false
	// PUT error: false
	// PUT error: true
	// writes: 2 <nil>
}

// A versitygw gateway (or the endpoint named by S3TEST_ENDPOINT) with a
// versioned bucket: Writes counts the key's versions. In a test, call
// s3test.Start(t) instead.
func ExampleNew() {
	srv, err := s3test.New()
	if err != nil {
		log.Fatal(err) // says what to install or set when versitygw cannot be built
	}
	defer srv.Close()
	client, closeIdle := srv.NewClient()
	defer closeIdle()
	ctx := context.Background()

	key := srv.Prefix("example") + "receipt" // unique even on a shared external bucket
	for range 2 {
		if _, err := client.PutObject(ctx, &awss3.PutObjectInput{Bucket: &srv.Bucket, Key: &key, Body: strings.NewReader("receipt")}); err != nil {
			log.Fatal(err)
		}
	}
	n, err := srv.Writes(ctx, key)
	fmt.Println("writes:", n, err)
	// Output: writes: 2 <nil>
}
