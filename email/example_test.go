package email_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/wneessen/go-mail"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/effects/journal/memjournal"
	"effectively.dev/email"
	"effectively.dev/email/smtptest"
	"effectively.dev/postgres"
)

// A production set-up: the sent-records live in Postgres, next to the rest
// of the application's state, and the server is reached with STARTTLS and
// authentication (go-mail's defaults require STARTTLS).
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	sent, err := postgres.NewJournal(pool, "shop")
	if err != nil {
		log.Fatal(err)
	}
	receipts, err := email.New("smtp.example.com:587",
		email.WithJournal(sent, journal.WithLease(2*time.Minute)),
		email.WithMailOptions(
			mail.WithSMTPAuth(mail.SMTPAuthPlain),
			mail.WithUsername("shop"),
			mail.WithPassword("secret"),
		),
		email.WithMessageIDDomain("shop.example.com"),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer receipts.Close() // the SMTP sessions it keeps open between messages

	// In the handler of a delivery whose id is eventID:
	eventID := "evt_1"
	key := effects.MustKey("shop", eventID, "receipt")
	res, err := receipts.Apply(ctx, key, email.Message{
		From:    "Shop <orders@shop.example.com>",
		To:      []string{"alice@example.net"},
		Subject: "Your receipt",
		Text:    "Thank you for your order.",
	})
	switch {
	case err == nil:
		fmt.Println(res.Status, res.Ref) // ack the delivery
	case effects.ClassOf(err) == effects.Retryable:
		// ErrInFlight, ErrTransient, ErrAmbiguous: do not ack; redelivery
		// retries with the same key.
	case effects.ClassOf(err) == effects.InvalidConfig:
		// A refused login, a refused TLS handshake: stop the worker and
		// fix the configuration; nothing was sent.
	default:
		// Permanent: ErrInvalidKey, ErrKeyReused, ErrInvalidMessage,
		// ErrRejected (a 5xx). Retrying cannot help; dead-letter it.
	}
}

// A redelivered message is answered from the sent-record: one email.
func ExampleSender_Apply() {
	srv, err := smtptest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	receipts, err := email.New(srv.Addr(), email.WithJournal(memjournal.New(nil)),
		email.WithMailOptions(mail.WithTLSPolicy(mail.NoTLS)), // the test server speaks plain SMTP
	)
	if err != nil {
		log.Fatal(err)
	}
	key := effects.MustKey("shop", "evt_1", "receipt")
	msg := email.Message{
		From:    "orders@shop.example.com",
		To:      []string{"alice@example.net"},
		Subject: "Your receipt",
		Text:    "Thank you for your order.",
	}
	for range 3 { // the queue delivers the event three times
		res, err := receipts.Apply(context.Background(), key, msg)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.Status, res.Ref)
	}
	fmt.Println("messages on the server:", srv.Count(email.MessageID(key, "shop.example.com")))
	// Output:
	// applied 2.0.0 OK: queued as Q00000001
	// replayed 2.0.0 OK: queued as Q00000001
	// replayed 2.0.0 OK: queued as Q00000001
	// messages on the server: 1
}

// The duplicate window, shown: the server accepts the message but the
// connection drops before its 250 reaches the sender. The outcome is
// unknown; within the lease a retry is told to wait, after it the message
// goes out again with the same Message-ID.
func ExampleSender_Apply_unknownOutcome() {
	srv, err := smtptest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	lease := 200 * time.Millisecond
	receipts, err := email.New(srv.Addr(),
		email.WithJournal(memjournal.New(nil), journal.WithLease(lease)),
		email.WithMailOptions(mail.WithTLSPolicy(mail.NoTLS)),
	)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	key := effects.MustKey("shop", "evt_2", "receipt")
	msg := email.Message{From: "orders@shop.example.com", To: []string{"bob@example.net"}, Text: "Thanks."}

	srv.DropNextDataReply()
	_, err = receipts.Apply(ctx, key, msg)
	fmt.Println("ambiguous:", errors.Is(err, effects.ErrAmbiguous))

	_, err = receipts.Apply(ctx, key, msg)
	fmt.Println("in flight:", errors.Is(err, effects.ErrInFlight))

	time.Sleep(lease)
	res, err := receipts.Apply(ctx, key, msg)
	fmt.Println(res.Status, err)
	fmt.Println("messages on the server:", srv.Count(email.MessageID(key, "shop.example.com")))
	// Output:
	// ambiguous: true
	// in flight: true
	// applied <nil>
	// messages on the server: 2
}

// A receipt with an HTML alternative, a PDF attached, a Cc, a Bcc and a
// List-Unsubscribe header, sent with go-mail's default STARTTLS policy to
// a server whose certificate the client trusts.
func ExampleSender_Apply_richMessage() {
	srv, err := smtptest.New(smtptest.WithSTARTTLS())
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	receipts, err := email.New(srv.Addr(), email.WithJournal(memjournal.New(nil)),
		email.WithMailOptions(mail.WithTLSConfig(srv.TLSConfig())), // STARTTLS stays required, go-mail's default
	)
	if err != nil {
		log.Fatal(err)
	}
	res, err := receipts.Apply(context.Background(), effects.MustKey("shop", "evt_3", "receipt"), email.Message{
		From:    "Shop <orders@shop.example.com>",
		To:      []string{"alice@example.net"},
		Cc:      []string{"accounts@example.net"},
		Bcc:     []string{"archive@shop.example.com"},
		ReplyTo: "support@shop.example.com",
		Subject: "Your receipt",
		Text:    "Thank you for your order. Your receipt is attached.",
		HTML:    "<p>Thank you for your order. Your receipt is attached.</p>",
		Headers: []email.Header{{Name: "List-Unsubscribe", Value: "<mailto:unsubscribe@shop.example.com>"}},
		Attachments: []email.Attachment{
			{Filename: "receipt.pdf", ContentType: "application/pdf", Data: []byte("%PDF-1.7 ...")},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	m := srv.Messages()[0]
	fmt.Println(res.Status, "over TLS:", m.TLS, "envelope recipients:", len(m.To))
	fmt.Println(m.Header.Get("List-Unsubscribe"), m.Header.Get("Bcc") == "")
	// Output:
	// applied over TLS: true envelope recipients: 3
	// <mailto:unsubscribe@shop.example.com> true
}
