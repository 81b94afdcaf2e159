package main

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"time"

	"effectively.dev/effects"
)

// Key shapes: the message ids keys are built from. Both are 36-character
// UUID strings, so that they differ only in order, not in size.
const (
	// shapeRandom is a random (version 4) UUID: every new key lands on a
	// random leaf page of the primary key's B-tree.
	shapeRandom = "uuid4"
	// shapeTimeOrdered is a time-ordered (version 7) UUID, ULID's layout
	// in UUID form: 48 bits of Unix milliseconds, then random bits, so new
	// keys land on the B-tree's right edge.
	shapeTimeOrdered = "uuid7"
)

var shapes = []string{shapeRandom, shapeTimeOrdered}

// step is the last part of every key: keys are effects.NewKey(scope, id,
// step), as a consumer builds them.
const step = "ledger"

// newID returns a message id of shape made at t.
func newID(shape string, t time.Time, r *rand.Rand) string {
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	if shape == shapeTimeOrdered {
		ms := uint64(t.UnixMilli())
		for i := range 6 {
			b[i] = byte(ms >> (8 * (5 - i)))
		}
		b[6] = b[6]&0x0f | 0x70
	} else {
		b[6] = b[6]&0x0f | 0x40
	}
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// newKey returns a key for a new message of shape in scope.
func newKey(scope, shape string, r *rand.Rand) (effects.Key, error) {
	return effects.NewKey(scope, newID(shape, time.Now(), r), step)
}

// idSQL is the SQL expression of a message id of shape for row i of a
// fill (generate_series's column i), made at the time whose Unix
// milliseconds are the expression msSQL.
func idSQL(shape, msSQL string) string {
	if shape == shapeTimeOrdered {
		hexMS := fmt.Sprintf("lpad(to_hex(%s), 12, '0')", msSQL)
		return fmt.Sprintf("overlay(gen_random_uuid()::text placing substr(%[1]s, 1, 8) || '-' || substr(%[1]s, 9, 4) || '-7' from 1 for 15)", hexMS)
	}
	return "gen_random_uuid()::text"
}

// keySQL is the SQL expression of the key effects.NewKey(scope, id, step)
// builds, for the parameter $1 holding scope and an id with no character
// NewKey escapes.
func keySQL(idExpr string) string {
	return fmt.Sprintf("$1 || ':' || %s || ':%s'", idExpr, step)
}

// fingerprintSQL is 32 random bytes, the size of a SHA-256 fingerprint.
const fingerprintSQL = "uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())"
