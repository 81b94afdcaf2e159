package httpkey

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// addMember returns the JSON object body with the string member
// path[len(path)-1]: value added first to the object at path's other
// members ({"variables": {"input": {...}}} for the path variables, input,
// apiRequestKey); the rest of the body is kept byte for byte. The objects
// on the way must exist and the member must not.
func addMember(body []byte, path []string, value string) ([]byte, error) {
	where := strings.Join(path, ".")
	if !json.Valid(body) {
		return nil, fmt.Errorf("the body is not JSON, so the key cannot go in its %q member (WithKeyField)", where)
	}
	open, err := objectAt(body, path[:len(path)-1])
	if err != nil {
		return nil, fmt.Errorf("the key's member %q (WithKeyField): %w", where, err)
	}
	name := path[len(path)-1]
	var members map[string]json.RawMessage
	end := open + objectLen(body[open:])
	_ = json.Unmarshal(body[open:end], &members) // valid: the whole body is
	if _, ok := members[name]; ok {
		return nil, fmt.Errorf("the body already has a %q member; leave it to the effect, which sets it from the key", where)
	}
	n, _ := json.Marshal(name) // strings always marshal
	v, _ := json.Marshal(value)
	out := make([]byte, 0, len(body)+len(n)+len(v)+2)
	out = append(out, body[:open+1]...)
	out = append(out, n...)
	out = append(out, ':')
	out = append(out, v...)
	if len(members) > 0 {
		out = append(out, ',')
	}
	return append(out, body[open+1:]...), nil
}

// objectAt returns the offset of the '{' of the object at path in the
// valid JSON document body.
func objectAt(body []byte, path []string) (int, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	start := func() (int, error) {
		before := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return 0, err
		}
		if d, ok := tok.(json.Delim); !ok || d != '{' {
			return 0, errors.New("not a JSON object")
		}
		return int(before) + bytes.IndexByte(body[before:], '{'), nil
	}
	off, err := start()
	if err != nil {
		return 0, fmt.Errorf("the body is %w", err)
	}
	for i, name := range path {
		found := false
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return 0, err
			}
			if tok.(string) == name {
				if off, err = start(); err != nil {
					return 0, fmt.Errorf("member %q is %w", strings.Join(path[:i+1], "."), err)
				}
				found = true
				break
			}
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return 0, err
			}
		}
		if !found {
			return 0, fmt.Errorf("the body has no member %q", strings.Join(path[:i+1], "."))
		}
	}
	return off, nil
}

// objectLen returns the length of the JSON object that b starts with.
func objectLen(b []byte) int {
	dec := json.NewDecoder(bytes.NewReader(b))
	var raw json.RawMessage
	if dec.Decode(&raw) != nil {
		return len(b)
	}
	return int(dec.InputOffset())
}

// errTooLarge is returned by readAtMost for a body longer than its limit.
var errTooLarge = errors.New("body longer than the limit")

// readAtMost reads r whole when it holds at most limit bytes, and
// returns errTooLarge, having read limit+1 bytes, when it holds more.
func readAtMost(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, errTooLarge
	}
	return b, nil
}
