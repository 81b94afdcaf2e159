package httpkey

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// JSONField returns a reader for [WithRef] (and [Rule].Ref) that takes
// the reference from the JSON body's member at path: JSONField("id")
// reads {"id": "obj_1"}, JSONField("payment", "id") reads {"payment":
// {"id": "p_1"}}; in an array, a number picks an element and "*" the
// first that has the rest of the path. The member must be a non-empty
// string or a number (written as the body wrote it); anything else is an
// error. path must not be empty.
func JSONField(path ...string) func(resp *http.Response, body []byte) (string, error) {
	path = append([]string(nil), path...)
	where := strings.Join(path, ".")
	return func(_ *http.Response, body []byte) (string, error) {
		if len(path) == 0 {
			return "", errors.New("JSONField: empty path")
		}
		found := lookup(body, path)
		if len(found) == 0 {
			return "", fmt.Errorf("reading the ref %q: the response body has no such member", where)
		}
		for _, raw := range found {
			var s string
			if err := json.Unmarshal(raw, &s); err == nil {
				if s != "" {
					return s, nil
				}
				continue
			}
			d := json.NewDecoder(bytes.NewReader(raw))
			d.UseNumber()
			var n json.Number
			if err := d.Decode(&n); err == nil {
				return n.String(), nil
			}
		}
		return "", fmt.Errorf("reading the ref %q: it is neither a non-empty string nor a number", where)
	}
}
