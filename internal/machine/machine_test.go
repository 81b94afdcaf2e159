package machine

import (
	"runtime"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	got, err := parseStat("cpu  100 20 30 4000 50 6 7 0 0 0\ncpu0 50 10 15 2000 25 3 3 0 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := (100 + 20 + 30 + 6 + 7) * 10 * time.Millisecond; got != want {
		t.Errorf("parseStat = %v, want %v (user+nice+system+irq+softirq; idle and iowait left out)", got, want)
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 3", "cpu a b c d e f g"} {
		if _, err := parseStat(bad); err == nil {
			t.Errorf("parseStat(%q) = nil error", bad)
		}
	}
}

func TestBusyCPUGrowsWithWork(t *testing.T) {
	if runtime.GOOS != "linux" {
		if _, err := BusyCPU(); err == nil {
			t.Fatal("BusyCPU succeeded without /proc/stat")
		}
		return
	}
	before, err := BusyCPU()
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
		x++
	}
	after, err := BusyCPU()
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 100*time.Millisecond {
		t.Errorf("300 ms of a busy loop (%d turns) moved BusyCPU by %v, want at least 100 ms", x, after-before)
	}
}
