package s3

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"effectively.dev/effects"
)

// Metadata names the adapter stores on every object it writes (S3 sends them
// as x-amz-meta-effectively-key and x-amz-meta-effectively-fingerprint).
const (
	// MetaKey holds the idempotency key, percent-encoded as by
	// url.PathEscape so that any key fits in an HTTP header.
	MetaKey = "effectively-key"
	// MetaFingerprint holds the hex SHA-256 fingerprint of the payload: the
	// [effects.Fingerprint] of the body, the content type, and each user
	// metadata name and value in name order.
	MetaFingerprint = "effectively-fingerprint"
)

// Defaults for the multipart options.
const (
	// defaultMultipartThreshold is the body size above which Apply uploads
	// in parts.
	defaultMultipartThreshold = 16 << 20
	// defaultPartSize is the size of each part but the last.
	defaultPartSize = 8 << 20
	// maxParts is S3's limit on parts per upload.
	maxParts = 10000
)

// enforcer is the [effects.Contract] Enforcer the adapter declares.
const enforcer = "s3: conditional PutObject If-None-Match: * (412 = already there)"

const opApply = "s3.Apply"

// Object is the payload of one effect: the object to create.
type Object struct {
	// Body is the object's content, held in memory. It may be empty.
	Body []byte
	// ContentType is the object's Content-Type; empty leaves S3's default
	// (binary/octet-stream on AWS).
	ContentType string
	// Metadata is user metadata stored with the object (without the
	// x-amz-meta- prefix). Names are case-insensitive and stored in lower
	// case; names and values must be printable ASCII, as S3 requires, and
	// the names MetaKey and MetaFingerprint are reserved.
	Metadata map[string]string
}

// Writer creates one S3 object per idempotency key. It implements
// [effects.Effect][Object] and is safe for concurrent use.
type Writer struct {
	client    *awss3.Client
	bucket    string
	prefix    string
	mapKey    func(effects.Key) string
	threshold int64
	partSize  int64
	hook      func(key effects.Key, in *awss3.PutObjectInput) error
}

var _ effects.Effect[Object] = (*Writer)(nil)

// Option configures a [Writer]. Options only record their values; [New]
// validates them all at once and refuses a bad one with an
// *effects.ConfigError. A nil Option is ignored.
type Option func(*config)

type config struct {
	prefix    string
	mapKey    func(effects.Key) string
	mapKeySet bool
	threshold int64
	partSize  int64
	hook      func(key effects.Key, in *awss3.PutObjectInput) error
	hookSet   bool
}

// WithPrefix puts every object under prefix: the object key is prefix
// followed by the mapped idempotency key (see [WithObjectKey]). A prefix
// that should act as a folder ends in "/". The default is no prefix.
func WithPrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// WithObjectKey replaces [EscapeKey] (the default) as the mapping from
// idempotency key to object key (after the prefix). fn must be
// deterministic, and should be injective: two keys that map to one object
// are caught (the second gets [effects.ErrKeyReused], since the stored
// object names the other key) but cannot both be written. The result,
// prefix included, must be a valid S3 key (non-empty, valid UTF-8, at most
// 1024 bytes, no control characters), or Apply refuses the key with
// [effects.ErrInvalidKey] before any I/O. [New] refuses a nil fn.
func WithObjectKey(fn func(effects.Key) string) Option {
	return func(c *config) { c.mapKey, c.mapKeySet = fn, true }
}

// WithMultipartThreshold uploads bodies larger than n bytes as multipart
// uploads (default 16 MiB). The condition then
// sits on CompleteMultipartUpload, and an existing object is looked up
// before uploading, so a redelivered large object is not sent again. [New]
// refuses a negative n.
func WithMultipartThreshold(n int64) Option {
	return func(c *config) { c.threshold = n }
}

// WithPartSize sets the size of each part of a multipart upload but the
// last (default 8 MiB). AWS S3 (and versitygw) refuse
// parts under 5 MiB other than the last. A body that would need more than
// S3's 10,000 parts is split into 10,000 larger ones. [New] refuses n <= 0.
func WithPartSize(n int64) Option {
	return func(c *config) { c.partSize = n }
}

// New returns a Writer that creates objects in bucket through client. See
// the package documentation for what client must be able to do. It returns
// an *effects.ConfigError for a nil client, an empty bucket or an invalid
// option, and makes no request.
func New(client *awss3.Client, bucket string, opts ...Option) (*Writer, error) {
	const op = "s3.New"
	c := config{threshold: defaultMultipartThreshold, partSize: defaultPartSize}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	switch {
	case client == nil:
		return nil, &effects.ConfigError{Op: op, Option: "client", Reason: "nil *s3.Client"}
	case bucket == "":
		return nil, &effects.ConfigError{Op: op, Option: "bucket", Reason: "empty bucket name"}
	case c.mapKeySet && c.mapKey == nil:
		return nil, &effects.ConfigError{Op: op, Option: "WithObjectKey", Reason: "nil function"}
	case c.threshold < 0:
		return nil, &effects.ConfigError{Op: op, Option: "WithMultipartThreshold", Reason: fmt.Sprintf("negative threshold %d", c.threshold)}
	case c.partSize <= 0:
		return nil, &effects.ConfigError{Op: op, Option: "WithPartSize", Reason: fmt.Sprintf("part size %d, want > 0", c.partSize)}
	case c.hookSet && c.hook == nil:
		return nil, &effects.ConfigError{Op: op, Option: "WithPutHook", Reason: "nil hook"}
	}
	if c.mapKey == nil {
		c.mapKey = EscapeKey
	}
	return &Writer{
		client:    client,
		bucket:    bucket,
		prefix:    c.prefix,
		mapKey:    c.mapKey,
		threshold: c.threshold,
		partSize:  c.partSize,
		hook:      c.hook,
	}, nil
}

// Contract declares effectively-once, enforced by S3's conditional write,
// with keys kept as long as their objects exist, and key reuse detected.
func (w *Writer) Contract() effects.Contract {
	return effects.Contract{
		Guarantee:       effects.EffectivelyOnce,
		Enforcer:        enforcer,
		Horizon:         0,
		DetectsKeyReuse: true,
	}
}

// ObjectKey returns the object key that key is written under: the prefix
// followed by the key mapping's result. Readers use it to find the object.
func (w *Writer) ObjectKey(key effects.Key) string { return w.prefix + w.mapKey(key) }

// Apply creates the object for key unless it exists. It returns Applied
// with the new object's reference, or Replayed with the existing object's
// reference when an earlier Apply with key and the same payload created it.
// The reference is the object's version id when the bucket is versioned
// (and the service returns one), its ETag without quotes otherwise.
//
// It returns [effects.ErrInvalidKey] before any I/O for an invalid key,
// [effects.ErrKeyReused] when the object under key was written with another
// payload or another key (or not by this package), and errors that
// [effects.ClassOf] classifies for everything else (see the package
// documentation).
func (w *Writer) Apply(ctx context.Context, key effects.Key, obj Object) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	name := w.ObjectKey(key)
	if why := checkObjectKey(name); why != "" {
		return effects.Result{}, &effects.Error{Kind: effects.ErrInvalidKey, Op: opApply, Key: key,
			Err: fmt.Errorf("object key %q: %s", truncate(name, 80), why)}
	}
	meta, fp, err := prepare(key, obj)
	if err != nil {
		// S3 would refuse such a header: refused before sending.
		return effects.Result{}, effects.Refused(opApply, key, err)
	}
	p := &put{w: w, key: key, name: name, obj: obj, meta: meta, fp: fp}
	in, err := p.hooked()
	if err != nil {
		return effects.Result{}, err
	}
	if int64(len(obj.Body)) > w.threshold && len(obj.Body) > 0 {
		return p.multipart(ctx, in)
	}
	return p.single(ctx, in)
}

// put is one Apply in progress.
type put struct {
	w    *Writer
	key  effects.Key
	name string // object key
	obj  Object
	meta map[string]string // user metadata including ours
	fp   string            // hex fingerprint
}

func (p *put) contentType() *string {
	if p.obj.ContentType == "" {
		return nil
	}
	return aws.String(p.obj.ContentType)
}

// input returns a new PutObjectInput for the object: the conditional write
// as the adapter makes it, before any hook.
func (p *put) input() *awss3.PutObjectInput {
	return &awss3.PutObjectInput{
		Bucket:        aws.String(p.w.bucket),
		Key:           aws.String(p.name),
		Body:          bytes.NewReader(p.obj.Body),
		ContentLength: aws.Int64(int64(len(p.obj.Body))),
		ContentType:   p.contentType(),
		Metadata:      maps.Clone(p.meta), // the hook's mutations must not reach p.meta
		IfNoneMatch:   aws.String("*"),
	}
}

// single writes the object with one conditional PutObject.
func (p *put) single(ctx context.Context, in *awss3.PutObjectInput) (effects.Result, error) {
	out, err := p.w.client.PutObject(ctx, in)
	if err == nil {
		return effects.Result{Status: effects.Applied, Ref: ref(out.VersionId, out.ETag)}, nil
	}
	return p.failed(ctx, "PutObject", err, true)
}

// failed turns a failed conditional write into a result: a replay check on
// 412, else a classified error. mayHaveWritten says whether a lost reply
// could mean the write happened.
func (p *put) failed(ctx context.Context, call string, err error, mayHaveWritten bool) (effects.Result, error) {
	if cerr := p.misconfigured(call, err); cerr != nil {
		return effects.Result{}, cerr
	}
	switch classify(err) {
	case precondition:
		return p.replay(ctx)
	case misconfigured:
		return effects.Result{}, configError(opApply, p.w.bucket, callErr(call, p.name, err))
	case retry:
		return effects.Result{}, effects.Transient(opApply, p.key, callErr(call, p.name, err))
	case unknown:
		if mayHaveWritten {
			return effects.Result{}, effects.Ambiguous(opApply, p.key, callErr(call, p.name, err))
		}
		return effects.Result{}, effects.Transient(opApply, p.key, callErr(call, p.name, err))
	}
	return effects.Result{}, effects.Refused(opApply, p.key, callErr(call, p.name, err))
}

// misconfigured returns a configuration error when err is a failure to
// reach S3 that no retry fixes (an unknown host, a refused TLS handshake:
// see [effects.Misconfigured]), and nil otherwise. Nothing reached S3, so
// nothing was written.
func (p *put) misconfigured(call string, err error) error {
	return effects.Misconfigured(opApply, "the S3 endpoint of bucket "+p.w.bucket, callErr(call, p.name, err))
}

// replay checks, after a 412, that the object under the key is ours: written
// under this key with this payload.
func (p *put) replay(ctx context.Context) (effects.Result, error) {
	out, err := p.w.client.HeadObject(ctx, &awss3.HeadObjectInput{
		Bucket: aws.String(p.w.bucket),
		Key:    aws.String(p.name),
	})
	if err != nil {
		const call = "HeadObject (reading back the existing object after 412)"
		if cerr := p.misconfigured(call, err); cerr != nil {
			return effects.Result{}, cerr
		}
		switch classify(err) {
		case notFound:
			return effects.Result{}, effects.Transient(opApply, p.key, fmt.Errorf(
				"object %s refused the write as existing (412) but was gone when read back: deleted concurrently; retry to write it again: %w", p.name, err))
		case misconfigured:
			return effects.Result{}, configError(opApply, p.w.bucket, callErr(call, p.name, err))
		case refused:
			return effects.Result{}, effects.Refused(opApply, p.key, callErr(call, p.name, err))
		}
		// The object exists (412) and nothing was written now; only the
		// check is missing, and a retry redoes it.
		return effects.Result{}, effects.Transient(opApply, p.key, callErr(call, p.name, err))
	}
	return p.check(out)
}

// check compares a stored object's markers with this put's.
func (p *put) check(out *awss3.HeadObjectOutput) (effects.Result, error) {
	storedKey, hasKey := lookup(out.Metadata, MetaKey)
	storedFP, _ := lookup(out.Metadata, MetaFingerprint)
	var why string
	switch {
	case !hasKey:
		why = fmt.Sprintf("object %s exists but was not written by effectively.dev/s3 (no %s metadata)", p.name, MetaKey)
	case storedKey != p.meta[MetaKey]:
		other, err := url.PathUnescape(storedKey)
		if err != nil {
			other = storedKey
		}
		why = fmt.Sprintf("object %s was written under another idempotency key %q (two keys map to one object key)", p.name, truncate(other, 80))
	case storedFP != p.fp:
		why = fmt.Sprintf("object %s was written under this key with another payload (fingerprint %.16s..., this payload %.16s...)", p.name, storedFP, p.fp)
	default:
		return effects.Result{Status: effects.Replayed, Ref: ref(out.VersionId, out.ETag)}, nil
	}
	return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Op: opApply, Key: p.key, Err: errors.New(why)}
}

// prepare validates obj's metadata and returns the metadata to store, our
// markers included, and the payload's hex fingerprint.
func prepare(key effects.Key, obj Object) (map[string]string, string, error) {
	if err := checkHeaderValue(obj.ContentType); err != nil {
		return nil, "", fmt.Errorf("content type: %w", err)
	}
	meta := make(map[string]string, len(obj.Metadata)+2)
	names := make([]string, 0, len(obj.Metadata))
	for n, v := range obj.Metadata {
		ln := strings.ToLower(n)
		switch {
		case !isToken(ln):
			return nil, "", fmt.Errorf("metadata name %q: not an HTTP token (letters, digits, and !#$%%&'*+-.^_`|~)", n)
		case ln == MetaKey || ln == MetaFingerprint:
			return nil, "", fmt.Errorf("metadata name %q is reserved by effectively.dev/s3", n)
		}
		if _, dup := meta[ln]; dup {
			return nil, "", fmt.Errorf("metadata name %q given twice, in different case", n)
		}
		if err := checkHeaderValue(v); err != nil {
			return nil, "", fmt.Errorf("metadata %q: %w", n, err)
		}
		meta[ln] = v
		names = append(names, ln)
	}
	slices.Sort(names)
	fields := make([][]byte, 0, 2+2*len(names))
	fields = append(fields, obj.Body, []byte(obj.ContentType))
	for _, n := range names {
		fields = append(fields, []byte(n), []byte(meta[n]))
	}
	fp := hex.EncodeToString(effects.Fingerprint(fields...))
	meta[MetaKey] = url.PathEscape(string(key))
	meta[MetaFingerprint] = fp
	return meta, fp, nil
}

// lookup finds a metadata value by case-insensitive name.
func lookup(m map[string]string, name string) (string, bool) {
	if v, ok := m[name]; ok {
		return v, true
	}
	for k, v := range m {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}

// ref returns the version id, or the ETag without quotes when there is no
// version ("null" is the version id of objects in unversioned buckets).
func ref(versionID, etag *string) string {
	if v := aws.ToString(versionID); v != "" && v != "null" {
		return v
	}
	return strings.Trim(aws.ToString(etag), `"`)
}

func checkHeaderValue(v string) error {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7E {
			return fmt.Errorf("byte %#02x at %d is not printable ASCII, which S3 requires in headers", c, i)
		}
	}
	return nil
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
