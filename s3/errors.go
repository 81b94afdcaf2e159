package s3

import (
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/aws/smithy-go"

	"effectively.dev/effects"
)

// class is what a failed S3 call tells about the object.
type class int

const (
	// refused: S3 refused the request for a reason a retry will not
	// change, and that is about this request, not the configuration (400
	// InvalidArgument, 409 InvalidBucketState, 411, 413).
	refused class = iota
	// misconfigured: S3 refused the request for a reason no request to
	// this bucket with these credentials escapes (403, NoSuchBucket, a
	// wrong region): the worker must stop.
	misconfigured
	// precondition: 412, the object exists.
	precondition
	// notFound: 404 from HeadObject.
	notFound
	// retry: refused before doing anything, and a retry may succeed: 409
	// ConditionalRequestConflict or OperationAborted, 503 SlowDown, 429, a
	// refused connection.
	retry
	// unknown: no reply (the request may have been processed), or a 5xx
	// that does not say nothing was done.
	unknown
)

// configCodes are S3 error codes that no request to the bucket with the
// client's credentials and region escapes, with the setting each names
// and why.
var configCodes = map[string]struct{ setting, reason string }{
	"NoSuchBucket":                 {"bucket", "the bucket does not exist; create it or fix the name given to s3.New"},
	"InvalidBucketName":            {"bucket", "S3 refuses the bucket name; fix the name given to s3.New"},
	"BadBucketRequest":             {"bucket", "S3 refuses requests for the bucket (HTTP 400); check the bucket name given to s3.New and the client's Region"},
	"AccessDenied":                 {"credentials", "S3 denied access; check the client's credentials and that their policy grants s3:PutObject and s3:GetObject on the bucket (s3:ListBucket for Check)"},
	"AllAccessDisabled":            {"bucket", "all access to the bucket is disabled"},
	"AccountProblem":               {"credentials", "S3 reports a problem with the account; see the account's console"},
	"InvalidAccessKeyId":           {"credentials", "S3 does not know the access key id; check the client's credentials"},
	"XAdminUserNotFound":           {"credentials", "the gateway does not know the access key id (versitygw's 404); check the client's credentials"},
	"SignatureDoesNotMatch":        {"credentials", "the secret key does not match the access key id; check the client's credentials"},
	"ExpiredToken":                 {"credentials", "the session token expired; give the client a credentials provider that refreshes it"},
	"InvalidToken":                 {"credentials", "S3 refuses the session token; check the client's credentials"},
	"TokenRefreshRequired":         {"credentials", "the session token must be refreshed; give the client a credentials provider that refreshes it"},
	"PermanentRedirect":            {"region", "the bucket is in another region; set the client's Region to the bucket's"},
	"AuthorizationHeaderMalformed": {"region", "S3 refuses the signature's scope, usually the region; set the client's Region to the bucket's"},
}

// classify sorts an error from an aws-sdk-go-v2 S3 call. The SDK wraps
// errors as *smithy.OperationError around *awshttp.ResponseError (which
// carries the status) or, when there was no response, around
// *smithyhttp.RequestSendError or *smithy.CanceledError.
func classify(err error) class {
	var status interface{ HTTPStatusCode() int }
	if errors.As(err, &status) && status.HTTPStatusCode() != 0 {
		code := status.HTTPStatusCode()
		apiCode := apiCode(err)
		_, config := configCodes[apiCode]
		switch {
		case config, code == http.StatusUnauthorized, code == http.StatusForbidden, code == http.StatusMovedPermanently:
			return misconfigured
		case code == http.StatusPreconditionFailed:
			return precondition
		case code == http.StatusNotFound && apiCode != "NoSuchUpload":
			return notFound
		case code == http.StatusConflict && (apiCode == "ConditionalRequestConflict" || apiCode == "OperationAborted"):
			return retry
		case code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests:
			return retry
		case code >= 500:
			return unknown
		}
		return refused
	}
	// No HTTP response. A connection that was never made sent nothing.
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return retry
	}
	return unknown
}

// apiCode is the S3 error code in err's chain, "" if none.
func apiCode(err error) string {
	var api smithy.APIError
	if errors.As(err, &api) {
		return api.ErrorCode()
	}
	return ""
}

// callErr names the S3 call and object that failed.
func callErr(call, name string, err error) error {
	return fmt.Errorf("%s %s: %w", call, name, err)
}

// configError is the configuration error for an S3 refusal that classify
// calls misconfigured: an *effects.ConfigError naming the setting (the
// bucket, the credentials, the region) of op, over the SDK's error.
func configError(op, bucket string, err error) error {
	code := apiCode(err)
	if _, ok := configCodes[code]; !ok {
		var status interface{ HTTPStatusCode() int }
		if errors.As(err, &status) && status.HTTPStatusCode() == http.StatusMovedPermanently {
			code = "PermanentRedirect"
		} else {
			code = "AccessDenied" // 401, 403 without a code (HEAD answers have no body)
		}
	}
	return configErrorFor(op, bucket, code, err)
}

// configErrorFor is configError for the S3 error code code, a key of
// configCodes.
func configErrorFor(op, bucket, code string, err error) error {
	c := configCodes[code]
	setting := c.setting
	if setting == "bucket" {
		setting = "bucket " + bucket
	}
	return fmt.Errorf("%w: %w", &effects.ConfigError{Op: op, Option: setting, Reason: c.reason + " (no retry fixes this)"}, err)
}
