package main

import (
	"bytes"
	"context"
	"os"
	"runtime"
	"strings"
	"testing"

	"effectively.dev/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestRunSmall runs every variant once on a few events: each must drain
// its topic with every ledger row exactly once and every offset committed
// (run checks both and fails otherwise), and the table must have a row per
// variant with the hand-written handler as the baseline.
func TestRunSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a durable PostgreSQL cluster and drains five topics")
	}
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"-events", "300", "-partitions", "3", "-rounds", "1", "-batch", "20"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, &out, &errb)
	}
	for _, v := range variantNames() {
		if !strings.Contains(out.String(), "| "+v+" | ") {
			t.Errorf("no row for %s:\n%s", v, &out)
		}
	}
	if runtime.GOOS == "linux" {
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| variant") && !strings.HasSuffix(line, " µs |") {
				t.Errorf("row without the machine's CPU per event: %s", line)
			}
		}
	}
	if !strings.Contains(out.String(), "| hand-written | ") || !strings.Contains(out.String(), "| 1.00× | 1.00–1.00 |") {
		t.Errorf("the hand-written row is not the baseline:\n%s", &out)
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-variants", "defaults,nope"}, {"-events", "1"}, {"-rounds", "0"}, {"extra"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != 2 || errb.Len() == 0 {
			t.Errorf("run(%q) = %d (stderr %q), want 2 and a message", args, code, &errb)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tc.xs); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
	}
}
