package s3_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/s3"
	"effectively.dev/s3/s3test"
)

// Two lying adapters, kept here so the suite proves it catches them. Both
// claim what the real Writer claims (EffectivelyOnce, detects key reuse);
// both name their objects like it, validate keys like it, and store the
// same markers.

// plainPut is a PutObject without If-None-Match: every Apply writes, and
// S3 lets the last writer win.
type plainPut struct {
	client         *awss3.Client
	bucket, prefix string
}

func (p *plainPut) Contract() effects.Contract {
	return effects.Contract{Guarantee: effects.EffectivelyOnce, Enforcer: "none: plain PutObject (claims s3: conditional PutObject If-None-Match: *)", DetectsKeyReuse: true}
}

func (p *plainPut) Apply(ctx context.Context, key effects.Key, obj s3.Object) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	out, err := p.client.PutObject(ctx, &awss3.PutObjectInput{
		Bucket:      aws.String(p.bucket),
		Key:         aws.String(p.prefix + s3.EscapeKey(key)),
		Body:        bytes.NewReader(obj.Body),
		ContentType: aws.String(obj.ContentType),
		Metadata:    map[string]string{s3.MetaKey: string(key), s3.MetaFingerprint: digest(obj)},
	})
	if err != nil {
		return effects.Result{}, effects.Ambiguous("plainPut.Apply", key, err)
	}
	return effects.Result{Status: effects.Applied, Ref: aws.ToString(out.VersionId)}, nil
}

// checkThenPut looks before it writes: HeadObject, and a plain PutObject
// when nothing is there. It replays redeliveries correctly, recovers from
// lost replies (the retry finds the object) and even detects key reuse;
// what it lacks is atomicity: between the look and the write, another
// attempt can look too.
type checkThenPut struct{ plainPut }

func (c *checkThenPut) Apply(ctx context.Context, key effects.Key, obj s3.Object) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	head, err := c.client.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: aws.String(c.bucket), Key: aws.String(c.prefix + s3.EscapeKey(key))})
	if err == nil {
		if head.Metadata[s3.MetaKey] != string(key) || head.Metadata[s3.MetaFingerprint] != digest(obj) {
			return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Op: "checkThenPut.Apply", Key: key}
		}
		return effects.Result{Status: effects.Replayed, Ref: aws.ToString(head.VersionId)}, nil
	}
	return c.plainPut.Apply(ctx, key, obj)
}

func digest(obj s3.Object) string {
	return hex.EncodeToString(effects.Fingerprint(obj.Body, []byte(obj.ContentType)))
}

// A plain PUT overwrites on every repeat, so with versions counted every
// scenario that applies a key twice sees two effects:
//
//   - redelivery: five writes of one key, and four "applied" where
//     "replayed" was due;
//   - concurrent-duplicates: up to 16 versions, 16 reported applied;
//   - lost-reply: the first write landed, its reply was lost, the retry
//     writes again (cancel-mid-apply often catches it the same way, but
//     only when the server processed the PUT before the client hung up, so
//     it is not asserted);
//   - key-reuse, concurrent-key-reuse: the second payload overwrites the
//     first instead of being refused (the stored object is the loser's);
//   - replay-storm: every replayed key gains a version;
//   - backend-restart: the redelivery writes again.
//
// cut-request passes (the cut request never reached S3, so the retry is the
// only write) and invalid-keys passes (keys are validated).
func TestCounterexamplePlainPutFails(t *testing.T) {
	srv := s3test.Start(t)
	rep := conformance.Run(t, "counterexample: plain PutObject", maker(srv, func(c *awss3.Client, bucket, prefix string) (effects.Effect[s3.Object], error) {
		return &plainPut{client: c, bucket: bucket, prefix: prefix}, nil
	}), conformance.WithLateRedelivery(time.Second), conformance.ReportOnly())
	failed := rep.Failed()
	t.Logf("caught by: %v\n%s", failed, rep.Markdown())
	want := []string{
		conformance.ScenarioRedelivery, conformance.ScenarioConcurrent, conformance.ScenarioLostReply,
		conformance.ScenarioKeyReuse, conformance.ScenarioRaceReuse, conformance.ScenarioStorm,
	}
	if !srv.External() {
		want = append(want, conformance.ScenarioRestart)
	}
	for _, name := range want {
		if !slices.Contains(failed, name) {
			t.Errorf("failed scenarios %v, want %s among them", failed, name)
		}
		if row, _ := rep.Row(name); row.MaxEffects < 2 {
			t.Errorf("%s saw at most %d effects per key, want an overwrite counted", name, row.MaxEffects)
		}
	}
}

// The check-then-put passes every sequential scenario, key reuse included:
// only concurrent duplicates expose it, as several attempts find nothing and all write.
// Versions make that visible in the backend (several per key); in a plain
// bucket the overwrites would leave one object, and only the count of
// attempts reporting "applied" would give it away.
func TestCounterexampleCheckThenPutFails(t *testing.T) {
	srv := s3test.Start(t)
	rep := conformance.Run(t, "counterexample: HeadObject then PutObject", maker(srv, func(c *awss3.Client, bucket, prefix string) (effects.Effect[s3.Object], error) {
		return &checkThenPut{plainPut{client: c, bucket: bucket, prefix: prefix}}, nil
	}), conformance.WithLateRedelivery(time.Second), conformance.ReportOnly())
	failed := rep.Failed()
	t.Logf("caught by: %v\n%s", failed, rep.Markdown())
	if !slices.Contains(failed, conformance.ScenarioConcurrent) {
		t.Fatalf("failed scenarios %v, want %s among them", failed, conformance.ScenarioConcurrent)
	}
	if row, _ := rep.Row(conformance.ScenarioConcurrent); row.MaxEffects < 2 {
		t.Errorf("concurrent duplicates saw at most %d versions per key, want several", row.MaxEffects)
	}
}
