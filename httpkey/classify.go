package httpkey

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Rule classifies a response by its status, a header and a member of its
// JSON body, before the statuses ([WithStatus]) are consulted: what a
// vendor says in an error code, a header, or an error returned with a 2xx.
// Every condition that is set must hold; a rule sets at least one. Rules
// are tried in the order given ([WithRule]); the first that matches
// decides.
//
// Adyen's "request in progress" is a 422 or 409 whose errorCode is 704:
//
//	httpkey.WithRule(httpkey.Rule{Outcome: httpkey.InFlight,
//		Status: []int{409, 422}, Field: []string{"errorCode"}, Value: "704"})
//
// A GraphQL API's errors, returned with HTTP 200 in the body's "errors"
// array, are refusals, never Applied:
//
//	httpkey.WithRule(httpkey.Rule{Outcome: httpkey.Refused,
//		Status: []int{200}, Field: []string{"errors"}})
type Rule struct {
	// Outcome is what a matching response means. [Done] needs Ref.
	Outcome Outcome
	// Status, when not empty, lists the statuses the rule applies to
	// (200 to 599, no 3xx). An empty Status applies to every status, 2xx
	// included: a rule that matches a 2xx makes it the rule's outcome,
	// never Applied (an error returned with HTTP 200, as GraphQL APIs do).
	Status []int
	// Header, when set, is a response header that must be present and,
	// when HeaderValue is set, equal to HeaderValue (ignoring case and
	// surrounding space).
	Header, HeaderValue string
	// Field, when set, is the path of a member of the JSON body that must
	// be present and not null, false, "" or empty; when Value is set, the
	// member (a string, or a number or boolean as written) must equal it.
	// A path element "*" stands for any element of an array, a number for
	// the element at that index: {"errors": [{"code": "X"}]} matches
	// Field {"errors", "*", "code"} with Value "X".
	Field []string
	Value string
	// Contains, when set, requires the member at Field to be a string
	// that contains it, ignoring case (a vendor that says "idempotency"
	// only in its error's description).
	Contains string
	// Ref reads, for [Done], the reference of what the earlier request
	// created from the response (as [WithRef] reads a 2xx), e.g.
	// [JSONField]("error", "errors", "0", "links", "conflicting_resource_id").
	Ref func(resp *http.Response, body []byte) (string, error)
}

// WithRule adds r to the rules that classify a response before its
// status does (see [Rule]); [New] validates it. Presets set their own
// rules; rules added after a preset are tried after the preset's.
func WithRule(r Rule) Option {
	return option(func(c *config) {
		r.Status = append([]int(nil), r.Status...)
		r.Field = append([]string(nil), r.Field...)
		c.rules = append(c.rules, r)
	})
}

// validRule returns why r cannot be used, or "".
func validRule(r Rule) string {
	switch {
	case r.Outcome < InFlight || r.Outcome > Done:
		return fmt.Sprintf("unknown outcome %v", r.Outcome)
	case len(r.Status) == 0 && r.Header == "" && len(r.Field) == 0:
		return "no condition: set Status, Header or Field"
	case r.Outcome == Done && r.Ref == nil:
		return "outcome Done needs Ref, to read the reference of what the earlier request created"
	case r.Header != "" && !validToken(r.Header):
		return fmt.Sprintf("%q is not a valid header name", r.Header)
	case r.HeaderValue != "" && r.Header == "":
		return "HeaderValue without Header"
	case (r.Value != "" || r.Contains != "") && len(r.Field) == 0:
		return "Value or Contains without Field"
	}
	for _, code := range r.Status {
		if code < 200 || code > 599 || (code >= 300 && code < 400) {
			return fmt.Sprintf("status %d: a rule applies to 2xx, 4xx and 5xx (3xx is a redirect Apply does not follow)", code)
		}
	}
	for _, p := range r.Field {
		if p == "" {
			return "empty element in Field"
		}
	}
	return ""
}

// matches reports whether r holds for the response.
func (r *Rule) matches(status int, h http.Header, body []byte) bool {
	if len(r.Status) > 0 && !containsInt(r.Status, status) {
		return false
	}
	if r.Header != "" {
		v, ok := h[http.CanonicalHeaderKey(r.Header)]
		if !ok || len(v) == 0 {
			return false
		}
		if r.HeaderValue != "" && !strings.EqualFold(strings.TrimSpace(v[0]), strings.TrimSpace(r.HeaderValue)) {
			return false
		}
	}
	if len(r.Field) > 0 {
		found := false
		for _, raw := range lookup(body, r.Field) {
			s, ok := scalar(raw)
			switch {
			case r.Value != "" && (!ok || s != r.Value):
				continue
			case r.Contains != "" && (!ok || !strings.Contains(strings.ToLower(s), strings.ToLower(r.Contains))):
				continue
			}
			if present(raw) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func containsInt(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// lookup returns the values at path in the JSON document doc: several
// when a "*" crosses an array, none when the path is not there.
func lookup(doc []byte, path []string) []json.RawMessage {
	cur := []json.RawMessage{json.RawMessage(doc)}
	for _, p := range path {
		var next []json.RawMessage
		for _, raw := range cur {
			raw = bytes.TrimSpace(raw)
			if len(raw) == 0 {
				continue
			}
			switch raw[0] {
			case '{':
				var obj map[string]json.RawMessage
				if json.Unmarshal(raw, &obj) == nil {
					if v, ok := obj[p]; ok {
						next = append(next, v)
					}
				}
			case '[':
				var arr []json.RawMessage
				if json.Unmarshal(raw, &arr) != nil {
					continue
				}
				if p == "*" {
					next = append(next, arr...)
				} else if i, err := strconv.Atoi(p); err == nil && i >= 0 && i < len(arr) {
					next = append(next, arr[i])
				}
			}
		}
		cur = next
	}
	return cur
}

// scalar returns a JSON string's value, or a number's or boolean's text.
func scalar(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	if len(raw) > 0 && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9' || raw[0] == 't' || raw[0] == 'f') && json.Valid(raw) {
		return string(raw), true
	}
	return "", false
}

// present reports whether raw is a value that says something: not null,
// false, "", [] or {}.
func present(raw json.RawMessage) bool {
	switch string(bytes.Join(bytes.Fields(raw), nil)) {
	case "", "null", "false", `""`, "[]", "{}":
		return false
	}
	return true
}

// maxLabel is the longest error code or request id a *ResponseError
// keeps.
const maxLabel = 64

// label returns s when it is a short identifier (at most maxLabel bytes
// of letters, digits and "._:/-"), as a vendor's error codes and request
// ids are, and "" otherwise: text that may carry a customer's data never
// enters an error.
func label(s string) string {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > maxLabel {
		return ""
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("._:/-", c) >= 0:
		default:
			return ""
		}
	}
	return s
}

// firstLabel returns the first value at path in body that is a label.
func firstLabel(body []byte, path []string) string {
	if len(path) == 0 {
		return ""
	}
	for _, raw := range lookup(body, path) {
		if s, ok := scalar(raw); ok {
			if l := label(s); l != "" {
				return l
			}
		}
	}
	return ""
}
