package email_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/wneessen/go-mail"
	"go.uber.org/goleak"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
	"effectively.dev/email"
	"effectively.dev/email/smtptest"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

func TestMain(m *testing.M) {
	code := pgtest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// testLease is short so that tests can wait it out.
const testLease = 300 * time.Millisecond

const domain = "shop.test"

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// env is one test's backends: a real SMTP server and a real Postgres
// journal on a fresh database.
type env struct {
	srv     *smtptest.Server
	pool    *pgxpool.Pool
	scope   string
	journal *spyJournal
}

func newEnv(t testing.TB) *env {
	t.Helper()
	ctx := testCtx(t)
	pool, err := pgxpool.New(ctx, pgtest.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return (&env{pool: pool}).sub(t)
}

// sub returns an env for the subtest t on e's database: a new SMTP server
// and a journal in a scope of its own. Creating a database per subtest
// would cost more than the subtest.
func (e *env) sub(t testing.TB) *env {
	t.Helper()
	j, err := postgres.NewJournal(e.pool, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	return &env{srv: smtptest.Start(t), pool: e.pool, scope: t.Name(), journal: &spyJournal{Journal: j}}
}

// sender builds a Sender on e's journal and server with the test lease.
func (e *env) sender(t testing.TB, opts ...email.Option) *email.Sender {
	t.Helper()
	return e.senderAt(t, e.srv.Addr(), opts...)
}

func (e *env) senderAt(t testing.TB, addr string, opts ...email.Option) *email.Sender {
	t.Helper()
	s, err := email.New(addr, append([]email.Option{
		email.WithMailOptions(mail.WithTLSPolicy(mail.NoTLS), mail.WithTimeout(5*time.Second)),
		email.WithJournal(e.journal, journal.WithLease(testLease)),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// count returns how many copies of key's message the server accepted.
func (e *env) count(key effects.Key) int { return e.srv.Count(email.MessageID(key, domain)) }

// journalRows counts the journal's records in e's scope.
func (e *env) journalRows(t testing.TB) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM effectively_journal WHERE scope = $1`, e.scope).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func receipt(body string) email.Message {
	return email.Message{
		From:    "Shop <orders@" + domain + ">",
		To:      []string{"alice@example.net"},
		Subject: "Your receipt",
		Text:    body,
	}
}

// spyJournal counts the calls the Sender makes.
type spyJournal struct {
	journal.Journal
	begins, completes, releases atomic.Int64
}

func (j *spyJournal) Begin(ctx context.Context, key effects.Key, fp []byte, lease time.Duration) (journal.Record, error) {
	j.begins.Add(1)
	return j.Journal.Begin(ctx, key, fp, lease)
}

func (j *spyJournal) Complete(ctx context.Context, key effects.Key, ref string) error {
	j.completes.Add(1)
	return j.Journal.Complete(ctx, key, ref)
}

func (j *spyJournal) Release(ctx context.Context, key effects.Key, attempt int) error {
	j.releases.Add(1)
	return j.Journal.Release(ctx, key, attempt)
}
