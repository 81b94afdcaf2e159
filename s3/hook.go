package s3

import (
	"bytes"
	"fmt"
	"maps"
	"reflect"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"effectively.dev/effects"
)

// WithPutHook calls hook on the PutObjectInput of every object Apply
// creates (in, for the object of key), before any request, so that it can
// set how S3 stores the object, never what or where: server-side encryption (ServerSideEncryption, SSEKMSKeyId,
// SSEKMSEncryptionContext, BucketKeyEnabled), StorageClass, Tagging,
// CacheControl, ContentDisposition, ContentEncoding, ContentLanguage,
// Expires, WebsiteRedirectLocation, ChecksumAlgorithm, a canned ACL or
// grants (ACL, GrantRead, GrantReadACP, GrantWriteACP, GrantFullControl),
// object lock settings, and ExpectedBucketOwner.
//
// For a body over the multipart threshold the same hooked input is used:
// those fields are copied to the CreateMultipartUploadInput, and every
// part is uploaded with the hook's ChecksumAlgorithm (CRC32 if it sets
// none). So one hook covers both paths.
//
// The hook cannot change what makes the write effectively once: the
// condition (IfNoneMatch, IfMatch, WriteOffsetBytes), the bucket and object
// key, the metadata (which holds the ownership markers [MetaKey] and
// [MetaFingerprint]; put user metadata in [Object.Metadata], where the
// fingerprint covers it), or the payload (Body, ContentLength,
// ContentType, ContentMD5 and the checksum values, which the SDK computes
// from ChecksumAlgorithm). Nor SSE-C (SSECustomerAlgorithm, SSECustomerKey,
// SSECustomerKeyMD5), which would need the customer key on the HeadObject
// that checks a replay, nor RequestPayer, nor any field this version of the
// package does not know. Apply refuses such a change before any request,
// so nothing is written, with a *[effects.ConfigError] whose Option is
// "WithPutHook" and whose Reason names the field and the key: a bug in
// the hook, not in the message, which no retry fixes.
//
// What the hook sets is not part of the payload's fingerprint: a
// redelivery whose hook would set other values (another storage class)
// replays the stored object rather than reporting key reuse. An error
// from the hook fails Apply before any request, wrapped: it keeps its
// class if it has one ([effects.ClassOf]: a *[effects.ConfigError] stops
// the worker, an [effects.ErrTransient] is retried), and is
// [effects.ErrRefused] (permanent) otherwise: the hook refused to prepare
// this object, and would refuse it again. [New] refuses a nil hook.
func WithPutHook(hook func(key effects.Key, in *awss3.PutObjectInput) error) Option {
	return func(c *config) { c.hook, c.hookSet = hook, true }
}

// hookable lists the PutObjectInput fields a hook may set; all of them
// exist, with the same types, in CreateMultipartUploadInput (createInput
// copies them).
var hookable = map[string]bool{
	"ACL": true, "BucketKeyEnabled": true, "CacheControl": true, "ChecksumAlgorithm": true,
	"ContentDisposition": true, "ContentEncoding": true, "ContentLanguage": true,
	"ExpectedBucketOwner": true, "Expires": true,
	"GrantFullControl": true, "GrantRead": true, "GrantReadACP": true, "GrantWriteACP": true,
	"ObjectLockEventHold": true, "ObjectLockEventHoldDurationDays": true, "ObjectLockEventHoldDurationYears": true,
	"ObjectLockLegalHoldStatus": true, "ObjectLockMode": true, "ObjectLockRetainUntilDate": true,
	"SSEKMSEncryptionContext": true, "SSEKMSKeyId": true, "ServerSideEncryption": true,
	"StorageClass": true, "Tagging": true, "WebsiteRedirectLocation": true,
}

// protected says why the adapter owns a field; fields in neither map are
// refused as unknown.
var protected = map[string]string{
	"Bucket":               "the bucket is the Writer's",
	"Key":                  "the object key is derived from the idempotency key",
	"IfNoneMatch":          "If-None-Match: * is the condition that makes the write happen once",
	"IfMatch":              "a condition would replace If-None-Match: *",
	"WriteOffsetBytes":     "an append is not a create-if-absent",
	"Metadata":             "it carries the ownership markers; put user metadata in Object.Metadata, which the fingerprint covers",
	"Body":                 "the body is the payload the fingerprint covers",
	"ContentLength":        "it is the payload's length",
	"ContentType":          "the content type is part of the payload; set Object.ContentType",
	"ContentMD5":           "checksums are computed from the payload; set ChecksumAlgorithm instead",
	"SSECustomerAlgorithm": "SSE-C needs the customer key on every read, including the HeadObject that checks a replay; use SSE-S3 or SSE-KMS",
	"SSECustomerKey":       "SSE-C needs the customer key on every read, including the HeadObject that checks a replay; use SSE-S3 or SSE-KMS",
	"SSECustomerKeyMD5":    "SSE-C needs the customer key on every read, including the HeadObject that checks a replay; use SSE-S3 or SSE-KMS",
	"RequestPayer":         "requester-pays would be needed on every request of the protocol, which the adapter does not send",
}

// hooked returns the PutObjectInput for the object after the Writer's hook
// ran, or an error if the hook failed or changed a field it may not.
func (p *put) hooked() (*awss3.PutObjectInput, error) {
	in := p.input()
	if p.w.hook == nil {
		return in, nil
	}
	body := in.Body
	if err := p.w.hook(p.key, in); err != nil {
		if effects.ClassOf(err) == effects.Unclassified {
			// The hook refused to prepare this object (no KMS key for its
			// tenant): nothing was sent, and the same object would be
			// refused again.
			return nil, effects.Refused(opApply, p.key, fmt.Errorf("put hook: %w", err))
		}
		return nil, fmt.Errorf("%s key %q: put hook: %w", opApply, p.key, err)
	}
	if field, why := changedField(in, p.input(), body, len(p.obj.Body)); field != "" {
		return nil, effects.ConfigErrorf(opApply, "WithPutHook", "key %q: the hook changed PutObjectInput.%s, which it may not: %s; nothing was written",
			p.key, field, why)
	}
	return in, nil
}

// changedField compares the hooked input with a fresh one and returns the
// first field the hook changed that it may not, and why.
func changedField(hooked, fresh *awss3.PutObjectInput, body any, bodyLen int) (field, why string) {
	if r, ok := hooked.Body.(*bytes.Reader); hooked.Body != body || !ok || r.Len() != bodyLen {
		return "Body", protected["Body"] + " (replaced or read by the hook)"
	}
	hv, fv := reflect.ValueOf(hooked).Elem(), reflect.ValueOf(fresh).Elem()
	t := hv.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() || f.Name == "Body" || hookable[f.Name] {
			continue
		}
		if !reflect.DeepEqual(hv.Field(i).Interface(), fv.Field(i).Interface()) {
			if why, ok := protected[f.Name]; ok {
				return f.Name, why
			}
			if isChecksumValue(f.Name) {
				return f.Name, "checksums are computed from the payload; set ChecksumAlgorithm instead"
			}
			return f.Name, "not a field this version of effectively.dev/s3 lets a hook set"
		}
	}
	return "", ""
}

// isChecksumValue reports whether name is one of the ChecksumXXX value
// fields (ChecksumCRC32, ChecksumSHA256, ...), not ChecksumAlgorithm.
func isChecksumValue(name string) bool {
	return len(name) > len("Checksum") && name[:len("Checksum")] == "Checksum" && name != "ChecksumAlgorithm"
}

// createInput makes the CreateMultipartUploadInput for a multipart upload
// of the object from its hooked PutObjectInput.
func createInput(in *awss3.PutObjectInput) *awss3.CreateMultipartUploadInput {
	c := &awss3.CreateMultipartUploadInput{
		Bucket:      in.Bucket,
		Key:         in.Key,
		ContentType: in.ContentType,
		Metadata:    maps.Clone(in.Metadata),

		ACL:                              in.ACL,
		BucketKeyEnabled:                 in.BucketKeyEnabled,
		CacheControl:                     in.CacheControl,
		ChecksumAlgorithm:                in.ChecksumAlgorithm,
		ContentDisposition:               in.ContentDisposition,
		ContentEncoding:                  in.ContentEncoding,
		ContentLanguage:                  in.ContentLanguage,
		ExpectedBucketOwner:              in.ExpectedBucketOwner,
		Expires:                          in.Expires,
		GrantFullControl:                 in.GrantFullControl,
		GrantRead:                        in.GrantRead,
		GrantReadACP:                     in.GrantReadACP,
		GrantWriteACP:                    in.GrantWriteACP,
		ObjectLockEventHold:              in.ObjectLockEventHold,
		ObjectLockEventHoldDurationDays:  in.ObjectLockEventHoldDurationDays,
		ObjectLockEventHoldDurationYears: in.ObjectLockEventHoldDurationYears,
		ObjectLockLegalHoldStatus:        in.ObjectLockLegalHoldStatus,
		ObjectLockMode:                   in.ObjectLockMode,
		ObjectLockRetainUntilDate:        in.ObjectLockRetainUntilDate,
		SSEKMSEncryptionContext:          in.SSEKMSEncryptionContext,
		SSEKMSKeyId:                      in.SSEKMSKeyId,
		ServerSideEncryption:             in.ServerSideEncryption,
		StorageClass:                     in.StorageClass,
		Tagging:                          in.Tagging,
		WebsiteRedirectLocation:          in.WebsiteRedirectLocation,
	}
	if c.ChecksumAlgorithm == "" {
		c.ChecksumAlgorithm = types.ChecksumAlgorithmCrc32
	}
	return c
}

// completedPart records an uploaded part for CompleteMultipartUpload, with
// the part's checksum for the upload's algorithm: the field named
// "Checksum" followed by the algorithm (ChecksumCRC32, ChecksumSHA256,
// ...), which UploadPartOutput and CompletedPart share.
func completedPart(n int32, out *awss3.UploadPartOutput, alg types.ChecksumAlgorithm) types.CompletedPart {
	cp := types.CompletedPart{PartNumber: &n, ETag: out.ETag}
	field := "Checksum" + string(alg)
	src := reflect.ValueOf(out).Elem().FieldByName(field)
	dst := reflect.ValueOf(&cp).Elem().FieldByName(field)
	if src.IsValid() && dst.IsValid() && src.Type() == dst.Type() {
		dst.Set(src)
	}
	return cp
}
