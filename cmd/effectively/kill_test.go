package main

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"effectively.dev/kafka/kafkatest"
)

// buildCommand builds the effectively command into a temporary directory.
func buildCommand(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "effectively")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestRedriveKilledAndResumed runs redrive as a separate process and
// kills it with SIGKILL at random points while it moves 200 dead letters,
// then reruns it with the same -group until it finishes; then stops one
// with SIGTERM. Every dead letter reaches the source topic: none lost,
// none twice (a kill between a record's ack and its commit is caught on
// resume by the record's HeaderRedrivenFrom).
func TestRedriveKilledAndResumed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command and runs it as a process")
	}
	bin := buildCommand(t)
	c := kafkatest.Start(t)
	src, dlq := c.Topic(t, "src", 1), c.Topic(t, "dlq", 3)
	const n, kills = 200, 8
	deadLetters(t, c, dlq, src, "", n)
	args := []string{"redrive", "-brokers", strings.Join(c.Brokers(), ","), "-dlq", dlq, "-allow-topic", src,
		"-group", "g-" + dlq, "-yes", "-rate", "100"}
	rng := rand.New(rand.NewPCG(20261207, 1))
	moved := func() int { return len(ids(t, c, src)) }
	kill := func(k int) {
		cmd := exec.Command(bin, args...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		before := moved()
		time.Sleep(time.Duration(200+rng.IntN(400)) * time.Millisecond)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		t.Logf("kill %d: %d moved before, %d after", k+1, before, moved())
	}
	for k := range kills / 2 {
		kill(k)
	}
	// SIGTERM: stops, prints what it moved, exits 1.
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(out.String(), "interrupted after moving") {
		t.Errorf("SIGTERM: %v\n%s; want exit status 1 and what it moved", err, out.String())
	}
	for k := kills / 2; k < kills; k++ {
		kill(k)
	}
	// The rest, to the end.
	final := exec.Command(bin, append(args[:len(args)-2], "-rate", "0")...)
	final.Env = os.Environ()
	if o, err := final.CombinedOutput(); err != nil {
		t.Fatalf("final run: %v\n%s", err, o)
	}
	got := ids(t, c, src)
	dups := 0
	for _, k := range got {
		dups += k - 1
	}
	t.Logf("%d dead letters, %d kills and a SIGTERM: %d ids moved, %d duplicates", n, kills, len(got), dups)
	if len(got) != n {
		t.Errorf("%d of %d ids moved: %d lost", len(got), n, n-len(got))
	}
	if dups != 0 {
		t.Errorf("%d dead letters moved twice", dups)
	}
}
