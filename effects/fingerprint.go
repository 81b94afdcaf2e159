package effects

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
)

// Fingerprint returns the SHA-256 of fields, each length-prefixed so that
// ("ab", "c") and ("a", "bc") differ. Adapters store it beside a key to
// detect a key reused with a different payload ([ErrKeyReused]).
func Fingerprint(fields ...[]byte) []byte {
	h := sha256.New()
	var n [8]byte
	for _, f := range fields {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write(f)
	}
	return h.Sum(nil)
}

// FingerprintJSON returns the [Fingerprint] of v's JSON encoding. It is
// deterministic for structs, maps (encoding/json sorts map keys), slices and
// scalars; types with custom MarshalJSON must be deterministic themselves.
func FingerprintJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("effects: fingerprint: %w", err)
	}
	return Fingerprint(b), nil
}
