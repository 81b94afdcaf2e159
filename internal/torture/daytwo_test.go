package torture_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/wneessen/go-mail"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/effects/journal"
	"effectively.dev/email"
	"effectively.dev/email/smtptest"
	"effectively.dev/internal/torture"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
	"effectively.dev/s3"
	"effectively.dev/s3/s3test"
	"effectively.dev/stripe"
	"effectively.dev/stripe/stripetest"
)

// dayTwoEvent is a payment event of the day-two torture. Decline and Panic
// are the faults it carries: a card Stripe declines, an input builder that
// panics.
type dayTwoEvent struct {
	ID      string `json:"id"`
	Cents   int64  `json:"cents"`
	Decline bool   `json:"decline,omitempty"`
	Panic   bool   `json:"panic,omitempty"`
}

const (
	dayTwoScope   = "daytwo"
	dayTwoDomain  = "shop.example"
	dayTwoWorkers = 2
	// hangLease and crashLease are the mail step's journal lease (how
	// long a send the SMTP server holds, or one a crash cut, blocks its
	// key; the Sender abandons a send at nine tenths of it) for the fleet
	// that meets the SMTP hang and for the one that crashes. crashLease
	// is longer than the successors of a crashed fleet take to get its
	// partitions (the dead members' 2 s session timeout, then a
	// rebalance), so that they meet the dead attempt's lease and must
	// wait it out.
	hangLease  = 2 * time.Second
	crashLease = 6 * time.Second
)

// TestDayTwoTorture: a fleet of two in-process workers (Kafka consumer
// group → effects.Consumer → Plan(Postgres ledger row, Stripe charge with a
// journal, S3 receipt, mail with a sent-record)) meets a day-two mix: card
// declines, panics in a step, poison bodies, resent events (a second
// record, no id header), an S3 bucket that is missing at first and created
// later, an SMTP server that takes the mail and hangs past the mail step's
// lease, a crash of the whole fleet while mails are in flight, and an
// API-key rotation (the old key gets 401).
//
// At each configuration fault every worker must stop with a configuration
// error, acking nothing at or past the event that met it; the fault is
// fixed and the fleet restarted. During the SMTP hang the held attempt
// gives up at nine tenths of the lease, its retry waits the lease out
// (ErrInFlight is not a failed attempt) and takes the key over. The crash
// cuts every connection of the fleet at once (Postgres, Stripe, S3, SMTP,
// Kafka: nothing it does afterwards reaches a backend, as after SIGKILL)
// while the server holds a mail; the successor fleet waits out that
// mail's lease and sends it again.
//
// torture.CheckDayTwo judges the history: 0 lost, 0 duplicated ledger
// rows, PaymentIntents and receipts (mails within their declared window),
// dead letters only for permanent errors, none for a lease, and every
// configuration error stopped its worker with nothing acked past it.
// Negative controls prove that the hang outlived a lease and that the
// crash left a mail in flight for a successor to take over.
func TestDayTwoTorture(t *testing.T) {
	const (
		events   = 120
		declines = 12 // every tenth event
		panics   = 8  // every fifteenth event, none of them a decline
		poisons  = 6
		resends  = 15 // every eighth event is sent twice
	)
	if kafkatest.Real() {
		t.Skip("needs kfake: the test reads the group's commits as it goes")
	}
	start := time.Now()
	ctx := context.Background()
	r := &dayTwoRig{dsn: pgtest.DB(t), configAt: map[int]map[torture.InputRecord]error{}}
	pool, err := pgxpool.New(ctx, r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (payment_id text, cents bigint)`); err != nil {
		t.Fatal(err)
	}
	r.kc = kafkatest.Start(t)
	r.topic = r.kc.Topic(t, "daytwo", 3)
	r.group = "daytwo"
	adm := kadm.NewClient(r.kc.Client(t))
	prod := r.kc.Client(t, kgo.DefaultProduceTopic(r.topic))
	r.stripe = stripetest.Start(t)
	r.objects = s3test.StartInProcess(t)
	objects := r.objects.Client(t)
	r.smtp = smtptest.Start(t)
	const oldKey, newKey = "sk_test_daytwo_old", "sk_test_daytwo_new"

	// The stream: events, every tenth declined, every fifteenth panicking
	// in the charge step's input, poison bodies spread through it.
	h := &torture.DayTwoHistory{Events: map[string]torture.Fault{}}
	type body struct {
		id string // "" for poison
		b  []byte
	}
	var bodies []body
	poisonAt := map[int]bool{}
	for i := 0; i < poisons; i++ {
		poisonAt[(i*events)/poisons+7] = true
	}
	for i := 0; i < events; i++ {
		e := dayTwoEvent{ID: fmt.Sprintf("evt_%03d", i), Cents: int64(100 + i)}
		switch {
		case i%10 == 9:
			e.Decline, h.Events[e.ID] = true, torture.FaultDecline
		case i%15 == 7:
			e.Panic, h.Events[e.ID] = true, torture.FaultPanic
		default:
			h.Events[e.ID] = torture.FaultNone
		}
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, body{e.ID, b})
		if i%8 == 3 {
			bodies = append(bodies, body{e.ID, b}) // a resend: same event, new offset, no id header
		}
		if poisonAt[i] {
			bodies = append(bodies, body{"", []byte(fmt.Sprintf(`{"id": "poison_%d", "cents": "not a number"`, i))})
		}
	}
	if len(bodies) != events+resends+poisons {
		t.Fatalf("stream has %d records, want %d", len(bodies), events+resends+poisons)
	}
	nFault := map[torture.Fault]int{}
	for _, f := range h.Events {
		nFault[f]++
	}
	if nFault[torture.FaultDecline] != declines || nFault[torture.FaultPanic] != panics {
		t.Fatalf("stream has %d declines and %d panics, want %d and %d", nFault[torture.FaultDecline], nFault[torture.FaultPanic], declines, panics)
	}
	produce := func(bs []body) {
		t.Helper()
		for _, b := range bs {
			rec := &kgo.Record{Value: b.b}
			if err := prod.ProduceSync(ctx, rec).FirstErr(); err != nil {
				t.Fatal(err)
			}
			h.Input = append(h.Input, torture.InputRecord{Partition: rec.Partition, Offset: rec.Offset, EventID: b.id})
		}
	}

	// stopsOnConfig waits for every worker of f to stop (a configuration
	// error is what they must stop with; the checker judges), and records
	// the stop: what each worker returned, the deliveries that met a
	// configuration error, and the group's commits once all had stopped.
	stopsOnConfig := func(f *dayTwoFleet, fault string) {
		t.Helper()
		exits := make([]error, dayTwoWorkers)
		timeout := time.After(60 * time.Second)
		for n := 0; n < dayTwoWorkers; n++ {
			select {
			case e := <-f.exits:
				exits[e.worker] = e.err
			case <-timeout:
				t.Errorf("%s: %d of %d workers still running after 60 s; stopping them", fault, dayTwoWorkers-n, dayTwoWorkers)
				f.stop()
				for ; n < dayTwoWorkers; n++ {
					e := <-f.exits
					exits[e.worker] = e.err
				}
			}
		}
		f.stop()
		s := torture.ConfigStop{Fault: fault, Exits: exits, Committed: committedOffsets(t, adm, r.group, r.topic)}
		r.mu.Lock()
		for w, hits := range r.configAt {
			for rec, err := range hits {
				s.Met = append(s.Met, torture.ConfigHit{Worker: w, Record: rec, Err: err})
			}
		}
		r.configAt = map[int]map[torture.InputRecord]error{}
		r.mu.Unlock()
		if len(s.Met) == 0 {
			t.Fatalf("%s: no delivery met it: the fault tested nothing", fault)
		}
		h.Stops = append(h.Stops, s)
	}
	quarter := len(bodies) / 4
	var phases []string
	phaseStart := start
	phase := func(name string) {
		phases = append(phases, fmt.Sprintf("%s %v", name, time.Since(phaseStart).Round(time.Millisecond)))
		phaseStart = time.Now()
	}
	phase("setup")

	// The bucket is missing: every worker stops.
	if _, err := objects.DeleteBucket(ctx, &awss3.DeleteBucketInput{Bucket: aws.String(r.objects.Bucket)}); err != nil {
		t.Fatal(err)
	}
	produce(bodies[:quarter])
	stopsOnConfig(r.fleet(t, oldKey, crashLease), "missing bucket")
	phase("missing bucket")

	// The bucket is created, the fleet restarted, and the SMTP server
	// hangs: it takes each mail and sends nothing back. A held send gives
	// up at nine tenths of the lease; its retry waits the lease out and
	// takes the key over, and sends the mail again, which the server
	// takes and holds too: a second copy of one Message-ID, sent while
	// the server still held the first, is the proof that the hang
	// outlived a lease. Then the server recovers.
	if _, err := objects.CreateBucket(ctx, &awss3.CreateBucketInput{Bucket: aws.String(r.objects.Bucket)}); err != nil {
		t.Fatal(err)
	}
	r.smtp.Stall()
	hangStart := time.Now()
	fleet := r.fleet(t, oldKey, hangLease)
	produce(bodies[quarter : 2*quarter])
	var takenOver string
	waitDayTwo(t, "a mail sent again after its lease ran out while the SMTP server held it", 30*time.Second, func() bool {
		takenOver = twiceSent(r.smtp.Messages(), 0)
		return takenOver != ""
	})
	hangHeld := r.smtp.Stalled()
	r.smtp.Release()
	hang := time.Since(hangStart)
	hangWaits := len(r.waitsSince(hangStart))
	fleet.stop()
	phase("SMTP hang")

	// The crash mid-send: a fleet starts, the server hangs again, mails of
	// new events reach it and are held, and the fleet dies at once; the
	// server then recovers. The successors find each of those mails
	// leased by a dead attempt, wait the lease out, and send it again.
	fleet = r.fleet(t, oldKey, crashLease)
	r.smtp.Stall()
	sentBefore, heldBefore := r.smtp.Total(), r.smtp.Stalled()
	produce(bodies[2*quarter : 3*quarter])
	waitDayTwo(t, "a mail held mid-send before the crash", 30*time.Second, func() bool { return r.smtp.Stalled() > heldBefore })
	fleet.kill()
	crash := time.Now()
	heldAtCrash := map[string]bool{}
	for _, m := range r.smtp.Messages()[sentBefore:] {
		heldAtCrash[m.MessageID] = true
	}
	r.smtp.Release()
	fleet = r.fleet(t, oldKey, crashLease)
	dayTwoDrained(t, adm, r.topic, r.group, fleet.exits)
	fleet.stop()
	successorWaits := r.waitsSince(crash)
	phase("crash mid-send")

	// The key rotation: the old key now gets 401 and the rest of the
	// stream arrives. Every worker stops; the fixed key resumes.
	r.stripe.RollKey(oldKey, newKey)
	produce(bodies[3*quarter:])
	stopsOnConfig(r.fleet(t, oldKey, crashLease), "rolled key")
	fleet = r.fleet(t, newKey, crashLease)
	dayTwoDrained(t, adm, r.topic, r.group, fleet.exits)
	fleet.stop()
	phase("rolled key")

	// The history.
	h.Committed = committedOffsets(t, adm, r.group, r.topic)
	rows, err := pool.Query(ctx, `SELECT payment_id, count(*)::int FROM ledger GROUP BY payment_id`)
	if err != nil {
		t.Fatal(err)
	}
	h.Ledger = map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { h.Ledger[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	attempts := map[string]int{}
	rows, err = pool.Query(ctx, `SELECT key, attempt FROM effectively_journal WHERE scope = $1`, dayTwoScope)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { attempts[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	writes, err := r.objects.WritesUnder(ctx, "receipts/")
	if err != nil {
		t.Fatal(err)
	}
	h.Charges, h.Objects, h.Mails, h.MailAttempts = map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	mailOf := map[string]string{} // Message-ID -> event id
	for id := range h.Events {
		h.Charges[id] = r.stripe.Created(string(effects.MustKey(dayTwoScope, id, "charge")))
		h.Objects[id] = writes["receipts/"+effects.MustKey(dayTwoScope, id, "receipt").String()]
		mk := effects.MustKey(dayTwoScope, id, "mail")
		mailOf[email.MessageID(mk, dayTwoDomain)] = id
		h.Mails[id] = r.smtp.Count(email.MessageID(mk, dayTwoDomain))
		h.MailAttempts[id] = attempts[string(mk)]
	}
	r.mu.Lock()
	h.DeadLetters = append([]torture.DeadLetter(nil), r.deadLetters...)
	r.mu.Unlock()

	for _, err := range torture.CheckDayTwo(h) {
		t.Error(err)
	}

	// Negative controls: the faults happened as planned, so that the
	// checker's verdict is about them.
	if hangHeld < 2 || hang < hangLease || hangWaits == 0 {
		t.Errorf("the SMTP hang held %d mails for %v, and the consumer waited for a lease %d times; want at least 2 mails (a send and its retry after the lease), longer than the lease %v, and a wait",
			hangHeld, hang, hangWaits, hangLease)
	}
	if id := mailOf[takenOver]; h.MailAttempts[id] < 2 {
		t.Errorf("mail %s (%s) was sent twice during the hang, but its sent-record counts %d attempts: no lease takeover", takenOver, id, h.MailAttempts[id])
	}
	takeovers := 0
	for mid := range heldAtCrash {
		if id := mailOf[mid]; h.Mails[id] >= 2 && h.MailAttempts[id] >= 2 {
			takeovers++
		}
	}
	// A wait for the dead attempt's lease is likely but not certain: on a
	// loaded machine the successors may first reach the key after the
	// lease ran out (the rebalance took longer than crashLease), and then
	// take it over without waiting. The takeover is what must happen; the
	// hang's control above already requires a wait.
	if len(heldAtCrash) == 0 || takeovers == 0 {
		t.Errorf("the crash held %d mails mid-send; successors sent %d of them again after their lease (waiting for a lease %d times); want at least one each",
			len(heldAtCrash), takeovers, len(successorWaits))
	}
	var metLease time.Duration // from the crash to the successors' first wait for a dead attempt's lease
	if len(successorWaits) > 0 {
		metLease = successorWaits[0].Sub(crash)
	}
	met := 0
	for _, s := range h.Stops {
		met += len(s.Met)
	}
	deadKinds := map[string]int{}
	for _, d := range h.DeadLetters {
		deadKinds[dayTwoFaultOf(h, d.Record)]++
	}
	mailDups := 0
	for _, n := range h.Mails {
		mailDups += max(n-1, 0)
	}
	t.Logf("day two in %v: %d records (%d events, %d resent, %d poison); %d dead letters %v; %d configuration stops (%d deliveries met them); "+
		"SMTP hang of %v held %d mails (%d waits for a lease); the crash held %d mails mid-send, %d sent again by the successors after %d waits for a lease, the first %v after the crash (lease %v); "+
		"%d mail copies beyond the first (each inside its sent-record's attempts); consumer events %v; phases: %s",
		time.Since(start).Round(time.Millisecond), len(h.Input), events, resends, poisons, len(h.DeadLetters), deadKinds, len(h.Stops), met,
		hang.Round(time.Millisecond), hangHeld, hangWaits, len(heldAtCrash), takeovers, len(successorWaits), metLease.Round(time.Millisecond), crashLease, mailDups, r.eventCounts(), strings.Join(phases, ", "))
}

// dayTwoRig is what the fleets of the day-two torture share: the backends,
// and what the workers' hooks saw.
type dayTwoRig struct {
	dsn         string
	kc          *kafkatest.Cluster
	topic       string
	group       string
	stripe      *stripetest.Server
	objects     *s3test.Server
	smtp        *smtptest.Server
	waits       []time.Time // when the consumers waited for another attempt's lease
	mu          sync.Mutex
	deadLetters []torture.DeadLetter
	// configAt holds, per worker of the current fleet, the records whose
	// delivery ended in a configuration error.
	configAt map[int]map[torture.InputRecord]error
	events   map[effects.EventKind]int
}

// waitsSince returns when the consumers waited for another attempt's
// lease, from t on.
func (r *dayTwoRig) waitsSince(t time.Time) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Time
	for _, w := range r.waits {
		if !w.Before(t) {
			out = append(out, w)
		}
	}
	return out
}

func (r *dayTwoRig) eventCounts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, n := range r.events {
		out[k.String()] = n
	}
	return out
}

// dayTwoFleet is a running fleet of workers.
type dayTwoFleet struct {
	exits  <-chan workerExit
	cancel context.CancelFunc
	wg     *sync.WaitGroup
	cut    *killSwitch
}

type workerExit struct {
	worker int
	err    error
}

// stop cancels the workers and waits for them: a clean shutdown.
func (f *dayTwoFleet) stop() {
	f.cancel()
	f.wg.Wait()
}

// kill cuts every connection of the fleet at once and cancels it, without
// waiting: from here nothing it does reaches a backend, and what its
// goroutines still run in process (a hook, a retry) records nothing, as
// after SIGKILL. The test's cleanup waits for the goroutines.
func (f *dayTwoFleet) kill() {
	f.cut.kill()
	f.cancel()
}

// fleet starts dayTwoWorkers workers with the Stripe secret key and the
// mail step's lease, each with its own connections, all behind one kill
// switch.
func (r *dayTwoRig) fleet(t *testing.T, key string, lease time.Duration) *dayTwoFleet {
	t.Helper()
	cut := &killSwitch{conns: map[net.Conn]struct{}{}}
	cfg, err := pgxpool.ParseConfig(r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = cut.dial
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stripeHTTP := &http.Transport{DialContext: cut.dial, MaxIdleConnsPerHost: 16}
	s3HTTP := &http.Transport{DialContext: cut.dial, MaxIdleConnsPerHost: 16}
	api := stripeClient(r.stripe, key, stripeHTTP)
	objects := r.objects.Client(t, func(o *awss3.Options) { o.HTTPClient = &http.Client{Transport: s3HTTP} })
	ctx, cancel := context.WithCancel(context.Background())
	exits := make(chan workerExit, dayTwoWorkers)
	wg := &sync.WaitGroup{}
	for w := 0; w < dayTwoWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			exits <- workerExit{w, r.worker(ctx, w, pool, api, objects, lease, cut)}
		}()
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		pool.Close()
		stripeHTTP.CloseIdleConnections()
		s3HTTP.CloseIdleConnections()
	})
	return &dayTwoFleet{exits: exits, cancel: cancel, wg: wg, cut: cut}
}

// worker is one worker of the fleet: the quick start's shape, with a
// charge step whose input panics for an event that asks for it.
func (r *dayTwoRig) worker(ctx context.Context, w int, pool *pgxpool.Pool, api *client.API, objects *awss3.Client, lease time.Duration, cut *killSwitch) error {
	ledger, err1 := postgres.New(pool, dayTwoScope, func(ctx context.Context, tx pgx.Tx, e dayTwoEvent) (string, error) {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (payment_id, cents) VALUES ($1, $2)`, e.ID, e.Cents)
		return e.ID, err
	})
	jrnl, err2 := postgres.NewJournal(pool, dayTwoScope)
	charges, err3 := stripe.NewPaymentIntents(api, stripe.WithJournal(jrnl))
	receipts, err4 := s3.New(objects, r.objects.Bucket, s3.WithObjectKey(func(k effects.Key) string { return "receipts/" + k.String() }))
	mails, err5 := email.New(r.smtp.Addr(), email.WithJournal(jrnl, journal.WithLease(lease)), email.WithDialContext(cut.dial),
		email.WithMessageIDDomain(dayTwoDomain), email.WithMailOptions(mail.WithTLSPolicy(mail.NoTLS)))
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return err
	}
	defer mails.Close()
	plan, err := effects.NewPlan(dayTwoScope, effects.EventStep("ledger", ledger),
		effects.NewStep("charge", charges, func(e dayTwoEvent, _ effects.Results) (stripe.PaymentIntent, error) {
			if e.Panic {
				panic("daytwo: a bug in the charge step's input for " + e.ID)
			}
			in := stripe.PaymentIntent{Amount: e.Cents, Currency: "usd"}
			if e.Decline {
				in.PaymentMethod, in.Confirm = "pm_card_chargeDeclined", true
			}
			return in, nil
		}),
		effects.NewStep("receipt", receipts, func(e dayTwoEvent, done effects.Results) (s3.Object, error) {
			return s3.Object{Body: []byte(e.ID + " paid by " + done["charge"].Ref)}, nil
		}),
		effects.NewStep("mail", mails, func(e dayTwoEvent, done effects.Results) (email.Message, error) {
			return email.Message{From: "billing@" + dayTwoDomain, To: []string{"customer@example.com"},
				Subject: "Your receipt", Text: e.ID + " paid by " + done["charge"].Ref}, nil
		}))
	if err != nil {
		return err
	}
	// A 2 s session (kafkatest's is 3 s): a crashed fleet's members leave
	// the group sooner, well inside crashLease.
	src, err := kafka.NewSource(r.kc.Opts(append(kafkatest.GroupOpts(r.group, r.topic), kgo.SessionTimeout(2*time.Second), kgo.Dialer(cut.dial))...),
		kafka.WithCloseTimeout(2*time.Second))
	if err != nil {
		return err
	}
	defer src.Close()
	c, err := consume.New(src, func(ctx context.Context, d effects.Delivery) error {
		var e dayTwoEvent
		if err := json.Unmarshal(d.Body, &e); err != nil {
			return fmt.Errorf("%w: %v", effects.ErrPoison, err)
		}
		if err := effects.CheckID(e.ID); err != nil {
			return err
		}
		_, err := plan.Run(ctx, e.ID, e)
		if effects.ClassOf(err) == effects.InvalidConfig && !cut.killed() {
			r.mu.Lock()
			if r.configAt[w] == nil {
				r.configAt[w] = map[torture.InputRecord]error{}
			}
			r.configAt[w][dayTwoRecord(d)] = err
			r.mu.Unlock()
		}
		return err
	},
		consume.WithDeadLetter(func(_ context.Context, d effects.Delivery, err error) error {
			if cut.killed() {
				return errKilled // a dead process calls no hook
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			r.deadLetters = append(r.deadLetters, torture.DeadLetter{Record: dayTwoRecord(d), Err: err})
			return nil
		}),
		consume.WithObserver(effects.ObserverFunc(func(_ context.Context, ev effects.Event) {
			if cut.killed() {
				return
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if ev.Kind == effects.EventInFlight {
				r.waits = append(r.waits, time.Now())
			}
			if r.events == nil {
				r.events = map[effects.EventKind]int{}
			}
			r.events[ev.Kind]++
		})),
		consume.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// dayTwoRecord is the input record of a header-less delivery: its id is
// topic/partition/offset, and its event id is in the body ("" for
// poison).
func dayTwoRecord(d effects.Delivery) torture.InputRecord {
	parts := strings.Split(d.ID, "/")
	p, _ := strconv.ParseInt(parts[len(parts)-2], 10, 32)
	o, _ := strconv.ParseInt(parts[len(parts)-1], 10, 64)
	var e dayTwoEvent
	if json.Unmarshal(d.Body, &e) != nil {
		e.ID = ""
	}
	return torture.InputRecord{Partition: int32(p), Offset: o, EventID: e.ID}
}

func dayTwoFaultOf(h *torture.DayTwoHistory, r torture.InputRecord) string {
	if r.EventID == "" {
		return "poison"
	}
	return h.Events[r.EventID].String()
}

// twiceSent returns a Message-ID of which ms holds at least two copies
// among those from index from on, or "".
func twiceSent(ms []smtptest.Message, from int) string {
	seen := map[string]bool{}
	for _, m := range ms[from:] {
		if seen[m.MessageID] {
			return m.MessageID
		}
		seen[m.MessageID] = true
	}
	return ""
}

var errKilled = errors.New("daytwo: the worker fleet was killed")

// killSwitch cuts a worker fleet off from every backend at once, as the
// death of its process would: kill closes every connection the fleet
// opened through dial, and dial refuses new ones after it.
type killSwitch struct {
	mu    sync.Mutex
	dead  bool
	conns map[net.Conn]struct{}
}

func (k *killSwitch) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if k.killed() {
		return nil, errKilled
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dead {
		c.Close()
		return nil, errKilled
	}
	k.conns[c] = struct{}{}
	return c, nil
}

func (k *killSwitch) killed() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.dead
}

func (k *killSwitch) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dead = true
	for c := range k.conns {
		c.Close()
	}
	k.conns = nil
}

// stripeClient is stripetest's client with another secret key, over
// transport.
func stripeClient(srv *stripetest.Server, key string, transport http.RoundTripper) *client.API {
	b := stripego.GetBackendWithConfig(stripego.APIBackend, &stripego.BackendConfig{
		URL:               stripego.String(srv.URL),
		HTTPClient:        &http.Client{Transport: transport},
		MaxNetworkRetries: stripego.Int64(0),
		EnableTelemetry:   stripego.Bool(false),
		LeveledLogger:     &stripego.LeveledLogger{Level: stripego.LevelNull},
	})
	return client.New(key, &stripego.Backends{API: b, Connect: b, Uploads: b})
}

// committedOffsets is the group's committed offset per partition of topic.
func committedOffsets(t *testing.T, adm *kadm.Client, group, topic string) map[int32]int64 {
	t.Helper()
	out := map[int32]int64{}
	dayTwoCommits(t, adm, group).Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.Err == nil && o.At >= 0 {
			out[o.Partition] = o.At
		}
	})
	return out
}

func dayTwoCommits(t *testing.T, adm *kadm.Client, group string) kadm.OffsetResponses {
	t.Helper()
	commits, err := adm.FetchOffsets(context.Background(), group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return kadm.OffsetResponses{}
	}
	if err != nil {
		t.Fatal(err)
	}
	return commits
}

// waitDayTwo polls cond every 20 ms for up to limit.
func waitDayTwo(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dayTwoDrained waits until the group committed every record of topic.
func dayTwoDrained(t *testing.T, adm *kadm.Client, topic, group string, exits <-chan workerExit) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ends, err := adm.ListEndOffsets(context.Background(), topic)
		if err != nil {
			t.Fatal(err)
		}
		commits := dayTwoCommits(t, adm, group)
		all := true
		ends.Each(func(o kadm.ListedOffset) {
			c, ok := commits.Lookup(o.Topic, o.Partition)
			if o.Offset > 0 && (!ok || c.At < o.Offset) {
				all = false
			}
		})
		if all {
			return
		}
		select {
		case e := <-exits:
			t.Fatalf("worker %d stopped before the topic was drained: %v", e.worker, e.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not drained in 90 s: ends %v, commits %v", topic, ends, commits)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
