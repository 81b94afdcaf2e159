package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"effectively.dev/postgres/pgtest"
)

// cgroup is a memory cgroup made for the cluster, under this process's
// own (so the machine's limits still hold), which caps what the cluster's
// processes and the page cache they fill may use: a table that fits in the
// machine's memory can be made not to fit in the cluster's.
type cgroup struct {
	dir string
}

// confine moves pg's processes into a new memory cgroup limited to limit
// bytes. Pages they touched before stay charged where they were, so call
// it before filling tables. It needs Linux, a memory cgroup controller
// (v1, or v2 with memory enabled for children) and the right to create
// cgroups under this process's own.
func confine(pg *pgtest.Cluster, limit int64) (*cgroup, error) {
	parent, v2, err := ownMemoryCgroup()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(parent, fmt.Sprintf("scalebench-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating a memory cgroup: %w", err)
	}
	cg := &cgroup{dir: dir}
	limitFile := "memory.limit_in_bytes"
	if v2 {
		limitFile = "memory.max"
	}
	if err := os.WriteFile(filepath.Join(dir, limitFile), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		cg.remove()
		return nil, fmt.Errorf("setting the memory limit: %w", err)
	}
	pids, err := clusterProcesses(pg)
	if err != nil {
		cg.remove()
		return nil, err
	}
	for _, pid := range pids {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			cg.remove()
			return nil, fmt.Errorf("moving process %d into the cgroup: %w", pid, err)
		}
	}
	return cg, nil
}

// remove deletes the cgroup; its processes must have exited (stop the
// cluster first).
func (c *cgroup) remove() error { return os.Remove(c.dir) }

// ownMemoryCgroup returns the directory of this process's memory cgroup
// and whether it is cgroup v2.
func ownMemoryCgroup() (dir string, v2 bool, err error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", false, fmt.Errorf("memory cgroups need Linux: %w", err)
	}
	var unified string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if slices.Contains(strings.Split(parts[1], ","), "memory") {
			return filepath.Join("/sys/fs/cgroup/memory", parts[2]), false, nil
		}
		if parts[0] == "0" && parts[1] == "" {
			unified = parts[2]
		}
	}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil && unified != "" {
			return filepath.Join(root, unified), true, nil
		}
	}
	return "", false, errors.New("no memory cgroup controller found in /proc/self/cgroup")
}

// clusterProcesses returns the postmaster's pid (from postmaster.pid) and
// its children's.
func clusterProcesses(pg *pgtest.Cluster) ([]int, error) {
	f, err := os.Open(filepath.Join(pg.Dir(), "data", "postmaster.pid"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return nil, errors.New("empty postmaster.pid")
	}
	postmaster, err := strconv.Atoi(strings.TrimSpace(sc.Text()))
	if err != nil {
		return nil, fmt.Errorf("postmaster.pid: %w", err)
	}
	pids := []int{postmaster}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
		f := strings.Fields(rest)
		if len(f) > 1 {
			if ppid, _ := strconv.Atoi(f[1]); ppid == postmaster {
				pids = append(pids, pid)
			}
		}
	}
	return pids, nil
}
