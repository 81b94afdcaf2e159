package s3mem_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"effectively.dev/effects"
	"effectively.dev/internal/s3mem"
	"effectively.dev/s3"
)

func start(t *testing.T) *s3mem.Server {
	t.Helper()
	srv, err := s3mem.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := srv.CreateBucket(context.Background(), "receipts"); err != nil {
		t.Fatal(err)
	}
	return srv
}

// The demo's guarantee for S3 rests on the server refusing a second
// conditional PUT atomically: of 16 writers racing on one key, one writes.
func TestConcurrentConditionalPutsWriteOnce(t *testing.T) {
	srv := start(t)
	w, err := s3.New(srv.Client(), "receipts")
	if err != nil {
		t.Fatal(err)
	}
	key := effects.MustKey("test", "evt_1", "receipt")
	for round := range 4 {
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
					t.Error(err)
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
		if n := srv.Writes("receipts", w.ObjectKey(key)); n != 1 || applied != 1 {
			t.Errorf("round %d: %d writes, %d Applied results; want 1 and 1", round, n, applied)
		}
	}
	// Sequential redelivery replays; another payload under the key is refused.
	if _, err := w.Apply(context.Background(), key, s3.Object{Body: []byte("receipt")}); err != nil {
		t.Fatal(err)
	}
	res, err := w.Apply(context.Background(), key, s3.Object{Body: []byte("receipt")})
	if err != nil || !res.Replayed() {
		t.Fatalf("redelivery: %v, %v; want a replay", res, err)
	}
	if _, err := w.Apply(context.Background(), key, s3.Object{Body: []byte("other")}); !errors.Is(err, effects.ErrKeyReused) {
		t.Fatalf("other payload: %v, want ErrKeyReused", err)
	}
	if n := srv.Writes("receipts", w.ObjectKey(key)); n != 1 {
		t.Errorf("%d writes after replays, want 1", n)
	}
}

// A plain PUT is last-writer-wins, and the server counts every overwrite:
// this is what the naive handler's receipts look like.
func TestPlainPutsAreCounted(t *testing.T) {
	srv := start(t)
	cl := srv.Client()
	for range 3 {
		_, err := cl.PutObject(context.Background(), &awss3.PutObjectInput{
			Bucket: aws.String("receipts"), Key: aws.String("plain/evt_1"), Body: bytes.NewReader([]byte("x")),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := srv.Writes("receipts", "plain/evt_1"); n != 3 {
		t.Errorf("Writes = %d, want 3", n)
	}
	if got := srv.WritesIn("receipts"); len(got) != 1 || got["plain/evt_1"] != 3 {
		t.Errorf("WritesIn = %v", got)
	}
}
