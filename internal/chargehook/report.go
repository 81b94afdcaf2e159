package chargehook

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/effects/consume"
	"effectively.dev/email/smtptest"
	"effectively.dev/kafka/kafkatest"
	"effectively.dev/s3/s3test"
	"effectively.dev/stripe/stripetest"
)

// Side is what one handler did under the schedule. The effect counts are
// read from the backends themselves (rows in a table without a unique
// index, PaymentIntents Stripe created, PUTs S3 answered with 200, records
// in the topic, messages the SMTP server accepted), never from the
// handler's own bookkeeping.
type Side struct {
	Handler string
	// Elapsed runs from the processor's first POST to the last record's
	// ack.
	Elapsed time.Duration
	// MachineCPU is the CPU time the whole machine spent busy over
	// Elapsed (every process: the demo, its in-process servers,
	// PostgreSQL), 0 where it cannot be read (not Linux); WAL is the
	// PostgreSQL WAL written over it, in bytes.
	MachineCPU time.Duration
	WAL        int64
	// Timeline is the PostgreSQL timeline the run started on: 1 on a
	// primary made for the run; a failover moves the promoted standby to
	// the next one.
	Timeline int

	// The webhook tier.
	Sent           int // POSTs the processor sent
	SenderRetries  int // of which were retries
	DroppedReplies int // 200s the processor never saw
	SiblingRetries int // tries the balancer sent to the sibling pod
	GaveUp         int // events the processor gave up on
	Enqueued       int // records the pods put in the webhook topic

	// The worker.
	Deliveries   map[string]int // per hop: handler calls
	Absorbed     map[string]int // per hop: calls that found every effect done
	Failures     map[string]int // failed attempts by cause (crashes excluded)
	DeadLettered int
	Consumer     consume.Stats
	// Failover is how long the pipeline had no writable primary (kill to
	// promotion), FailoverAt how many events were done at the kill.
	Failover   time.Duration
	FailoverAt int
	// UnrecordedMail counts receipts the SMTP server accepted whose
	// sent-record did not commit (inside the email contract's window).
	UnrecordedMail int

	// Effects, per event, from the backends.
	LedgerRows, Charges, ReceiptWrites, EventRecords, Emails int
	// Events with more than one ledger row, PaymentIntent, receipt write,
	// "charged" record, email.
	DoubleLedger, DoubleCharged, ReceiptDup, EventDup, EmailDup int
	// Lost counts events with no ledger row or no PaymentIntent; LostIDs
	// names the first few.
	Lost    int
	LostIDs []string
}

// Throughput is events finished per second.
func (s *Side) Throughput(events int) float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(events) / s.Elapsed.Seconds()
}

// perEvent is d per event, or "n/a" when d could not be measured.
func perEvent(d time.Duration, events int) string {
	if d <= 0 {
		return "n/a"
	}
	return (d / time.Duration(events)).Round(10 * time.Microsecond).String()
}

// Report is the outcome of a [Run].
type Report struct {
	// The configuration that ran.
	Events, Workers        int
	Seed                   uint64
	Sender, Sibling, Crash float64
	Failover               bool
	// Standby says both runs had a synchronous standby without the
	// failover (Config.Standby).
	Standby bool
	// Database says where PostgreSQL ran.
	Database string
	// Scheduled counts the events the schedule hits with each fault.
	Scheduled struct{ Sender, Sibling, Crash int }
	// Naive and EffectivelyOnce are what each handler did.
	// EffectivelyOnce is nil after a Config.NaiveTwice run, whose second
	// naive side is NaiveAgain.
	Naive, EffectivelyOnce *Side
	NaiveAgain             *Side
	// Contract is the effectively-once plan's composite contract.
	Contract effects.PlanContract
}

// Violations lists what the effectively-once side did that its
// effectively-once steps promise never to do: an event charged twice (two
// PaymentIntents, or two ledger rows), a receipt written twice, an event
// lost (no ledger row or no charge). Duplicates of the at-least-once
// steps (the Kafka event, the email) are not violations: the report shows
// them next to their declared window.
func (r *Report) Violations() []string {
	s := r.EffectivelyOnce
	if s == nil { // a Config.NaiveTwice run: no contract to break
		return nil
	}
	var v []string
	if s.DoubleCharged > 0 {
		v = append(v, fmt.Sprintf("%d events charged twice (more than one PaymentIntent)", s.DoubleCharged))
	}
	if s.DoubleLedger > 0 {
		v = append(v, fmt.Sprintf("%d events with more than one ledger row", s.DoubleLedger))
	}
	if s.ReceiptDup > 0 {
		v = append(v, fmt.Sprintf("%d receipts written more than once", s.ReceiptDup))
	}
	if s.Lost > 0 {
		v = append(v, fmt.Sprintf("%d events lost (no ledger row or no charge), e.g. %s", s.Lost, strings.Join(s.LostIDs, ", ")))
	}
	return v
}

// WriteTable prints the report.
func (r *Report) WriteTable(out io.Writer) error {
	n, e := r.Naive, r.EffectivelyOnce
	if r.NaiveAgain != nil {
		e = r.NaiveAgain
	}
	b := &strings.Builder{}
	fmt.Fprintf(b, "chargehook: %d events, seed %d, %d concurrent handlers, %s\n", r.Events, r.Seed, r.Workers, r.Database)
	fmt.Fprintf(b, "faults scheduled: sender retry %d (%.0f%%), sibling retry %d (%.0f%%), crash before ack %d (%.0f%%), failover: %s\n\n",
		r.Scheduled.Sender, 100*r.Sender, r.Scheduled.Sibling, 100*r.Sibling, r.Scheduled.Crash, 100*r.Crash, failoverText(r, n, e))
	if r.NaiveAgain != nil {
		if err := writeNoise(b, r.Events, n, e); err != nil {
			return err
		}
		_, err := io.WriteString(out, b.String())
		return err
	}

	w, row := sideBySide(b, NaiveName, EOName)
	row("events", r.Events, r.Events)
	row("webhook POSTs (processor)", n.Sent, e.Sent)
	row("  replies lost, resent", n.SenderRetries, e.SenderRetries)
	row("  balancer retries to sibling", n.SiblingRetries, e.SiblingRetries)
	row("records enqueued", n.Enqueued, e.Enqueued)
	row("deliveries to the worker", sum(n.Deliveries), sum(e.Deliveries))
	for _, h := range hops {
		row("  "+hopLabel[h], n.Deliveries[h], e.Deliveries[h])
	}
	row("duplicates absorbed", sum(n.Absorbed), sum(e.Absorbed), "(deliveries that found every effect done)")
	for _, h := range hops {
		if n.Absorbed[h]+e.Absorbed[h] > 0 {
			row("  "+hopLabel[h], n.Absorbed[h], e.Absorbed[h])
		}
	}
	row("ledger rows", n.LedgerRows, e.LedgerRows)
	row("Stripe PaymentIntents", n.Charges, e.Charges)
	row("double charges: >1 PaymentIntent", n.DoubleCharged, e.DoubleCharged, "events")
	row("double charges: >1 ledger row", n.DoubleLedger, e.DoubleLedger, "events")
	row("S3 receipts written twice", n.ReceiptDup, e.ReceiptDup, "events")
	row("Kafka events duplicated", n.EventDup, e.EventDup, "events;", "at-least-once by contract (outbox relay): duplicates only "+outboxWindow)
	row("emails duplicated", n.EmailDup, e.EmailDup, "events;", window(r.Contract, stepMail))
	row("lost events", n.Lost, e.Lost, "(no ledger row or no charge)")
	row("dead-lettered deliveries", n.DeadLettered, e.DeadLettered)
	row("throughput (events/s)", fmt.Sprintf("%.0f", n.Throughput(r.Events)), fmt.Sprintf("%.0f", e.Throughput(r.Events)))
	row("machine CPU per event", perEvent(n.MachineCPU, r.Events), perEvent(e.MachineCPU, r.Events), "(every process, PostgreSQL included)")
	row("PostgreSQL WAL per event (bytes)", n.WAL/int64(r.Events), e.WAL/int64(r.Events))
	if err := w.Flush(); err != nil {
		return err
	}
	if k := e.UnrecordedMail; k > 0 {
		fmt.Fprintf(b, "\n%d receipt email%s accepted by the SMTP server while the sent-record could not commit (the failover):\n"+
			"a redelivery of such an event after the lease resends it, inside the email step's declared window.\n",
			k, map[bool]string{true: " was", false: "s were"}[k == 1])
	}

	fmt.Fprintf(b, "\nContract of the effectively-once plan (effects.Plan.Contract), step by step:\n")
	w = tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for _, sc := range r.Contract.Steps {
		c := sc.Contract
		fmt.Fprintf(w, "  %s\t%s\t%s\n", sc.Step, c.Guarantee, c.Enforcer)
		if c.Horizon > 0 {
			fmt.Fprintf(w, "  \t\tkeys kept %s\n", c.Horizon)
		}
		if c.Guarantee == effects.AtLeastOnce {
			fmt.Fprintf(w, "  \t\tduplicates %s: %s\n", c.DuplicateWindow.Trigger, c.DuplicateWindow.Between)
		}
	}
	fmt.Fprintf(w, "  (%s)\t%s\t%s\n", stepEvent, effects.AtLeastOnce, "a kafka/outbox row in the ledger step's transaction, published by outbox.Relay")
	fmt.Fprintf(w, "  \t\tduplicates %s\n", outboxWindow)
	fmt.Fprintf(w, "  plan\t%s\tweakest step: %s\n", r.Contract.Contract.Guarantee, r.Contract.Weakest)
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(b, "  why: %s\n", r.Contract.Why)
	fmt.Fprintf(b, "The naive handler declares nothing: check, effects and mark in separate transactions; a fresh Stripe key per attempt;\n"+
		"a plain PUT; a produce and a send without a record.\n")

	if v := r.Violations(); len(v) > 0 {
		fmt.Fprintf(b, "\nFAIL: the effectively-once side broke its contract:\n  %s\n", strings.Join(v, "\n  "))
	} else {
		fmt.Fprintf(b, "\nOK: the effectively-once side charged every event exactly once, wrote every receipt once and lost nothing.\n")
	}
	_, err := io.WriteString(out, b.String())
	return err
}

var hopLabel = map[string]string{
	hopFirst:      "first delivery",
	hopSender:     "sender retry",
	hopSib:        "sibling retry",
	hopRedelivery: "redelivery (crash before ack)",
	hopFailover:   "after failover",
	hopRetry:      "retry after an error",
}

func failoverText(r *Report, n, e *Side) string {
	switch {
	case !r.Failover && r.Standby:
		return "off (each handler ran against a primary with a synchronous standby)"
	case !r.Failover:
		return "off"
	}
	return fmt.Sprintf("primary killed after %d events (%s: %v to promotion, %s: %v)",
		n.FailoverAt, n.Handler, n.Failover.Round(time.Millisecond), e.Handler, e.Failover.Round(time.Millisecond))
}

// sideBySide starts a table of two sides' figures on b, under a header
// that names them, and returns it with the function that adds a row: a
// name, each side's figure and an optional note.
func sideBySide(b *strings.Builder, left, right string) (*tabwriter.Writer, func(name string, l, r any, note ...string)) {
	w := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "\t%s\t%s\t\n", left, right)
	return w, func(name string, l, r any, note ...string) {
		fmt.Fprintf(w, "%s\t%v\t%v\t%s\n", name, l, r, strings.Join(note, " "))
	}
}

// writeNoise prints a Config.NaiveTwice run: what each run of the naive
// handler did, and how far apart their throughputs landed.
func writeNoise(b *strings.Builder, events int, n, a *Side) error {
	w, row := sideBySide(b, n.Handler, a.Handler)
	row("events", events, events)
	row("deliveries to the worker", sum(n.Deliveries), sum(a.Deliveries))
	row("ledger rows", n.LedgerRows, a.LedgerRows)
	row("double charges: >1 PaymentIntent", n.DoubleCharged, a.DoubleCharged, "events")
	row("throughput (events/s)", fmt.Sprintf("%.0f", n.Throughput(events)), fmt.Sprintf("%.0f", a.Throughput(events)))
	row("machine CPU per event", perEvent(n.MachineCPU, events), perEvent(a.MachineCPU, events), "(every process, PostgreSQL included)")
	if err := w.Flush(); err != nil {
		return err
	}
	ratio := 0.0
	if t := n.Throughput(events); t > 0 {
		ratio = a.Throughput(events) / t
	}
	fmt.Fprintf(b, "\nThe same handler, schedule and kind of backends twice, in the order a normal run uses: the second run's\n"+
		"throughput is %.2f times the first's. Only the machine differed: a normal run's two sides can differ this much\n"+
		"for reasons other than their handlers.\n", ratio)
	return nil
}

// window says, for an at-least-once step, that its duplicates are
// declared and when they can happen; the contract section spells out the
// window.
// outboxWindow is when the outbox relay can publish a charged event twice.
const outboxWindow = "after an unknown outcome: after the broker's ack, before the relay marks the rows sent"

func window(pc effects.PlanContract, step string) string {
	for _, sc := range pc.Steps {
		if sc.Step == step && sc.Contract.Guarantee == effects.AtLeastOnce {
			return fmt.Sprintf("at-least-once by contract (%s): duplicates only %s", step, sc.Contract.DuplicateWindow.Trigger)
		}
	}
	return ""
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// counter reads one side's effects from the backends.
type counter struct {
	pool      *pgxpool.Pool
	ledger    string
	stripe    *stripetest.Server
	s3        *s3test.Server
	objectKey func(Event) string
	kafka     *kafkatest.Cluster
	topic     string
	smtp      *smtptest.Server
}

func (c *counter) count(ctx context.Context, events []Event, s *Side) error {
	ledger := map[string]int{}
	rows, err := c.pool.Query(ctx, fmt.Sprintf(`SELECT event_id, count(*) FROM %s GROUP BY event_id`, pgx.Identifier{c.ledger}.Sanitize()))
	if err != nil {
		return err
	}
	for rows.Next() {
		var id string
		var k int
		if err := rows.Scan(&id, &k); err != nil {
			return err
		}
		ledger[id] = k
	}
	if err := rows.Err(); err != nil {
		return err
	}
	recs, err := c.kafka.ReadAll(ctx, c.topic)
	if err != nil {
		return err
	}
	produced := map[string]int{}
	for _, r := range recs {
		if id, ok := kafkatest.Header(r, recEvent); ok {
			produced[id]++
		}
	}
	mails := map[string]int{}
	for _, m := range c.smtp.Messages() {
		mails[eventOf(m.Header.Get("Subject"))]++
	}
	writes, err := c.s3.WritesUnder(ctx, "")
	if err != nil {
		return err
	}

	for _, ev := range events {
		l, ch := ledger[ev.ID], c.stripe.CreatedWithMetadata("event_id", ev.ID)
		rw, pe, em := writes[c.objectKey(ev)], produced[ev.ID], mails[ev.ID]
		s.LedgerRows += l
		s.Charges += ch
		s.ReceiptWrites += rw
		s.EventRecords += pe
		s.Emails += em
		s.DoubleLedger += b2i(l > 1)
		s.DoubleCharged += b2i(ch > 1)
		s.ReceiptDup += b2i(rw > 1)
		s.EventDup += b2i(pe > 1)
		s.EmailDup += b2i(em > 1)
		if l == 0 || ch == 0 {
			s.Lost++
			if len(s.LostIDs) < 5 {
				s.LostIDs = append(s.LostIDs, ev.ID)
			}
		}
	}
	slices.Sort(s.LostIDs)
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
