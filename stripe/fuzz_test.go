package stripe

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
	"unicode/utf8"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
)

// fpJournal is a journal that only records the fingerprint Begin gets and
// refuses the key, so Apply stops before calling Stripe.
type fpJournal struct{ fp []byte }

var errStop = errors.New("fuzz: stop before the call")

func (j *fpJournal) Begin(_ context.Context, _ effects.Key, fp []byte, _ time.Duration) (journal.Record, error) {
	j.fp = fp
	return journal.Record{}, errStop
}
func (j *fpJournal) Complete(context.Context, effects.Key, string) error { return nil }
func (j *fpJournal) Release(context.Context, effects.Key, int) error     { return nil }

// journalFingerprint returns the fingerprint PaymentIntents.Apply stores in
// its journal for in. The journal refuses every key, so nothing is sent
// (and the client's backend is a closed local port anyway).
func journalFingerprint(t *testing.T, in PaymentIntent) []byte {
	t.Helper()
	j := &fpJournal{}
	b := stripego.GetBackendWithConfig(stripego.APIBackend, &stripego.BackendConfig{
		URL:           stripego.String("http://127.0.0.1:1"),
		LeveledLogger: &stripego.LeveledLogger{Level: stripego.LevelNull},
	})
	p, err := NewPaymentIntents(client.New("sk_test_fuzz", &stripego.Backends{API: b, Connect: b, Uploads: b}), WithJournal(j))
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Apply(context.Background(), "fuzz-key", in)
	if !errors.Is(err, errStop) || j.fp == nil {
		t.Fatalf("Apply(%+v) = %v, want the journal's refusal after a fingerprint", in, err)
	}
	return j.fp
}

// FuzzJournalFingerprint: the fingerprint the Stripe adapter keeps in its
// journal (the JSON of the params type and the params stripe-go sends),
// which decides
// between a replay from the journal and ErrKeyReused past Stripe's own 24 h,
// is deterministic and differs whenever a field of the PaymentIntent
// differs.
//
// Strings that are not valid UTF-8 are left out: effects.FingerprintJSON
// refuses them as poison (see effects.FuzzFingerprintJSON), so
// such payloads never get a fingerprint to compare.
func FuzzJournalFingerprint(f *testing.F) {
	f.Add(int64(1000), "usd", "cus_1", "pm_1", true, "order", "42", int64(1000), "usd", "cus_1", "pm_1", true, "order", "42")
	f.Add(int64(1000), "usd", "cus_1", "pm_1", true, "order", "42", int64(1000), "eur", "cus_1", "pm_1", true, "order", "42")
	f.Add(int64(1000), "usd", "", "", false, "", "", int64(1000), "usd", "", "", false, "", "x")
	f.Add(int64(0), "", "cus_1", "", false, "k", "v", int64(0), "", "", "cus_1", false, "k", "v")
	f.Fuzz(func(t *testing.T, amount1 int64, cur1, cus1, pm1 string, confirm1 bool, mk1, mv1 string,
		amount2 int64, cur2, cus2, pm2 string, confirm2 bool, mk2, mv2 string) {
		for _, s := range []string{cur1, cus1, pm1, mk1, mv1, cur2, cus2, pm2, mk2, mv2} {
			if !utf8.ValidString(s) {
				return
			}
		}
		a := PaymentIntent{Amount: amount1, Currency: cur1, Customer: cus1, PaymentMethod: pm1, Confirm: confirm1, Metadata: map[string]string{mk1: mv1}}
		b := PaymentIntent{Amount: amount2, Currency: cur2, Customer: cus2, PaymentMethod: pm2, Confirm: confirm2, Metadata: map[string]string{mk2: mv2}}
		fa := journalFingerprint(t, a)
		if !bytes.Equal(fa, journalFingerprint(t, a)) {
			t.Fatalf("fingerprint of %+v is not deterministic", a)
		}
		if got, want := bytes.Equal(fa, journalFingerprint(t, b)), reflect.DeepEqual(a, b); got != want {
			t.Fatalf("fingerprint(%+v) == fingerprint(%+v) is %t, want %t", a, b, got, want)
		}
		change := []func(*PaymentIntent){
			func(p *PaymentIntent) { p.Amount++ },
			func(p *PaymentIntent) { p.Currency += "x" },
			func(p *PaymentIntent) { p.Customer += "x" },
			func(p *PaymentIntent) { p.PaymentMethod += "x" },
			func(p *PaymentIntent) { p.Confirm = !p.Confirm },
			func(p *PaymentIntent) { p.OffSession = true },
			func(p *PaymentIntent) { p.CaptureMethod = "manual" },
			func(p *PaymentIntent) { p.Description = "x" },
			func(p *PaymentIntent) { p.ReceiptEmail = "x@example.com" },
			func(p *PaymentIntent) { p.Metadata = map[string]string{mk1: mv1 + "x"} },
			func(p *PaymentIntent) { p.Metadata = map[string]string{mk1 + "x": mv1} },
		}
		for i, c := range change {
			v := a
			c(&v)
			if bytes.Equal(fa, journalFingerprint(t, v)) {
				t.Fatalf("change %d: fingerprint(%+v) == fingerprint(%+v)", i, a, v)
			}
		}
	})
}
