package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"effectively.dev/effects"
	"effectively.dev/kafka"
	"effectively.dev/kafka/kafkatest"
)

// deadLetters produces n dead letters of class poison for topic src to
// dlq, ids id-0..id-(n-1); forged names dead letters whose destination
// header names other instead.
func deadLetters(t *testing.T, c *kafkatest.Cluster, dlq, src, other string, n int, forged ...int) {
	t.Helper()
	var recs []*kgo.Record
	for i := range n {
		d := effects.Delivery{ID: fmt.Sprint("id-", i), Body: []byte(fmt.Sprint(i)),
			Headers: map[string]string{kafka.KeyHeader: fmt.Sprint("id-", i)}}
		r := kafka.DeadLetterRecord(dlq, d, effects.ErrPoison, time.Now())
		dest := src
		for _, f := range forged {
			if f == i {
				dest = other
			}
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: kafka.HeaderDLQTopic, Value: []byte(dest)})
		recs = append(recs, r)
	}
	if err := c.Client(t).ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func ids(t *testing.T, c *kafkatest.Cluster, topic string) map[string]int {
	t.Helper()
	recs, err := c.ReadAll(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range recs {
		id, _ := kafkatest.Header(r, kafka.KeyHeader)
		got[id]++
	}
	return got
}

// TestRedriveIsAimedByTheOperator: redrive prints its plan and moves
// nothing without -yes; with -yes it needs -allow-topic, skips and counts
// a forged destination, and with -group moves the next -count each run
// until all are moved, each once.
func TestRedriveIsAimedByTheOperator(t *testing.T) {
	c := kafkatest.Start(t)
	src, other, dlq := c.Topic(t, "src", 1), c.Topic(t, "other", 1), c.Topic(t, "dlq", 1)
	deadLetters(t, c, dlq, src, other, 7, 2)
	base := []string{"redrive", "-brokers", strings.Join(c.Brokers(), ","), "-dlq", dlq}
	cmd := func(args ...string) (string, error) {
		return runCmd(t, append(append([]string(nil), base...), args...)...)
	}

	out, err := cmd("-allow-topic", src)
	if err != nil || !strings.Contains(out, "would move 6 of 7") || !strings.Contains(out, "1 to topics not allowed") ||
		!strings.Contains(out, "-> "+src+"\tclass poison\t6 dead letters") || !strings.Contains(out, "-yes") {
		t.Fatalf("without -yes: %v\n%s", err, out)
	}
	if n := len(ids(t, c, src)); n != 0 {
		t.Fatalf("%d records moved without -yes", n)
	}
	if out, err := cmd("-yes"); !errors.Is(err, errUsage) || !strings.Contains(out, "-allow-topic") {
		t.Fatalf("-yes without -allow-topic: %v\n%s", err, out)
	}
	group := "redrive-" + dlq
	for _, want := range []string{"moved 4 of", "moved 2 of", "moved 0 of"} {
		out, err := cmd("-allow-topic", src, "-group", group, "-count", "4", "-yes", "-rate", "0")
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("run with -group: %v\n%s\nwant %q", err, out, want)
		}
		if !strings.Contains(out, "1 to topics not allowed") && want == "moved 4 of" {
			t.Errorf("the forged destination was not counted:\n%s", out)
		}
	}
	got := ids(t, c, src)
	if len(got) != 6 || got["id-2"] != 0 {
		t.Errorf("moved %v; want the 6 allowed ids, not id-2", got)
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("%s moved %d times", id, n)
		}
	}
	if n := len(ids(t, c, other)); n != 0 {
		t.Errorf("%d records moved to the forged destination", n)
	}
}

// cancelOnFirst calls cancel once topic holds a record, or when ctx ends.
func cancelOnFirst(ctx context.Context, c *kafkatest.Cluster, topic string, cancel func()) error {
	defer cancel()
	cl, err := kgo.NewClient(c.Opts()...)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for ctx.Err() == nil {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err == nil {
			moved := false
			ends.Each(func(o kadm.ListedOffset) { moved = moved || o.Offset > 0 })
			if moved {
				return nil
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// TestRedriveResumesAfterInterrupt: a redrive whose context is cancelled
// part-way (SIGINT or SIGTERM) stops, says what it moved, and a rerun with
// the same group moves the rest: none lost, none twice.
func TestRedriveResumesAfterInterrupt(t *testing.T) {
	c := kafkatest.Start(t)
	src, dlq := c.Topic(t, "src", 1), c.Topic(t, "dlq", 2)
	const n = 40
	deadLetters(t, c, dlq, src, "", n)
	args := []string{"redrive", "-brokers", strings.Join(c.Brokers(), ","), "-dlq", dlq, "-allow-topic", src,
		"-group", "g-" + dlq, "-yes", "-rate", "10"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// As SIGTERM does, once the first record is moved (10 a second: the
	// run needs 4 s for all 40, far longer than the watch's poll).
	watched := make(chan error, 1)
	go func() { watched <- cancelOnFirst(ctx, c, src, cancel) }()
	var out strings.Builder
	err := run(ctx, args, &out, &out)
	if werr := <-watched; werr != nil {
		t.Fatal(werr)
	}
	if err == nil || !strings.Contains(out.String(), "moved ") || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("interrupted run: %v\n%s", err, out.String())
	}
	first := len(ids(t, c, src))
	if first == 0 || first == n {
		t.Fatalf("the interrupted run moved %d of %d; want part of them (the test needs a stop part-way)", first, n)
	}
	if o, err := runCmd(t, append(args[:len(args)-2], "-rate", "0")...); err != nil {
		t.Fatalf("rerun: %v\n%s", err, o)
	}
	got := ids(t, c, src)
	if len(got) != n {
		t.Errorf("%d ids moved after the rerun, want %d", len(got), n)
	}
	for id, k := range got {
		if k != 1 {
			t.Errorf("%s moved %d times", id, k)
		}
	}
}

// TestDLQList lists dead letters with their time, id, class, destination
// and error, and the counts per class and destination.
func TestDLQList(t *testing.T) {
	c := kafkatest.Start(t)
	src, dlq := c.Topic(t, "src", 1), c.Topic(t, "dlq", 1)
	deadLetters(t, c, dlq, src, "", 3)
	out, err := runCmd(t, "dlq", "list", "-brokers", strings.Join(c.Brokers(), ","), "-dlq", dlq, "-id", "id-0,id-1")
	if err != nil || !strings.Contains(out, `delivery "id-1" class poison -> `+src) || strings.Contains(out, `"id-2"`) ||
		!strings.Contains(out, "2 dead letters listed of 3 read") || !strings.Contains(out, "class poison: 2") ||
		!strings.Contains(out, "destination "+src+": 2") || !strings.Contains(out, "poison delivery") {
		t.Fatalf("dlq list: %v\n%s", err, out)
	}
	if _, err := kafka.Redrive(context.Background(), c.Client(t), dlq, kafka.WithDryRun(nil)); err != nil {
		t.Fatal(err)
	}
}

// TestHelp: -h prints the usage and succeeds, for the command and each
// subcommand.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"help"}, {"redrive", "-h"}, {"dlq", "list", "-h"}, {"outbox", "drop", "-h"}, {"outbox", "-h"}} {
		out, err := runCmd(t, args...)
		if err != nil || !strings.Contains(out, "usage") && !strings.Contains(out, "Usage") {
			t.Errorf("%v: %v\n%s", args, err, out)
		}
		if strings.Contains(out, "unknown command") {
			t.Errorf("%v: %s", args, out)
		}
	}
}

// TestDatabaseURLFromEnvironment: without -db the outbox commands read
// DATABASE_URL; a failed connection's error does not show the password.
func TestDatabaseURLFromEnvironment(t *testing.T) {
	url, _ := outboxDB(t)
	t.Setenv("DATABASE_URL", url)
	if out, err := runCmd(t, "outbox", "list"); err != nil || !strings.Contains(out, "0 parked rows") {
		t.Fatalf("list with DATABASE_URL: %v\n%s", err, out)
	}
	t.Setenv("DATABASE_URL", "postgres://alice:s3cret-pw@127.0.0.1:1/nodb?connect_timeout=2")
	out, err := runCmd(t, "outbox", "list")
	if err == nil || strings.Contains(err.Error()+out, "s3cret-pw") {
		t.Errorf("unreachable database: %v\n%s; want an error without the password", err, out)
	}
	t.Setenv("DATABASE_URL", "")
	for _, v := range pgEnv {
		t.Setenv(v, "")
	}
	if out, err := runCmd(t, "outbox", "list"); !errors.Is(err, errUsage) || !strings.Contains(out, "DATABASE_URL") {
		t.Errorf("no database: %v\n%s", err, out)
	}
}

// TestKafkaSASL: redrive reaches a cluster that requires SCRAM-SHA-256,
// with the password from the environment only; a wrong password fails
// without showing it.
func TestKafkaSASL(t *testing.T) {
	c := kafkatest.Start(t, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "ops", "right-pw"))
	if c.Fake == nil {
		t.Skip("needs kfake's SASL")
	}
	auth := kgo.SASL(scram.Auth{User: "ops", Pass: "right-pw"}.AsSha256Mechanism())
	adm := c.Client(t, auth)
	dlq := "dlq-sasl"
	if _, err := kadm.NewClient(adm).CreateTopic(context.Background(), 1, -1, nil, dlq); err != nil {
		t.Fatal(err)
	}
	if err := adm.ProduceSync(context.Background(), kafka.DeadLetterRecord(dlq, effects.Delivery{ID: "a"}, effects.ErrPoison, time.Now())).FirstErr(); err != nil {
		t.Fatal(err)
	}
	args := []string{"dlq", "list", "-brokers", strings.Join(c.Brokers(), ","), "-dlq", dlq, "-sasl", "SCRAM-SHA-256", "-sasl-user", "ops"}
	t.Setenv(envSASLPassword, "right-pw")
	if out, err := runCmd(t, args...); err != nil || !strings.Contains(out, "1 dead letters listed") {
		t.Fatalf("with SASL: %v\n%s", err, out)
	}
	t.Setenv(envSASLPassword, "wrong-pw")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out strings.Builder
	err := run(ctx, args, &out, &out)
	if err == nil || strings.Contains(err.Error()+out.String(), "wrong-pw") {
		t.Errorf("wrong password: %v\n%s; want an error without the password", err, out.String())
	}
	t.Setenv(envSASLPassword, "")
	if out, err := runCmd(t, args...); !errors.Is(err, errUsage) || !strings.Contains(out, envSASLPassword) {
		t.Errorf("no password: %v\n%s", err, out)
	}
}
