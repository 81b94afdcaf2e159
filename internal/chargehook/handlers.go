package chargehook

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mathrand "math/rand/v2"
	"net"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
	"github.com/twmb/franz-go/pkg/kgo"
	mail "github.com/wneessen/go-mail"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/email"
	"effectively.dev/kafka/outbox"
	"effectively.dev/postgres"
	"effectively.dev/s3"
	"effectively.dev/stripe"
)

// What both handlers do for one payment event, in order: charge the card
// (a Stripe PaymentIntent), write the ledger row with the PaymentIntent's
// id, store a receipt in S3, publish a "charged" event to Kafka, and mail
// the receipt.
const (
	stepCharge  = "charge"
	stepLedger  = "ledger"
	stepReceipt = "receipt"
	stepEvent   = "charged-event"
	stepMail    = "receipt-mail"

	// testCard is stripetest's card that always succeeds.
	testCard = "pm_card_visa"
	mailFrom = "billing@chargehook.example"
	// mailDomain is the domain of the receipt mails' Message-IDs.
	mailDomain = "chargehook.example"
	// lease bounds how long an attempt whose outcome is unknown holds an
	// at-least-once key before a retry in another process may redo it
	// (kafka.WithLease, email.WithLease): short, so that a worker that
	// crashed mid-send holds its partition up only briefly, yet well above
	// a send's usual milliseconds; the window it opens is the one the
	// contracts declare. A lease the failover broke (a Begin, or the
	// ledger's transaction that takes the mail's lease ahead, whose reply
	// was lost) this worker's journal takes back at once.
	lease = time.Second
)

// handler handles one event; applied reports whether it did any effect
// now (false: it found everything done, the duplicate was absorbed).
type handler interface {
	handle(ctx context.Context, ev Event) (applied bool, err error)
}

// deps are the clients one handler's effects talk through. Each handler
// gets its own Stripe account, SMTP server, bucket, topic and tables.
type deps struct {
	pool    *pgxpool.Pool
	stripe  *client.API
	s3      *awss3.Client
	bucket  string
	kafka   *kgo.Client
	topic   string // the "charged" topic
	smtp    string // host:port
	scope   string // key scope (effectively-once only)
	ledger  string // ledger table
	observe effects.Observer
	// dial, when set, makes the mail's SMTP connections (the conformance
	// test's faults); nil dials directly.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// receipt is the receipt's text, for S3 and the email alike.
func receipt(ev Event, pi, ledgerID string) string {
	return fmt.Sprintf("Receipt for payment %s\naccount %s\namount $%d.%02d\npayment %s\nledger entry %s\n",
		ev.ID, ev.Account, ev.Cents/100, ev.Cents%100, pi, ledgerID)
}

// mailSubject names the event, so that the SMTP server's messages can be
// counted per event whatever their Message-ID.
func mailSubject(ev Event) string { return "Your receipt for payment " + ev.ID }

// chargedEvent is the value of a "charged" record.
func chargedEvent(eventID, pi, ledgerID string) []byte {
	b, _ := json.Marshal(map[string]string{"event": eventID, "payment_intent": pi, "ledger_entry": ledgerID})
	return b
}

// naive is the essay's first handler, extended to every effect the way it
// is usually written: check the dedup table, do the effects, mark the
// event seen, each step its own transaction or request. The Stripe call
// gets a fresh idempotency key per attempt (what stripe-go does when none
// is set), the receipt is a plain PUT, the event a plain produce, the
// email a plain send.
type naive struct {
	deps
	mailer *mail.Client
}

func newNaive(d deps) (*naive, error) {
	host, port, err := splitHostPort(d.smtp)
	if err != nil {
		return nil, err
	}
	mc, err := mail.NewClient(host, mail.WithPort(port), mail.WithTLSPolicy(mail.NoTLS))
	if err != nil {
		return nil, err
	}
	return &naive{deps: d, mailer: mc}, nil
}

func (n *naive) handle(ctx context.Context, ev Event) (bool, error) {
	var one int
	err := n.pool.QueryRow(ctx, `SELECT 1 FROM chargehook_naive_seen WHERE event_id = $1`, ev.ID).Scan(&one)
	if err == nil {
		return false, nil // seen: ack
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return false, err
	}

	params := &stripego.PaymentIntentParams{
		Amount: stripego.Int64(ev.Cents), Currency: stripego.String("usd"),
		PaymentMethod: stripego.String(testCard), Confirm: stripego.Bool(true),
	}
	params.Context = ctx
	params.AddMetadata("event_id", ev.ID)
	params.SetIdempotencyKey(randomKey()) // a new key per attempt: Stripe cannot recognise the retry
	pi, err := n.stripe.PaymentIntents.New(params)
	if err != nil {
		return false, fmt.Errorf("charge: %w", err)
	}

	var ledgerID string
	err = n.pool.QueryRow(ctx, `INSERT INTO chargehook_naive_ledger (event_id, account, cents, payment_intent) VALUES ($1, $2, $3, $4) RETURNING id::text`,
		ev.ID, ev.Account, ev.Cents, pi.ID).Scan(&ledgerID)
	if err != nil {
		return false, fmt.Errorf("ledger: %w", err)
	}

	text := receipt(ev, pi.ID, ledgerID)
	_, err = n.s3.PutObject(ctx, &awss3.PutObjectInput{ // last writer wins
		Bucket: aws.String(n.bucket), Key: aws.String("receipts/" + ev.ID),
		Body: bytes.NewReader([]byte(text)), ContentType: aws.String("text/plain"),
	})
	if err != nil {
		return false, fmt.Errorf("receipt: %w", err)
	}

	rec := &kgo.Record{Topic: n.topic, Key: []byte(ev.ID), Value: chargedEvent(ev.ID, pi.ID, ledgerID),
		Headers: []kgo.RecordHeader{{Key: recEvent, Value: []byte(ev.ID)}}}
	if err := n.kafka.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return false, fmt.Errorf("charged event: %w", err)
	}

	msg := mail.NewMsg()
	if err := msg.From(mailFrom); err != nil {
		return false, err
	}
	if err := msg.To(ev.Email); err != nil {
		return false, err
	}
	msg.Subject(mailSubject(ev))
	msg.SetBodyString(mail.TypeTextPlain, text)
	msg.SetMessageID() // random: a resend is a new message
	if err := n.mailer.DialAndSendWithContext(ctx, msg); err != nil {
		return false, fmt.Errorf("receipt mail: %w", err)
	}

	// mark_seen: its own transaction, after the effects. A crash or a
	// failover before it leaves effects without a mark.
	if _, err := n.pool.Exec(ctx, `INSERT INTO chargehook_naive_seen (event_id) VALUES ($1) ON CONFLICT DO NOTHING`, ev.ID); err != nil {
		return false, fmt.Errorf("mark seen: %w", err)
	}
	return true, nil
}

// effectivelyOnce runs the same effects as an [effects.Plan]: each step
// under a key derived from the event's id and the step's name, enforced
// by the effect's owner. The "charged" event is a row of the outbox,
// written in the ledger row's transaction (it describes that row), and
// published by the relay: at least once, like a journaled produce, for a
// row in a transaction the ledger commits anyway instead of a journal's
// lease and record.
type effectivelyOnce struct {
	deps
	charge  *stripe.PaymentIntents
	ledger  *postgres.Effect[ledgerRow]
	receipt *s3.Writer
	relay   *outbox.Relay
	mail    *email.Sender
	plan    *effects.Plan[Event] // the four effects, defined once
}

// ledgerRow is the ledger step's input: the event and the charge.
type ledgerRow struct {
	EventID, Account, Email, PaymentIntent string
	Cents                                  int64
}

// receiptMail is the receipt-mail step's input for an event charged as
// pi and recorded as ledger row id.
func receiptMail(ev Event, pi, ledgerID string) email.Message {
	return email.Message{From: mailFrom, To: []string{ev.Email}, Subject: mailSubject(ev), Text: receipt(ev, pi, ledgerID)}
}

func newEffectivelyOnce(d deps, mailLog *slog.Logger) (*effectivelyOnce, error) {
	h, err := newEffects(d, mailLog)
	if err != nil {
		return nil, err
	}
	// The ledger step enqueues each charged event once (its key dedups),
	// so the relay need not keep published rows: it deletes them.
	if h.relay, err = outbox.NewRelay(d.pool, d.kafka, outbox.WithDeleteSent()); err != nil {
		return nil, err
	}
	if h.plan, err = h.newPlan(); err != nil {
		return nil, err
	}
	return h, nil
}

// newEffects makes the plan's four effects over d's clients, without the
// relay and the plan.
func newEffects(d deps, mailLog *slog.Logger) (*effectivelyOnce, error) {
	jrnl, err := postgres.NewJournal(d.pool, d.scope)
	if err != nil {
		return nil, err
	}
	h := &effectivelyOnce{deps: d}
	// With the journal, the PaymentIntent's id outlives Stripe's 24 h key
	// horizon.
	if h.charge, err = stripe.NewPaymentIntents(d.stripe, stripe.WithJournal(jrnl)); err != nil {
		return nil, err
	}
	// The ledger row and the charged event's outbox row are statements
	// known before they run (the row's id is made here, at random, and is
	// the ref; the ledger has no other unique index, so that a second row
	// for an event would show): postgres.NewPipelined sends them with the
	// key's row and COMMIT in one round trip.
	h.ledger, err = postgres.NewPipelined(d.pool, d.scope, func(ctx context.Context, _ effects.Key, in ledgerRow) (string, []postgres.Statement, error) {
		id := strconv.FormatInt(mathrand.Int64N(math.MaxInt64), 10)
		msgID, err := effects.NewKey(d.scope, in.EventID, stepEvent)
		if err != nil {
			return "", nil, err
		}
		event, err := outbox.EnqueueStatement(outbox.Message{ID: msgID, Topic: d.topic, Key: []byte(in.EventID),
			Value: chargedEvent(in.EventID, in.PaymentIntent, id), Headers: []kgo.RecordHeader{{Key: recEvent, Value: []byte(in.EventID)}}})
		if err != nil {
			return "", nil, err
		}
		return id, []postgres.Statement{{
			SQL:  `INSERT INTO ` + d.ledger + ` (id, event_id, account, cents, payment_intent) VALUES ($1, $2, $3, $4, $5)`,
			Args: []any{id, in.EventID, in.Account, in.Cents, in.PaymentIntent},
		}, event}, nil
	})
	if err != nil {
		return nil, err
	}
	if h.receipt, err = s3.New(d.s3, d.bucket, s3.WithPrefix("receipts/")); err != nil {
		return nil, err
	}
	mailOpts := []email.Option{
		email.WithMailOptions(mail.WithTLSPolicy(mail.NoTLS)),
		email.WithJournal(jrnl, journal.WithLease(lease), journal.WithLogger(mailLog)),
		email.WithMessageIDDomain(mailDomain),
	}
	if d.dial != nil {
		mailOpts = append(mailOpts, email.WithDialContext(d.dial))
	}
	if h.mail, err = email.New(d.smtp, mailOpts...); err != nil {
		return nil, err
	}
	return h, nil
}

// newPlan defines the four effects once, as functions of the event (the
// charged event rides in the ledger step's transaction). A later step's
// input is built from the earlier steps' results: on a redelivery those
// replay with their recorded references, so every payload is the same as
// the first time. The charge and the ledger row run in order; the receipt
// and the email need only those two results and run at the same time
// (effects.Step.Concurrent): every step keeps its key, so this changes
// nothing about what a redelivery replays.
func (h *effectivelyOnce) newPlan() (*effects.Plan[Event], error) {
	ref := func(done effects.Results, step string) (string, error) {
		r, ok := done[step]
		if !ok || r.Ref == "" {
			return "", fmt.Errorf("no reference from step %q", step)
		}
		return r.Ref, nil
	}
	p, err := effects.NewPlan(h.scope,
		effects.NewStep(stepCharge, h.charge, func(ev Event, _ effects.Results) (stripe.PaymentIntent, error) {
			return stripe.PaymentIntent{
				Amount: ev.Cents, Currency: "usd", PaymentMethod: testCard, Confirm: true,
				Metadata: map[string]string{"event_id": ev.ID},
			}, nil
		}),
		effects.NewStep(stepLedger, h.ledger, func(ev Event, done effects.Results) (ledgerRow, error) {
			pi, err := ref(done, stepCharge)
			return ledgerRow{EventID: ev.ID, Account: ev.Account, Email: ev.Email, Cents: ev.Cents, PaymentIntent: pi}, err
		}),
		effects.NewStep(stepReceipt, h.receipt, func(ev Event, done effects.Results) (s3.Object, error) {
			pi, err1 := ref(done, stepCharge)
			id, err2 := ref(done, stepLedger)
			return s3.Object{Body: []byte(receipt(ev, pi, id)), ContentType: "text/plain"}, errors.Join(err1, err2)
		}).Concurrent(),
		effects.NewStep(stepMail, h.mail, func(ev Event, done effects.Results) (email.Message, error) {
			pi, err1 := ref(done, stepCharge)
			id, err2 := ref(done, stepLedger)
			return receiptMail(ev, pi, id), errors.Join(err1, err2)
		}).Concurrent(),
	)
	if err != nil {
		return nil, err
	}
	if h.observe != nil {
		p = p.WithObserver(h.observe)
	}
	return p, nil
}

func (h *effectivelyOnce) handle(ctx context.Context, ev Event) (bool, error) {
	res, err := h.plan.Run(ctx, ev.ID, ev)
	applied := false
	for _, r := range res {
		applied = applied || !r.Replayed()
	}
	return applied, err
}

// contract is the plan's composite contract.
func (h *effectivelyOnce) contract() effects.PlanContract { return h.plan.Contract() }

// objectKey is the S3 object the effectively-once handler writes for ev.
func (h *effectivelyOnce) objectKey(ev Event) string {
	return h.receipt.ObjectKey(effects.MustKey(h.scope, ev.ID, stepReceipt))
}

func randomKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	return host, port, err
}
