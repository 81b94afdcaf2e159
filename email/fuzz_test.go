package email

import (
	"bytes"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// FuzzMessageFingerprint: a message's fingerprint, which decides between a
// replay from the journal and ErrKeyReused, is deterministic and differs
// whenever a field of a message the Sender accepts differs.
//
// The fingerprint joins each address list with "\n", which is unambiguous
// only because no accepted address contains a line break; the target
// checks that too, together with the near misses the joining must keep
// apart (one address "a\nb" against two, an empty list against [""]).
func FuzzMessageFingerprint(f *testing.F) {
	f.Add("Shop <shop@shop.test>", "ann@example.com", "bob@example.com", "carl@example.com", "Your receipt", "Thanks.", "<p>Thanks.</p>")
	f.Add("shop@shop.test", "ann@example.com", "", "", "", "", "")
	f.Add("shop@shop.test", "\"a,b\"@example.com", "c@example.com", "", "s", "t", "")
	f.Add("shop@shop.test", "ann@example.com\nbob@example.com", "", "", "s", "t", "h")
	f.Add("\"Shop\nInc\" <shop@shop.test>", "Ann <ann@example.com>", "", "", "s\r\nBcc: eve@example.com", "t", "")
	s := &Sender{domain: "shop.test"}
	accepted := func(m Message) bool { _, err := s.build("fuzz-key", m); return err == nil }
	f.Fuzz(func(t *testing.T, from, to1, to2, cc, subject, text, html string) {
		m := Message{From: from, To: nonEmpty(to1, to2), Cc: nonEmpty(cc), Subject: subject, Text: text, HTML: html}
		if !accepted(m) {
			return
		}
		for _, a := range slices.Concat(m.To, m.Cc, m.Bcc) {
			if strings.ContainsAny(a, "\r\n") {
				t.Fatalf("an accepted message has the address %q with a line break: the fingerprint's joining is ambiguous", a)
			}
		}
		fp := m.Fingerprint()
		if !bytes.Equal(fp, m.Fingerprint()) {
			t.Fatalf("fingerprint of %+v is not deterministic", m)
		}
		variants := []Message{
			{From: from + "x", To: m.To, Cc: m.Cc, Subject: subject, Text: text, HTML: html},
			{From: from, To: m.Cc, Cc: m.To, Subject: subject, Text: text, HTML: html},
			{From: from, To: m.To, Bcc: m.Cc, Subject: subject, Text: text, HTML: html},
			{From: from, To: m.To, Cc: m.Cc, ReplyTo: from, Subject: subject, Text: text, HTML: html},
			{From: from, To: m.To, Cc: m.Cc, Subject: subject + "x", Text: text, HTML: html},
			{From: from, To: m.To, Cc: m.Cc, Subject: subject, Text: text + "x", HTML: html},
			{From: from, To: m.To, Cc: m.Cc, Subject: subject, Text: html, HTML: text},
			{From: from, To: []string{strings.Join(m.To, "\n")}, Cc: m.Cc, Subject: subject, Text: text, HTML: html},
			{From: from, To: append(slices.Clone(m.To), ""), Cc: m.Cc, Subject: subject, Text: text, HTML: html},
			{From: from, To: slices.Concat(m.To, m.Cc), Subject: subject, Text: text, HTML: html},
			{From: from, To: m.To, Cc: m.Cc, Subject: subject, Text: text, HTML: html, Headers: []Header{{Name: "X-Subject", Value: subject}}},
			{From: from, To: m.To, Cc: m.Cc, Subject: subject, Text: text, HTML: html, Headers: []Header{{Name: "X-A", Value: text}, {Name: "X-B", Value: html}}},
			{From: from, To: m.To, Cc: m.Cc, Subject: subject, Text: text, HTML: html, Headers: []Header{{Name: "X-B", Value: html}, {Name: "X-A", Value: text}}},
			{From: from, To: m.To, Cc: m.Cc, Subject: subject, Text: text, HTML: html, Attachments: []Attachment{{Filename: "a.txt", Data: []byte(text)}}},
			{From: from, To: m.To, Cc: m.Cc, Subject: subject, Text: text, HTML: html, Attachments: []Attachment{{Filename: "a.txt", Data: []byte(text), Inline: true}}},
			{From: from, To: m.To, Cc: m.Cc, Subject: subject, Text: text, HTML: html, Attachments: []Attachment{{Filename: "a.txt", ContentType: "text/plain", Data: []byte(text)}}},
			{From: from, To: m.To, Cc: m.Cc, Subject: subject, Text: text, HTML: html, Attachments: []Attachment{{Filename: "a.txt", Data: []byte(text)}, {Filename: "b.txt", Data: []byte(html)}}},
		}
		for _, v := range variants {
			if reflect.DeepEqual(v, m) || !accepted(v) {
				continue
			}
			if bytes.Equal(fp, v.Fingerprint()) {
				t.Fatalf("fingerprint(%+v) == fingerprint(%+v)", m, v)
			}
		}
	})
}

// nonEmpty returns the non-empty strings of ss, or nil.
func nonEmpty(ss ...string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}
