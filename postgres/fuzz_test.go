package postgres

import (
	"bytes"
	"context"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fuzzCharge is a typical input of an Effect.
type fuzzCharge struct {
	EventID  string
	Account  string
	Cents    int64
	Captured bool
}

// FuzzDefaultFingerprint: the fingerprint New gives an Effect by default
// (effects.FingerprintJSON of the input), which decides between a replay
// and ErrKeyReused, is deterministic and differs whenever a field of the
// input differs.
//
// Strings that are not valid UTF-8 are left out: effects.FingerprintJSON
// refuses them as poison (see effects.FuzzFingerprintJSON), so
// such payloads never get a fingerprint to compare.
func FuzzDefaultFingerprint(f *testing.F) {
	f.Add("evt_1", "acct_1", int64(100), false, "evt_1", "acct_1", int64(100), false)
	f.Add("evt_1", "acct_1", int64(100), false, "evt_1", "acct_1", int64(101), false)
	f.Add("evt_1", "acct_1", int64(100), false, "evt_1", "acct_1", int64(100), true)
	f.Add("evt_1", "", int64(0), false, "", "evt_1", int64(0), false)
	f.Add("a\"b", "c", int64(-1), true, "a", "\"b,c", int64(-1), true)
	pool, err := pgxpool.New(context.Background(), "postgres://fuzz@127.0.0.1:1/never-connected") // New needs a pool; Apply is never called
	if err != nil {
		f.Fatal(err)
	}
	defer pool.Close()
	e, err := New(pool, "fuzz", func(context.Context, pgx.Tx, fuzzCharge) (string, error) { return "", nil })
	if err != nil {
		f.Fatal(err)
	}
	fingerprint := func(t *testing.T, in fuzzCharge) []byte {
		fp, err := e.fingerprint(in)
		if err != nil {
			t.Fatalf("fingerprint(%+v): %v", in, err)
		}
		return fp
	}
	f.Fuzz(func(t *testing.T, id1, acct1 string, cents1 int64, cap1 bool, id2, acct2 string, cents2 int64, cap2 bool) {
		for _, s := range []string{id1, acct1, id2, acct2} {
			if !utf8.ValidString(s) {
				return
			}
		}
		a := fuzzCharge{id1, acct1, cents1, cap1}
		b := fuzzCharge{id2, acct2, cents2, cap2}
		fa := fingerprint(t, a)
		if !bytes.Equal(fa, fingerprint(t, a)) {
			t.Fatalf("fingerprint(%+v) is not deterministic", a)
		}
		if got := bytes.Equal(fa, fingerprint(t, b)); got != (a == b) {
			t.Fatalf("fingerprint(%+v) == fingerprint(%+v) is %t, want %t", a, b, got, a == b)
		}
		for _, c := range []fuzzCharge{{id1 + "x", acct1, cents1, cap1}, {id1, acct1 + "x", cents1, cap1},
			{id1, acct1, cents1 ^ 1, cap1}, {id1, acct1, cents1, !cap1}, {acct1, id1, cents1, cap1}} {
			if c != a && bytes.Equal(fa, fingerprint(t, c)) {
				t.Fatalf("fingerprint(%+v) == fingerprint(%+v)", a, c)
			}
		}
	})
}
