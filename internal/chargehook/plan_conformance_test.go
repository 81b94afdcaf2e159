package chargehook

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"testing"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/email"
	"effectively.dev/email/smtptest"
	"effectively.dev/kafka/outbox"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
	"effectively.dev/s3"
	"effectively.dev/s3/s3test"
	"effectively.dev/stripe/stripetest"
)

// TestPlanConformance holds the demo's plan (a Stripe charge, the ledger
// row with its charged event, the receipt in S3 and the receipt mail) to
// its composite contract under conformance.RunPlan: every step's round
// trips (its journal's included) lost, cancelled and cut by a killed
// process, each step counted in its own backend.
func TestPlanConformance(t *testing.T) {
	conformance.RunPlan(t, "chargehook", newPlanHarness,
		conformance.AllowUnverified("the steps' kits (stripetest, the database, the bucket, the mail server) keep their own clocks, which this harness "+
			"does not age together; each step's horizon is verified by its adapter's own suite", conformance.PlanHorizon))
}

// planHarness runs the demo's plan against the kits: one database, Stripe
// server, S3 bucket and SMTP server per scenario.
type planHarness struct {
	url    string
	db     *pgxpool.Pool
	stripe *stripetest.Server
	s3     *s3test.Server
	smtp   *smtptest.Server
	scope  string
}

func newPlanHarness(t testing.TB) conformance.PlanHarness[Event] {
	ctx := context.Background()
	url := pgtest.DB(t)
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if err := errors.Join(postgres.Migrate(ctx, db), outbox.Migrate(ctx, db)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, schema); err != nil {
		t.Fatal(err)
	}
	return &planHarness{url: url, db: db, stripe: stripetest.Start(t), s3: s3test.Start(t), smtp: smtptest.Start(t), scope: "chargehook-" + rand.Text()[:8]}
}

// Make builds the plan as the demo does, each step's effect (and its
// journal) from clients of its own whose connections go through the
// step's faults.
func (h *planHarness) Make(ctx context.Context, f *conformance.PlanFaults) (conformance.PlanRunner[Event], func(), error) {
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	built := map[string]*effectivelyOnce{}
	for _, step := range []string{stepCharge, stepLedger, stepReceipt, stepMail} {
		sf := f.Step(step)
		cfg, err := pgxpool.ParseConfig(h.url)
		if err != nil {
			return nil, nil, err
		}
		cfg.ConnConfig.DialFunc = sf.DialContext
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		tr := sf.Transport(nil)
		closers = append(closers, pool.Close, tr.CloseIdleConnections)
		o := h.s3.Options()
		o.HTTPClient = &http.Client{Transport: tr}
		eo, err := newEffects(deps{pool: pool, stripe: h.stripe.Client(&http.Client{Transport: tr}), s3: awss3.New(o), bucket: h.s3.Bucket, topic: "chargehook-charged",
			smtp: h.smtp.Addr(), scope: h.scope, ledger: "chargehook_ledger", dial: sf.DialContext}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		closers = append(closers, func() { eo.mail.Close() })
		built[step] = eo
	}
	h0 := &effectivelyOnce{deps: built[stepCharge].deps, charge: built[stepCharge].charge, ledger: built[stepLedger].ledger,
		receipt: built[stepReceipt].receipt, mail: built[stepMail].mail}
	p, err := h0.newPlan()
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return p, closeAll, nil
}

// Event is a payment of the account acct_plan.
func (h *planHarness) Event(id string) Event {
	return Event{ID: id, Account: "acct_plan", Email: "customer@example.net", Cents: 4200}
}

// Count reads each step's backend: PaymentIntents made under the step's
// key, ledger rows of the event, writes of the receipt's object, mails
// with the step's Message-ID.
func (h *planHarness) Count(ctx context.Context, step, id string) (int, error) {
	key, err := effects.NewKey(h.scope, id, step)
	if err != nil {
		return 0, err
	}
	switch step {
	case stepCharge:
		return h.stripe.Created(string(key)), nil
	case stepLedger:
		var n int
		err := h.db.QueryRow(ctx, `SELECT count(*) FROM chargehook_ledger WHERE event_id = $1`, id).Scan(&n)
		return n, err
	case stepReceipt:
		return h.s3.Writes(ctx, "receipts/"+s3.EscapeKey(key))
	case stepMail:
		return h.smtp.Count(email.MessageID(key, mailDomain)), nil
	}
	return 0, errors.New("no such step: " + step)
}
