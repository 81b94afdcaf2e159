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
	"net"
	"strconv"
	"sync"
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
	"effectively.dev/email"
	"effectively.dev/kafka"
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
	// lease bounds how long an attempt whose outcome is unknown holds an
	// at-least-once key before a retry may redo it (kafka.WithLease,
	// email.WithLease): short, so the demo does not stall (an attempt the
	// failover broke after its journal Begin holds its partition until the
	// lease expires), yet well above a send's usual milliseconds; the
	// window it opens is the one the contracts declare.
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
func chargedEvent(ev Event, pi, ledgerID string) []byte {
	b, _ := json.Marshal(map[string]string{"event": ev.ID, "payment_intent": pi, "ledger_entry": ledgerID})
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

	rec := &kgo.Record{Topic: n.topic, Key: []byte(ev.ID), Value: chargedEvent(ev, pi.ID, ledgerID),
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
// by the effect's owner.
type effectivelyOnce struct {
	deps
	charge  *stripe.PaymentIntents
	ledger  *postgres.Effect[ledgerRow]
	receipt *s3.Writer
	event   *kafka.Producer
	mail    *email.Sender
}

// ledgerRow is the ledger step's input.
type ledgerRow struct {
	EventID, Account, PaymentIntent string
	Cents                           int64
}

func newEffectivelyOnce(d deps, mailLog *slog.Logger) (*effectivelyOnce, error) {
	journal, err := postgres.NewJournal(d.pool, d.scope)
	if err != nil {
		return nil, err
	}
	h := &effectivelyOnce{deps: d}
	// With the journal, the PaymentIntent's id outlives Stripe's 24 h key
	// horizon.
	h.charge = stripe.NewPaymentIntents(d.stripe, stripe.WithJournal(journal))
	h.ledger, err = postgres.New(d.pool, d.scope, func(ctx context.Context, tx pgx.Tx, in ledgerRow) (id string, err error) {
		err = tx.QueryRow(ctx, `INSERT INTO `+d.ledger+` (event_id, account, cents, payment_intent) VALUES ($1, $2, $3, $4) RETURNING id::text`,
			in.EventID, in.Account, in.Cents, in.PaymentIntent).Scan(&id)
		return id, err
	})
	if err != nil {
		return nil, err
	}
	if h.receipt, err = s3.New(d.s3, d.bucket, s3.WithPrefix("receipts/")); err != nil {
		return nil, err
	}
	if h.event, err = kafka.NewProducer(d.kafka, d.topic, kafka.WithJournal(journal), kafka.WithLease(lease)); err != nil {
		return nil, err
	}
	h.mail, err = email.New(journal, d.smtp,
		email.WithMailOptions(mail.WithTLSPolicy(mail.NoTLS)),
		email.WithLease(lease),
		email.WithMessageIDDomain("chargehook.example"),
		email.WithLogger(mailLog))
	if err != nil {
		return nil, err
	}
	return h, nil
}

// steps binds the five effects to one event. A later step's input is
// built from the earlier steps' results (found in done, or in prior when
// the step runs in a plan of its own after them): on a redelivery those
// replay with their recorded references, so every payload is the same as
// the first time.
func (h *effectivelyOnce) steps(ev Event, prior effects.Results) []effects.Step {
	ref := func(done effects.Results, step string) (string, error) {
		r, ok := done[step]
		if !ok {
			r, ok = prior[step]
		}
		if !ok || r.Ref == "" {
			return "", fmt.Errorf("no reference from step %q", step)
		}
		return r.Ref, nil
	}
	return []effects.Step{
		effects.Bind(stepCharge, h.charge, stripe.PaymentIntent{
			Amount: ev.Cents, Currency: "usd", PaymentMethod: testCard, Confirm: true,
			Metadata: map[string]string{"event_id": ev.ID},
		}),
		effects.NewStep(stepLedger, h.ledger, func(done effects.Results) (ledgerRow, error) {
			pi, err := ref(done, stepCharge)
			return ledgerRow{EventID: ev.ID, Account: ev.Account, Cents: ev.Cents, PaymentIntent: pi}, err
		}),
		effects.NewStep(stepReceipt, h.receipt, func(done effects.Results) (s3.Object, error) {
			pi, err1 := ref(done, stepCharge)
			id, err2 := ref(done, stepLedger)
			return s3.Object{Body: []byte(receipt(ev, pi, id)), ContentType: "text/plain"}, errors.Join(err1, err2)
		}),
		effects.NewStep(stepEvent, h.event, func(done effects.Results) (kafka.Message, error) {
			pi, err1 := ref(done, stepCharge)
			id, err2 := ref(done, stepLedger)
			return kafka.Message{Key: []byte(ev.ID), Value: chargedEvent(ev, pi, id),
				Headers: []kgo.RecordHeader{{Key: recEvent, Value: []byte(ev.ID)}}}, errors.Join(err1, err2)
		}),
		effects.NewStep(stepMail, h.mail, func(done effects.Results) (email.Message, error) {
			pi, err1 := ref(done, stepCharge)
			id, err2 := ref(done, stepLedger)
			return email.Message{From: mailFrom, To: []string{ev.Email}, Subject: mailSubject(ev),
				Text: receipt(ev, pi, id)}, errors.Join(err1, err2)
		}),
	}
}

// newPlan makes a plan of steps under the handler's scope, observed.
func (h *effectivelyOnce) newPlan(steps ...effects.Step) (*effects.Plan, error) {
	p, err := effects.NewPlan(h.scope, steps...)
	if err != nil {
		return nil, err
	}
	if h.observe != nil {
		p = p.WithObserver(h.observe)
	}
	return p, nil
}

// handle runs the charge and the ledger row in order, as one plan, then
// the receipt, the charged event and the email, which need only those two
// results, at the same time, each as a plan of its own: every step keeps
// its key (NewKey(scope, event id, step)), so running independent steps
// concurrently changes nothing about what a redelivery replays.
func (h *effectivelyOnce) handle(ctx context.Context, ev Event) (bool, error) {
	first, err := h.newPlan(h.steps(ev, nil)[:2]...)
	if err != nil {
		return false, err
	}
	done, err := first.Run(ctx, ev.ID)
	applied := anyApplied(done)
	if err != nil {
		return applied, err
	}
	rest := h.steps(ev, done)[2:]
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, step := range rest {
		p, err := h.newPlan(step)
		if err != nil {
			return applied, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := p.Run(ctx, ev.ID)
			mu.Lock()
			defer mu.Unlock()
			applied = applied || anyApplied(res)
			errs = append(errs, err)
		}()
	}
	wg.Wait()
	return applied, errors.Join(errs...)
}

func anyApplied(res effects.Results) bool {
	for _, r := range res {
		if !r.Replayed() {
			return true
		}
	}
	return false
}

// contract is the composite contract of the five steps (the same for
// every event, and whatever runs concurrently).
func (h *effectivelyOnce) contract() effects.PlanContract {
	p, err := effects.NewPlan(h.scope, h.steps(Event{ID: "contract", Account: "acct", Email: "a@b.example", Cents: 1}, nil)...)
	if err != nil {
		panic(err) // the same steps every time: cannot fail here if it did not in newEffectivelyOnce
	}
	return p.Contract()
}

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
