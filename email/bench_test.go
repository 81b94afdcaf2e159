package email_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	mail "github.com/wneessen/go-mail"

	"effectively.dev/effects"
	"effectively.dev/email"
)

// BenchmarkSend compares, message by message in alternating order, a
// Sender with its default session reuse, a Sender that opens a session per
// message (WithIdleSessions(0, ...)), and go-mail's DialAndSend written by
// hand (a session per message, no journal), against smtptest over
// loopback and the journal on PostgreSQL. It reports each one's median
// time per message and the ratios of the medians:
//
//	go test -run '^$' -bench BenchmarkSend -benchtime 300x -count 3 ./email/
func BenchmarkSend(b *testing.B) {
	e := newEnv(b)
	reuse := e.sender(b)
	perMessage := e.sender(b, email.WithIdleSessions(0, time.Minute))
	byHand, err := mail.NewClient(e.srv.Host(), mail.WithPort(e.srv.Port()), mail.WithTLSPolicy(mail.NoTLS))
	if err != nil {
		b.Fatal(err)
	}
	ctx := testCtx(b)
	seq := 0
	send := map[string]func() error{
		"reuse": func() error {
			_, err := reuse.Apply(ctx, effects.MustKey("bench", fmt.Sprint(seq), "reuse"), receipt("r"))
			return err
		},
		"per_message": func() error {
			_, err := perMessage.Apply(ctx, effects.MustKey("bench", fmt.Sprint(seq), "per-message"), receipt("p"))
			return err
		},
		"by_hand": func() error {
			m := mail.NewMsg()
			if err := m.From("orders@" + domain); err != nil {
				return err
			}
			if err := m.To("alice@example.net"); err != nil {
				return err
			}
			m.Subject("Your receipt")
			m.SetBodyString(mail.TypeTextPlain, "h")
			return byHand.DialAndSendWithContext(ctx, m)
		},
	}
	names := []string{"reuse", "per_message", "by_hand"}
	took := make(map[string][]time.Duration)
	for _, n := range names { // warm up
		if err := send[n](); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		seq++
		for j := range names {
			n := names[(i+j)%len(names)]
			start := time.Now()
			if err := send[n](); err != nil {
				b.Fatal(err)
			}
			took[n] = append(took[n], time.Since(start))
		}
	}
	b.StopTimer()
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2])
	}
	for _, n := range names {
		b.ReportMetric(median(took[n]), n+"-ns/msg")
	}
	b.ReportMetric(median(took["reuse"])/median(took["per_message"]), "reuse/per_message")
	b.ReportMetric(median(took["reuse"])/median(took["by_hand"]), "reuse/by_hand")
}
