package s3_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/s3"
)

// counted returns an env whose client sends every request through a
// roundTripCounter (which can also hold requests back with a hook).
func counted(t *testing.T, optFns ...func(*awss3.Options)) (*env, *roundTripCounter) {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 32}
	t.Cleanup(tr.CloseIdleConnections)
	rt := &roundTripCounter{base: tr}
	e := newEnv(t, append([]func(*awss3.Options){func(o *awss3.Options) {
		o.HTTPClient = &http.Client{Transport: rt}
	}}, optFns...)...)
	return e, rt
}

func (e *env) writer(opts ...s3.Option) *s3.Writer {
	e.t.Helper()
	w, err := s3.New(e.client, e.srv.Bucket, append([]s3.Option{s3.WithPrefix(e.prefix)}, opts...)...)
	if err != nil {
		e.t.Fatalf("s3.New: %v", err)
	}
	return w
}

func (e *env) get(name string) (body []byte, out *awss3.GetObjectOutput) {
	e.t.Helper()
	out, err := e.client.GetObject(context.Background(), &awss3.GetObjectInput{Bucket: &e.srv.Bucket, Key: &name})
	if err != nil {
		e.t.Fatalf("GetObject %s: %v", name, err)
	}
	defer out.Body.Close()
	body, err = io.ReadAll(out.Body)
	if err != nil {
		e.t.Fatalf("reading %s: %v", name, err)
	}
	return body, out
}

func TestApplyCreatesTheObject(t *testing.T) {
	e := newEnv(t)
	w := e.writer()
	ctx := context.Background()
	key := effects.MustKey("billing", "evt_1", "receipt")
	obj := s3.Object{Body: []byte("receipt 1"), ContentType: "text/plain", Metadata: map[string]string{"Customer": "cus_1"}}

	res, err := w.Apply(ctx, key, obj)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if res.Status != effects.Applied || res.Ref == "" {
		t.Fatalf("Apply = %+v, want applied with a ref", res)
	}
	name := w.ObjectKey(key)
	if name != e.prefix+"billing:evt_1:receipt" {
		t.Errorf("ObjectKey = %q, want the prefix and the key unchanged", name)
	}
	body, out := e.get(name)
	if string(body) != "receipt 1" || aws.ToString(out.ContentType) != "text/plain" {
		t.Errorf("stored %q (%s), want %q (text/plain)", body, aws.ToString(out.ContentType), "receipt 1")
	}
	if got := out.Metadata[s3.MetaKey]; got != string(key) {
		t.Errorf("metadata %s = %q, want %q", s3.MetaKey, got, key)
	}
	if got := out.Metadata[s3.MetaFingerprint]; len(got) != 64 {
		t.Errorf("metadata %s = %q, want a hex SHA-256", s3.MetaFingerprint, got)
	}
	if got := out.Metadata["customer"]; got != "cus_1" {
		t.Errorf("user metadata customer = %q, want cus_1", got)
	}
	if res.Ref != aws.ToString(out.VersionId) {
		t.Errorf("ref %q, want the version id %q (the bucket is versioned)", res.Ref, aws.ToString(out.VersionId))
	}
	if n := e.versions(name); n != 1 {
		t.Errorf("%d versions, want 1", n)
	}
}

func TestRedeliveryReplaysWithTheSameRef(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	key := effects.MustKey("billing", "evt_2", "receipt")
	obj := s3.Object{Body: []byte("receipt 2"), ContentType: "text/plain"}
	first, err := e.writer().Apply(ctx, key, obj)
	if err != nil {
		t.Fatalf("first Apply: %v", err)
	}
	// The same writer, then a new one (a restarted consumer).
	for i, w := range []*s3.Writer{e.writer(), e.writer()} {
		res, err := w.Apply(ctx, key, obj)
		if err != nil {
			t.Fatalf("redelivery %d: %v", i+1, err)
		}
		if res.Status != effects.Replayed || res.Ref != first.Ref {
			t.Errorf("redelivery %d = %+v, want replayed with ref %q", i+1, res, first.Ref)
		}
	}
	if n := e.versions(e.writer().ObjectKey(key)); n != 1 {
		t.Errorf("%d versions after redeliveries, want 1", n)
	}
}

func TestConcurrentDuplicatesApplyOnce(t *testing.T) {
	e := newEnv(t)
	w := e.writer()
	key := effects.MustKey("billing", "evt_3", "receipt")
	obj := s3.Object{Body: bytes.Repeat([]byte("x"), 64<<10), ContentType: "application/octet-stream"}
	results, errs := race(16, func(int) (effects.Result, error) { return w.Apply(context.Background(), key, obj) })
	applied, refs := 0, map[string]bool{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("attempt %d: %v", i, err)
			continue
		}
		if results[i].Status == effects.Applied {
			applied++
		}
		refs[results[i].Ref] = true
	}
	if applied != 1 || len(refs) != 1 {
		t.Errorf("%d attempts applied with %d distinct refs, want exactly 1 applied and one ref", applied, len(refs))
	}
	if n := e.versions(w.ObjectKey(key)); n != 1 {
		t.Errorf("%d versions, want 1", n)
	}
}

func TestConcurrentDifferentPayloadsOneWinsTheRestAreKeyReuse(t *testing.T) {
	e := newEnv(t)
	w := e.writer()
	key := effects.MustKey("billing", "evt_4", "receipt")
	body := func(i int) []byte { return []byte(fmt.Sprintf("payload %d %s", i, strings.Repeat("y", 32<<10))) }
	results, errs := race(8, func(i int) (effects.Result, error) {
		return w.Apply(context.Background(), key, s3.Object{Body: body(i)})
	})
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && results[i].Status == effects.Applied && winner == -1:
			winner = i
		case err == nil:
			t.Errorf("attempt %d: %+v, want ErrKeyReused (only one payload can win)", i, results[i])
		case !errors.Is(err, effects.ErrKeyReused):
			t.Errorf("attempt %d: %v, want ErrKeyReused", i, err)
		case effects.ClassOf(err) == effects.Retryable:
			t.Errorf("attempt %d: ErrKeyReused is retryable", i)
		}
	}
	if winner == -1 {
		t.Fatal("no attempt applied")
	}
	name := w.ObjectKey(key)
	if got, _ := e.get(name); !bytes.Equal(got, body(winner)) {
		t.Errorf("stored body is not the winner's (%d) intact", winner)
	}
	if n := e.versions(name); n != 1 {
		t.Errorf("%d versions, want 1", n)
	}
	// The winner's redelivery still replays.
	if res, err := w.Apply(context.Background(), key, s3.Object{Body: body(winner)}); err != nil || res.Status != effects.Replayed {
		t.Errorf("winner's redelivery = %+v, %v, want replayed", res, err)
	}
}

func TestKeyReuseIsDetected(t *testing.T) {
	base := s3.Object{Body: []byte("body"), ContentType: "text/plain", Metadata: map[string]string{"a": "1"}}
	for _, tc := range []struct {
		name string
		obj  s3.Object
	}{
		{"another body", s3.Object{Body: []byte("other"), ContentType: "text/plain", Metadata: map[string]string{"a": "1"}}},
		{"another content type", s3.Object{Body: []byte("body"), ContentType: "text/html", Metadata: map[string]string{"a": "1"}}},
		{"other metadata", s3.Object{Body: []byte("body"), ContentType: "text/plain", Metadata: map[string]string{"a": "2"}}},
		{"no metadata", s3.Object{Body: []byte("body"), ContentType: "text/plain"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			w := e.writer()
			key := effects.MustKey("reuse", tc.name)
			if _, err := w.Apply(context.Background(), key, base); err != nil {
				t.Fatalf("first Apply: %v", err)
			}
			_, err := w.Apply(context.Background(), key, tc.obj)
			if !errors.Is(err, effects.ErrKeyReused) || effects.ClassOf(err) == effects.Retryable {
				t.Fatalf("second payload: %v, want a permanent ErrKeyReused", err)
			}
			if got, _ := e.get(w.ObjectKey(key)); string(got) != "body" {
				t.Errorf("stored body %q, want the first payload's", got)
			}
		})
	}
	t.Run("metadata name case does not matter", func(t *testing.T) {
		e := newEnv(t)
		w := e.writer()
		key := effects.MustKey("reuse", "case")
		upper := base
		upper.Metadata = map[string]string{"A": "1"}
		if _, err := w.Apply(context.Background(), key, base); err != nil {
			t.Fatalf("first Apply: %v", err)
		}
		if res, err := w.Apply(context.Background(), key, upper); err != nil || res.Status != effects.Replayed {
			t.Fatalf("same payload with upper-case metadata name: %+v, %v, want replayed", res, err)
		}
	})
}

func TestForeignObjectIsKeyReuse(t *testing.T) {
	e := newEnv(t)
	w := e.writer()
	key := effects.MustKey("foreign")
	name := w.ObjectKey(key)
	if _, err := e.client.PutObject(context.Background(), &awss3.PutObjectInput{Bucket: &e.srv.Bucket, Key: &name, Body: strings.NewReader("not ours")}); err != nil {
		t.Fatal(err)
	}
	_, err := w.Apply(context.Background(), key, s3.Object{Body: []byte("not ours")})
	if !errors.Is(err, effects.ErrKeyReused) || !strings.Contains(err.Error(), "not written by effectively.dev/s3") {
		t.Fatalf("Apply over a foreign object: %v, want ErrKeyReused naming the cause", err)
	}
}

func TestTwoKeysMappedToOneObjectAreCaught(t *testing.T) {
	e := newEnv(t)
	w := e.writer(s3.WithObjectKey(func(effects.Key) string { return "same" }))
	obj := s3.Object{Body: []byte("x")}
	if _, err := w.Apply(context.Background(), "key-a", obj); err != nil {
		t.Fatalf("first key: %v", err)
	}
	_, err := w.Apply(context.Background(), "key-b", obj)
	if !errors.Is(err, effects.ErrKeyReused) || !strings.Contains(err.Error(), `"key-a"`) {
		t.Fatalf("second key on the same object: %v, want ErrKeyReused naming key-a", err)
	}
}

func TestInvalidKeysAreRefusedBeforeAnyIO(t *testing.T) {
	e, rt := counted(t)
	obj := s3.Object{Body: []byte("x")}
	for _, tc := range []struct {
		name string
		w    *s3.Writer
		key  effects.Key
	}{
		{"empty", e.writer(), ""},
		{"too long", e.writer(), effects.Key(strings.Repeat("k", effects.MaxKeyLen+1))},
		{"NUL byte", e.writer(), "abc\x00def"},
		{"invalid UTF-8", e.writer(), "abc\xff\xfedef"},
		{"newline", e.writer(), "abc\ndef"},
		{"mapped to an empty object key", e.writer(s3.WithPrefix(""), s3.WithObjectKey(func(effects.Key) string { return "" })), "fine"},
		{"mapped to a too long object key", e.writer(s3.WithObjectKey(func(k effects.Key) string { return strings.Repeat(string(k), 2000) })), "fine"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.w.Apply(context.Background(), tc.key, obj)
			if !errors.Is(err, effects.ErrInvalidKey) || effects.ClassOf(err) == effects.Retryable {
				t.Errorf("Apply: %v, want a permanent ErrInvalidKey", err)
			}
		})
	}
	e.nothingSent(rt)
}

func TestInvalidPayloadsAreRefusedBeforeAnyIO(t *testing.T) {
	e, rt := counted(t)
	w := e.writer()
	for _, tc := range []struct {
		name string
		obj  s3.Object
	}{
		{"reserved metadata name", s3.Object{Metadata: map[string]string{"Effectively-Key": "forged"}}},
		{"non-ASCII metadata value", s3.Object{Metadata: map[string]string{"name": "Zoë"}}},
		{"metadata name with a space", s3.Object{Metadata: map[string]string{"a b": "c"}}},
		{"metadata names differing in case", s3.Object{Metadata: map[string]string{"a": "1", "A": "2"}}},
		{"content type with a newline", s3.Object{ContentType: "text/plain\r\nX-Evil: 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := w.Apply(context.Background(), "key", tc.obj)
			if err == nil || effects.ClassOf(err) == effects.Retryable {
				t.Errorf("Apply: %v, want a permanent error", err)
			}
		})
	}
	if n := rt.count(); n != 0 {
		t.Errorf("%d requests reached S3, want 0", n)
	}
}

func TestAwkwardKeysRoundTrip(t *testing.T) {
	e := newEnv(t)
	w := e.writer()
	keys := []effects.Key{
		"a/b/../c", ".", "..", "with space", "100%", "a%2Fb", "emoji 🧾", "~tilde", "?query#frag&amp=",
		effects.Key(strings.Repeat("é", effects.MaxKeyLen/2)),         // 254 bytes, escaped to 762: hashed
		effects.MustKey("scope", strings.Repeat("m", 400), "receipt"), // NewKey's own hashed form
	}
	seen := map[string]effects.Key{}
	for _, key := range keys {
		name := w.ObjectKey(key)
		if other, dup := seen[name]; dup {
			t.Errorf("keys %q and %q map to one object %q", key, other, name)
		}
		seen[name] = key
		obj := s3.Object{Body: []byte(key)}
		if res, err := w.Apply(context.Background(), key, obj); err != nil || res.Status != effects.Applied {
			t.Errorf("Apply %q: %+v, %v", key, res, err)
			continue
		}
		if res, err := w.Apply(context.Background(), key, obj); err != nil || res.Status != effects.Replayed {
			t.Errorf("redelivering %q: %+v, %v", key, res, err)
		}
		if got, _ := e.get(name); string(got) != string(key) {
			t.Errorf("object %q holds %q, want %q", name, got, key)
		}
	}
	if n := e.total(); n != len(keys) {
		t.Errorf("%d objects for %d keys", n, len(keys))
	}
}

// TestSDKRetryFindingItsOwnWriteIsAReplay: the SDK's retryer resends a PUT
// whose reply was lost; the resend gets 412 for the first send's write,
// and the adapter reports a replay of that write. The object exists once.
func TestSDKRetryFindingItsOwnWriteIsAReplay(t *testing.T) {
	faults := new(conformance.Faults)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	e := newEnv(t, func(o *awss3.Options) {
		o.HTTPClient = &http.Client{Transport: faults.Transport(tr)}
		o.RetryMaxAttempts = 3 // the standard retryer, as most callers run it
	})
	w := e.writer()
	key := effects.MustKey("sdk-retry")
	faults.Arm(1, conformance.DropReply, nil) // the first PUT lands, its reply is lost
	res, err := w.Apply(context.Background(), key, s3.Object{Body: []byte("once")})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if !faults.Fired() {
		t.Fatal("the fault did not fire")
	}
	if res.Status != effects.Replayed {
		t.Errorf("status %s, want replayed (the SDK's resend found the first send's object)", res.Status)
	}
	if got := faults.RoundTrips(); got != 3 {
		t.Errorf("%d round trips, want 3 (PUT, resent PUT, HEAD)", got)
	}
	if n := e.versions(w.ObjectKey(key)); n != 1 {
		t.Errorf("%d versions, want 1", n)
	}
}

func TestNewRefusesBadArguments(t *testing.T) {
	c := awss3.New(awss3.Options{Region: "us-east-1"})
	for _, tc := range []struct {
		name   string
		client *awss3.Client
		bucket string
		opts   []s3.Option
		option string
	}{
		{"nil client", nil, "b", nil, "client"},
		{"empty bucket", c, "", nil, "bucket"},
		{"negative threshold", c, "b", []s3.Option{s3.WithMultipartThreshold(-1)}, "WithMultipartThreshold"},
		{"zero part size", c, "b", []s3.Option{s3.WithPartSize(0)}, "WithPartSize"},
		{"nil key mapping", c, "b", []s3.Option{s3.WithObjectKey(nil)}, "WithObjectKey"},
		{"nil hook", c, "b", []s3.Option{s3.WithPutHook(nil)}, "WithPutHook"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s3.New(tc.client, tc.bucket, tc.opts...)
			var ce *effects.ConfigError
			if !errors.As(err, &ce) || ce.Op != "s3.New" || ce.Option != tc.option || !errors.Is(err, effects.ErrInvalidConfig) {
				t.Errorf("New = %v, want a ConfigError about %s", err, tc.option)
			}
		})
	}
	if _, err := s3.New(c, "b", nil, s3.WithPrefix("p/")); err != nil {
		t.Errorf("New with a nil option: %v, want it ignored", err)
	}
}

func TestContract(t *testing.T) {
	w, err := s3.New(awss3.New(awss3.Options{Region: "us-east-1"}), "b")
	if err != nil {
		t.Fatal(err)
	}
	c := w.Contract()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "s3: conditional PutObject If-None-Match: * (412 = already there)", DetectsKeyReuse: true}
	if c != want {
		t.Errorf("Contract() = %+v, want %+v", c, want)
	}
}

// race runs fn(i) for i in [0, n) at once and collects the outcomes.
func race(n int, fn func(i int) (effects.Result, error)) ([]effects.Result, []error) {
	results, errs := make([]effects.Result, n), make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = fn(i)
		}()
	}
	close(start)
	wg.Wait()
	return results, errs
}
