package email_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/wneessen/go-mail"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/email"
	"effectively.dev/email/smtptest"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// conformanceLease is short so that the suite's retries outlast it; the
// suite retries for WithRetryFor, far longer.
const conformanceLease = 300 * time.Millisecond

const conformanceDomain = "conformance.test"

// harness runs a Sender against a real in-process SMTP server and a real
// Postgres journal. Effects are counted on the SMTP server: messages that
// carry the Message-ID derived from the key.
type harness struct {
	srv *smtptest.Server
	url string // the journal's database
	// build makes the effect under test; the counterexample replaces it.
	build func(ctx context.Context, h *harness, f *conformance.Faults) (effects.Effect[email.Message], func(), error)
}

var (
	_ conformance.Harness[email.Message] = (*harness)(nil)
	_ conformance.Restarter              = (*harness)(nil)
	_ conformance.Ager                   = (*harness)(nil)
)

func newHarness(t testing.TB, build func(context.Context, *harness, *conformance.Faults) (effects.Effect[email.Message], func(), error)) *harness {
	t.Helper()
	h := &harness{srv: smtptest.Start(t), build: build}
	if build == nil {
		ctx := testCtx(t)
		h.url = pgtest.DB(t)
		pool, err := pgxpool.New(ctx, h.url)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if err := postgres.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		h.build = buildSender
	}
	return h
}

// buildSender is the real adapter, as a process would make it at
// start-up: a new connection pool for the journal and a new Sender. Both
// the SMTP connections and the journal's Postgres connections go through
// the suite's faults, so the sweeps also lose and cut the journal's
// replies (Begin, Complete, Release) — the sent-record's commit is one end
// of the declared duplicate window.
func buildSender(ctx context.Context, h *harness, f *conformance.Faults) (effects.Effect[email.Message], func(), error) {
	cfg, err := pgxpool.ParseConfig(h.url)
	if err != nil {
		return nil, nil, err
	}
	cmds := &commands{}
	f.SetAppFaulter(appFaulter(h.srv, cmds))
	cfg.ConnConfig.DialFunc = cmds.dial(f.DialContext, false)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	j, err := postgres.NewJournal(pool, "conformance")
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	s, err := email.New(h.srv.Addr(),
		email.WithJournal(j, journal.WithLease(conformanceLease)),
		email.WithMailOptions(mail.WithTLSPolicy(mail.NoTLS), mail.WithTimeout(5*time.Second)),
		email.WithDialContext(cmds.dial(f.DialContext, true)),
		email.WithMessageIDDomain(conformanceDomain),
	)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return s, pool.Close, nil
}

func (h *harness) Make(ctx context.Context, f *conformance.Faults) (effects.Effect[email.Message], func(), error) {
	return h.build(ctx, h, f)
}

func (h *harness) Input(key effects.Key, variant int) email.Message {
	return email.Message{
		From:    "Shop <orders@" + conformanceDomain + ">",
		To:      []string{"customer@example.net"},
		Subject: "Your receipt",
		Text:    fmt.Sprintf("Receipt for %q (variant %d).", key, variant),
	}
}

func (h *harness) Count(_ context.Context, key effects.Key) (int, error) {
	return h.srv.Count(email.MessageID(key, conformanceDomain)), nil
}

func (h *harness) Total(context.Context) (int, error) { return h.srv.Total(), nil }

// Restart restarts the SMTP server (the effect's backend) on the same
// address with the messages it has.
func (h *harness) Restart(context.Context) error { return h.srv.Restart() }

// Age makes every journal record d older: its timestamps (which Prune
// reads) and its lease. The journal is what enforces the keys; the SMTP
// server keeps nothing that expires. Pruning is not run.
func (h *harness) Age(ctx context.Context, d time.Duration) error {
	if h.url == "" {
		return nil // the counterexample keeps no records to age
	}
	return pgtest.Age(ctx, h.url, d)
}

// The keys are kept by postgres.Journal, a table nothing evicts from but
// Prune: key-capacity with 1,000 keys (a fifth of its default) keeps CI
// short. What the harness cannot do is allowed by name: no Attacher (the
// smtptest server is a value in the test process, which a child cannot
// reach), no CrashRestarter (the journal is on the shared cluster, not
// the test's to crash). slow-reply holds each reply 300 ms, under
// go-mail's 5 s per-command timeout: the adapter waits for it.
func TestConformance(t *testing.T) {
	rep := conformance.Run(t, "email", func(t testing.TB) conformance.Harness[email.Message] {
		return newHarness(t, nil)
	}, conformance.WithRetryFor(10*time.Second), conformance.WithCapacity(1000), conformance.WithSlowReply(300*time.Millisecond),
		conformance.AllowUnverified("smtptest runs in the test process, which a child process cannot reach; the journal is on the shared cluster, "+
			"not the test's to crash; postgres.Journal keeps keys in a table nothing evicts from but Prune, so 1,000 keys show what 5,000 would",
			conformance.ScenarioProcess, conformance.ScenarioCrashRestart, conformance.ScenarioKeyCapacity))
	for _, row := range rep.Rows {
		// successor-process needs an Attacher, which this harness (an
		// smtptest server value in the test process) does not give; no
		// CrashRestarter: the journal is on the shared cluster; key-scope
		// and key-bytes do not apply to this harness.
		if row.Verdict != conformance.Pass && !row.NotApplicable && row.Scenario != conformance.ScenarioProcess &&
			row.Scenario != conformance.ScenarioCrashRestart {
			t.Errorf("%s: %s, want pass", row.Scenario, row.Verdict)
		}
	}
}

// naiveSender is the counterexample: the same go-mail send with the same
// deterministic Message-ID, but no sent-record, claiming effectively-once.
// SMTP servers do not dedup on Message-ID, so every redelivery sends again.
type naiveSender struct {
	client *mail.Client
}

func (n *naiveSender) Contract() effects.Contract {
	return effects.Contract{
		Guarantee: effects.EffectivelyOnce,
		Enforcer:  "deterministic Message-ID (the lie: SMTP servers do not dedup on it)",
	}
}

func (n *naiveSender) Apply(ctx context.Context, key effects.Key, m email.Message) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	msg := mail.NewMsg()
	if err := msg.From(m.From); err != nil {
		return effects.Result{}, err
	}
	if err := msg.To(m.To...); err != nil {
		return effects.Result{}, err
	}
	msg.Subject(m.Subject)
	msg.SetBodyString(mail.TypeTextPlain, m.Text)
	msg.SetMessageIDWithValue(email.MessageID(key, conformanceDomain))
	if err := n.client.DialAndSendWithContext(ctx, msg); err != nil && !msg.IsDelivered() {
		// Honest about the failure at least: retry with the same key.
		return effects.Result{}, effects.Ambiguous("naive.Send", key, err)
	}
	return effects.Result{Status: effects.Applied, Ref: msg.ServerResponse()}, nil
}

func TestCounterexampleWithoutJournalFails(t *testing.T) {
	rep := conformance.Run(t, "email-naive", func(t testing.TB) conformance.Harness[email.Message] {
		return newHarness(t, func(_ context.Context, h *harness, f *conformance.Faults) (effects.Effect[email.Message], func(), error) {
			c, err := mail.NewClient(h.srv.Host(), mail.WithPort(h.srv.Port()), mail.WithTLSPolicy(mail.NoTLS),
				mail.WithTimeout(5*time.Second), mail.WithDialContextFunc(f.DialContext))
			if err != nil {
				return nil, nil, err
			}
			return &naiveSender{client: c}, func() {}, nil
		})
	}, conformance.WithRetryFor(5*time.Second), conformance.WithStorm(200, 0.9), conformance.WithLateRedelivery(time.Second), conformance.ReportOnly())

	// Every scenario that repeats a key catches it; refusing invalid keys
	// before I/O is the one thing it does right.
	want := []string{
		conformance.ScenarioRedelivery, conformance.ScenarioLateRedelivery, conformance.ScenarioHorizon,
		conformance.ScenarioConcurrent, conformance.ScenarioLostReply, conformance.ScenarioCut, conformance.ScenarioCancel,
		conformance.ScenarioSchedules, conformance.ScenarioSlowBackend,
		conformance.ScenarioKeyReuse, conformance.ScenarioRaceReuse, conformance.ScenarioDistinctKeys, conformance.ScenarioHostileKeys,
		conformance.ScenarioStorm, conformance.ScenarioKeyCapacity, conformance.ScenarioRestart,
	}
	failed := rep.Failed()
	if !slices.Equal(failed, want) {
		t.Errorf("failed scenarios %v, want %v", failed, want)
	}
	if row, _ := rep.Row(conformance.ScenarioInvalidKey); row.Verdict != conformance.Pass {
		t.Errorf("invalid-keys: %s, want pass (it validates keys)", row.Verdict)
	}
	if testing.Verbose() {
		t.Logf("counterexample matrix:\n%s", rep.Markdown())
	}
}
