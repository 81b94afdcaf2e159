package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"effectively.dev/effects"
)

// abortTimeout bounds AbortMultipartUpload, which runs even when the
// caller's context is done.
const abortTimeout = 30 * time.Second

// multipart writes the object as a multipart upload completed with
// If-None-Match: *.
func (p *put) multipart(ctx context.Context, in *awss3.PutObjectInput) (effects.Result, error) {
	// A redelivered large object is usually there already: look before
	// uploading it again. The lookup is only an optimisation (the
	// conditional complete decides), so any failure falls through to the
	// upload: S3 answers 403 rather than 404 for a missing key to callers
	// without s3:ListBucket.
	if head, err := p.w.client.HeadObject(ctx, &awss3.HeadObjectInput{
		Bucket: aws.String(p.w.bucket),
		Key:    aws.String(p.name),
	}); err == nil {
		return p.check(head)
	}

	create := createInput(in)
	created, err := p.w.client.CreateMultipartUpload(ctx, create)
	if err != nil {
		// Nothing is visible before the upload completes.
		return p.failed(ctx, "CreateMultipartUpload", err, false)
	}
	uploadID := created.UploadId

	body := p.obj.Body
	partSize := max(p.w.partSize, (int64(len(body))+maxParts-1)/maxParts)
	var parts []types.CompletedPart
	for n, off := int32(1), int64(0); off < int64(len(body)); n, off = n+1, off+partSize {
		chunk := body[off:min(off+partSize, int64(len(body)))]
		out, err := p.w.client.UploadPart(ctx, &awss3.UploadPartInput{
			Bucket:              aws.String(p.w.bucket),
			Key:                 aws.String(p.name),
			UploadId:            uploadID,
			PartNumber:          aws.Int32(n),
			Body:                bytes.NewReader(chunk),
			ContentLength:       aws.Int64(int64(len(chunk))),
			ChecksumAlgorithm:   create.ChecksumAlgorithm,
			ExpectedBucketOwner: create.ExpectedBucketOwner,
		})
		if err != nil {
			res, err := p.failed(ctx, fmt.Sprintf("UploadPart %d", n), err, false)
			return res, p.abort(ctx, uploadID, err)
		}
		parts = append(parts, completedPart(n, out, create.ChecksumAlgorithm))
	}

	done, err := p.w.client.CompleteMultipartUpload(ctx, &awss3.CompleteMultipartUploadInput{
		Bucket:          aws.String(p.w.bucket),
		Key:             aws.String(p.name),
		UploadId:        uploadID,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
		IfNoneMatch:     aws.String("*"),
	})
	if err == nil {
		return effects.Result{Status: effects.Applied, Ref: ref(done.VersionId, done.ETag)}, nil
	}
	// The upload survives a refused complete: abort it whatever happened,
	// so no incomplete upload is left behind. After a lost reply the
	// complete may have succeeded, and the abort then finds no upload,
	// which is harmless.
	abortErr := p.abort(ctx, uploadID, nil)
	res, err := p.failed(ctx, "CompleteMultipartUpload", err, true)
	if err != nil && abortErr != nil {
		err = errors.Join(err, abortErr)
	}
	return res, err
}

// abort aborts the upload, even if ctx is done, and joins a failure to
// err. A missing upload (already completed or aborted) is not a failure.
func (p *put) abort(ctx context.Context, uploadID *string, err error) error {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	_, aerr := p.w.client.AbortMultipartUpload(actx, &awss3.AbortMultipartUploadInput{
		Bucket:   aws.String(p.w.bucket),
		Key:      aws.String(p.name),
		UploadId: uploadID,
	})
	var nsu *types.NoSuchUpload
	if aerr == nil || errors.As(aerr, &nsu) {
		return err
	}
	aerr = fmt.Errorf("aborting multipart upload %s of %s failed, an incomplete upload is left behind (a lifecycle rule with AbortIncompleteMultipartUpload removes it): %w",
		aws.ToString(uploadID), p.name, aerr)
	if err == nil {
		return aerr
	}
	return errors.Join(err, aerr)
}
