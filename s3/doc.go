// Package s3 makes writing an S3 object an effectively-once side effect:
// each idempotency key creates its object once, and every redelivery,
// retry or concurrent duplicate finds it there and replays.
//
// A [Writer] maps the key to an object key and writes the object with
// PutObject and If-None-Match: *, so S3 itself refuses a second write (412
// Precondition Failed) however many processes race on the key. The object
// carries the idempotency key and a fingerprint of its payload in user
// metadata ([MetaKey], [MetaFingerprint]); a 412 is reported as
// [effects.Replayed] only after a HeadObject shows that the object there was
// written under this key with this payload, and as [effects.ErrKeyReused]
// otherwise. Bodies over a threshold go up as a multipart upload whose
// CompleteMultipartUpload carries the same condition.
//
//	w, err := s3.New(client, "receipts", s3.WithPrefix("2025/"))
//	res, err := w.Apply(ctx, key, s3.Object{Body: pdf, ContentType: "application/pdf"})
//	// res.Status: Applied the first time, Replayed after; res.Ref: version id or ETag
//
// # What it guarantees
//
// The contract is [effects.EffectivelyOnce], enforced by S3's conditional
// write: one object version per key, whichever attempt wins. It is
// create-if-absent, not content deduplication: two keys with identical
// bodies make two objects, and a key reused with a different body is
// refused, never overwritten. The key is remembered as long as the object
// exists (Horizon 0): deleting the object, or a lifecycle rule expiring it,
// forgets the key, and a later redelivery writes it again.
//
// Replayed means "the object this key describes is there, and this call did
// not write it" from the adapter's point of view. That includes one case
// where this very call wrote it: the SDK's retryer resends a PutObject whose
// reply was lost, and the resend gets 412 for the first send's write.
// Either way the object was written exactly once; a caller that must tell
// the two apart cannot, because S3 does not say who wrote an object.
//
// # The client
//
// New takes an *s3.Client the caller configures (region, credentials,
// endpoint, UsePathStyle for gateways like MinIO or versitygw, HTTPClient).
// The adapter adds nothing to it and needs of it:
//
//   - an S3 service that enforces If-None-Match: * on PutObject and, for
//     multipart bodies, on CompleteMultipartUpload. AWS S3 does; so does
//     versitygw v1.8.0, which this package is tested against. A service
//     that ignores the header silently overwrites, and no client can detect
//     that: check yours before relying on this package.
//   - permissions for s3:PutObject and s3:GetObject (HeadObject reads the
//     marker after a 412), and s3:AbortMultipartUpload for multipart bodies.
//     Without s3:ListBucket, S3 answers HeadObject on a missing key with 403;
//     the adapter copes.
//   - nothing about retries: the SDK's retryer may stay on. A retried PUT
//     that finds its own earlier write is a replay (see above).
//
// # Storage settings
//
// [WithPutHook] sets how S3 stores each object (server-side encryption with
// SSE-S3 or SSE-KMS, storage class, tags, Cache-Control, the checksum
// algorithm, an ACL) on the PutObjectInput, and the same settings go to
// CreateMultipartUpload for large bodies. The condition, the object key, the
// metadata that carries the ownership markers and the payload stay the
// adapter's: a hook that changes them is refused with a
// *[effects.ConfigError] before any request.
//
// # Errors
//
// Apply validates the key (and the object key derived from it, and the
// metadata) before any I/O and returns [effects.ErrInvalidKey] for a bad
// key. Every error it returns is in one class of [effects.ClassOf], which
// tells a consumer what to do:
//
//   - 412 PreconditionFailed: the object exists; Replayed or
//     [effects.ErrKeyReused] (permanent).
//   - Retryable, retry the same key: 409 ConditionalRequestConflict (a
//     concurrent conditional write), 409 OperationAborted, 503 SlowDown
//     and 429, a refused connection are [effects.ErrTransient]. No reply
//     (connection lost after the request was sent, a cancelled context)
//     and other 5xx are [effects.ErrAmbiguous]; because the write is
//     conditional, the retry either writes the object or replays it, so a
//     retry is always safe. (Failures before CompleteMultipartUpload are
//     ErrTransient: nothing is visible before it.)
//   - Configuration, stop the worker: a bucket that does not exist
//     (NoSuchBucket), credentials S3 refuses or that lack a permission
//     (403: AccessDenied, InvalidAccessKeyId, SignatureDoesNotMatch, an
//     expired session token), a bucket in another region (301
//     PermanentRedirect), and an endpoint no retry can reach (an unknown
//     host, a refused TLS handshake: [effects.Misconfigured]) are an
//     *[effects.ConfigError] naming the setting ("bucket ...",
//     "credentials", "region", the endpoint). Nothing was written.
//   - Permanent, dead-letter at once: any other 4xx (400 InvalidArgument,
//     409 InvalidBucketState, 413 EntityTooLarge) and metadata S3 would
//     refuse (refused before sending) are [effects.ErrRefused]: this
//     request cannot succeed, whatever the retry.
//
// The SDK's error (smithy.APIError, with the status and code) stays
// reachable with errors.As.
//
// # Start-up check
//
// [Writer.Check] implements [effects.Checker] with a HeadBucket: a worker
// that runs [effects.Plan.Check] at start-up stops on a missing bucket or
// refused credentials before the first delivery, instead of failing every
// event after its earlier steps ran. It needs s3:ListBucket (see
// [Writer.Check]).
//
// # Costs
//
// A first apply is one PutObject; a replay is a PutObject (the body is sent
// again and refused with 412) plus a HeadObject.
// A multipart body costs a HeadObject first, so that redelivering a large
// object does not upload it again, then CreateMultipartUpload, one
// UploadPart per part and CompleteMultipartUpload. The whole body is held in
// memory ([Object.Body] is a []byte): the fingerprint must be known before
// the request starts, and retries resend it. An attempt that fails after
// CreateMultipartUpload aborts the upload; one whose abort also fails (or
// whose process dies) leaves an incomplete upload that is invisible but
// billed, so give the bucket a lifecycle rule with
// AbortIncompleteMultipartUpload.
//
// # When not to use it
//
// Not for objects that are meant to change: a key writes its object once,
// and an update under the same key is refused as key reuse. Use plain
// PutObject (last writer wins) for mutable state. Not for deduplicating
// identical content under different keys: derive the key from the content
// hash yourself if that is what you want. Not on a store that does not
// honour If-None-Match (see above). And not for bodies too large to hold in
// memory.
package s3
