// Package machine reads how much CPU time the whole machine has spent
// busy, for benchmarks that run a client, its servers and nothing else on
// one machine and want a cost per operation that does not depend on how
// long the disk makes each operation wait.
package machine

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ticksPerSecond is USER_HZ, the unit of /proc/stat: 100 on every Linux
// architecture Go supports.
const ticksPerSecond = 100

// BusyCPU returns the CPU time all the machine's CPUs have spent busy
// since boot: user, nice, system, irq and softirq time from /proc/stat
// (not idle, not waiting for I/O). It is Linux-only; elsewhere it returns
// an error. Its resolution is 10 ms, so compare intervals of at least a
// few seconds of CPU.
func BusyCPU() (time.Duration, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("machine CPU time: %w (it needs Linux's /proc/stat)", err)
	}
	return parseStat(string(data))
}

// parseStat sums the busy fields of the first ("cpu ") line of /proc/stat.
func parseStat(stat string) (time.Duration, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq ...
	if len(f) < 8 || f[0] != "cpu" {
		return 0, errors.New("machine CPU time: unexpected first line of /proc/stat: " + strconv.Quote(line))
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("machine CPU time: /proc/stat field %d: %w", i, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / ticksPerSecond, nil
}
