package httpkey

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// JSONField returns a reader for [WithRef] that takes the reference from
// the JSON body's member at path: JSONField("id") reads {"id": "obj_1"},
// JSONField("payment", "id") reads {"payment": {"id": "p_1"}}. The member
// must be a non-empty string or a number (written as the body wrote it);
// anything else is an error. path must not be empty.
func JSONField(path ...string) func(resp *http.Response, body []byte) (string, error) {
	path = append([]string(nil), path...)
	where := strings.Join(path, ".")
	return func(_ *http.Response, body []byte) (string, error) {
		if len(path) == 0 {
			return "", errors.New("JSONField: empty path")
		}
		raw := json.RawMessage(body)
		for _, name := range path {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(raw, &obj); err != nil {
				return "", fmt.Errorf("reading the ref %q: the response body is not a JSON object there: %w", where, err)
			}
			v, ok := obj[name]
			if !ok {
				return "", fmt.Errorf("reading the ref %q: the response body has no member %q", where, name)
			}
			raw = v
		}
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			if s == "" {
				return "", fmt.Errorf("reading the ref %q: it is an empty string", where)
			}
			return s, nil
		}
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		var n json.Number
		if err := d.Decode(&n); err == nil {
			return n.String(), nil
		}
		return "", fmt.Errorf("reading the ref %q: %s is neither a string nor a number", where, snippet(raw, 64))
	}
}

// snippet returns b as text, cut to about max bytes.
func snippet(b []byte, max int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}
