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
	// permanentErr: the request was refused for a reason a retry will not
	// change (403, 400, NoSuchBucket).
	permanentErr class = iota
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

// classify sorts an error from an aws-sdk-go-v2 S3 call. The SDK wraps
// errors as *smithy.OperationError around *awshttp.ResponseError (which
// carries the status) or, when there was no response, around
// *smithyhttp.RequestSendError or *smithy.CanceledError.
func classify(err error) class {
	var status interface{ HTTPStatusCode() int }
	if errors.As(err, &status) && status.HTTPStatusCode() != 0 {
		code := status.HTTPStatusCode()
		var api smithy.APIError
		apiCode := ""
		if errors.As(err, &api) {
			apiCode = api.ErrorCode()
		}
		switch {
		case code == http.StatusPreconditionFailed:
			return precondition
		case code == http.StatusNotFound && apiCode != "NoSuchBucket" && apiCode != "NoSuchUpload":
			return notFound
		case code == http.StatusConflict && (apiCode == "ConditionalRequestConflict" || apiCode == "OperationAborted"):
			return retry
		case code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests:
			return retry
		case code >= 500:
			return unknown
		}
		return permanentErr
	}
	// No HTTP response. A connection that was never made sent nothing.
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return retry
	}
	return unknown
}

// callErr names the S3 call and object that failed.
func callErr(call, name string, err error) error {
	return fmt.Errorf("%s %s: %w", call, name, err)
}

// permanent wraps an error that no retry will fix.
func permanent(key effects.Key, call, name string, err error) error {
	return fmt.Errorf("%s key %q: %w", opApply, key, callErr(call, name, err))
}
