package s3

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"effectively.dev/effects"
)

const opCheck = "s3.Check"

var _ effects.Checker = (*Writer)(nil)

// Check implements [effects.Checker] with one HeadBucket, which writes
// nothing. It returns nil when the bucket exists and the client's
// credentials may reach it; an *[effects.ConfigError] naming the setting
// when no write could succeed: the bucket does not exist ("bucket ..."),
// the credentials are refused or lack the permission ("credentials"), the
// bucket is in another region ("region"), or the endpoint cannot be
// reached for good (see [effects.Misconfigured]); and an
// [effects.ErrTransient] when S3 could not be reached now or failed.
// HeadBucket's answer has no body, so after a refusal Check lists at most
// one key of the bucket (ListObjectsV2), whose answer names the reason.
//
// HeadBucket needs s3:ListBucket on the bucket, which Apply itself does
// not: a policy that grants only s3:PutObject and s3:GetObject makes
// Check fail with a configuration error naming the credentials. Grant
// s3:ListBucket, or do not call Check.
func (w *Writer) Check(ctx context.Context) error {
	_, err := w.client.HeadBucket(ctx, &awss3.HeadBucketInput{Bucket: aws.String(w.bucket)})
	if err == nil {
		return nil
	}
	call := callErr("HeadBucket", w.bucket, err)
	if cerr := effects.Misconfigured(opCheck, "the S3 endpoint of bucket "+w.bucket, call); cerr != nil {
		return cerr
	}
	switch classify(err) {
	case misconfigured, notFound, refused:
	default:
		return effects.Transient(opCheck, "", call)
	}
	// Refused: ask again with a request whose answer carries the code.
	_, lerr := w.client.ListObjectsV2(ctx, &awss3.ListObjectsV2Input{Bucket: aws.String(w.bucket), MaxKeys: aws.Int32(1)})
	if lerr != nil && apiCode(lerr) != "" {
		lcall := callErr("ListObjectsV2", w.bucket, lerr)
		switch classify(lerr) {
		case misconfigured:
			return configError(opCheck, w.bucket, lcall)
		case retry, unknown:
			return effects.Transient(opCheck, "", lcall)
		}
	}
	// No code to go by: a HEAD's 404 is the bucket's, and a 400 refuses
	// the bucket name or the region.
	switch classify(err) {
	case notFound:
		return configErrorFor(opCheck, w.bucket, "NoSuchBucket", call)
	case refused:
		return configErrorFor(opCheck, w.bucket, "BadBucketRequest", call)
	}
	return configError(opCheck, w.bucket, call)
}
