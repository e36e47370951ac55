package loadgen

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat times; 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// ProcCPU returns the user+system CPU time of process pid (0: none).
func ProcCPU(pid int) (time.Duration, error) {
	st, err := procStat(pid)
	return st.cpu, err
}

// ProcTreeCPU returns the CPU time of process pid and of its children, live
// and ended: its own user+system time, the times of the children it has
// reaped, and those of its live children. For a PostgreSQL postmaster that
// is the whole server: every backend and background worker is its child.
func ProcTreeCPU(pid int) (time.Duration, error) {
	st, err := procStat(pid)
	if err != nil || pid == 0 {
		return 0, err
	}
	total := st.cpu + st.reaped
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if c, err := procStat(child); err == nil && c.ppid == pid {
			total += c.cpu // one that ended meanwhile is missed: a backend's exit
		}
	}
	return total, nil
}

// procsCPU is the summed ProcCPU of pids; ones that cannot be read count 0.
func procsCPU(pids []int) time.Duration {
	var d time.Duration
	for _, pid := range pids {
		c, _ := ProcCPU(pid)
		d += c
	}
	return d
}

// treeCPU is ProcTreeCPU, 0 when it cannot be read.
func treeCPU(pid int) time.Duration {
	d, _ := ProcTreeCPU(pid)
	return d
}

// stat is what /proc/PID/stat says of a process's CPU time.
type stat struct {
	ppid        int
	cpu, reaped time.Duration // its own user+system; its reaped children's
}

func procStat(pid int) (stat, error) {
	if pid == 0 {
		return stat{}, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return stat{}, err
	}
	// The command name (field 2) may hold spaces; fields after it are
	// counted from the closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return stat{}, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	// f[0] is field 3 (state): ppid is field 4, utime, stime, cutime and
	// cstime fields 14 to 17.
	var v [5]uint64
	for k, j := range []int{1, 11, 12, 13, 14} {
		if v[k], err = strconv.ParseUint(f[j], 10, 64); err != nil {
			return stat{}, fmt.Errorf("/proc/%d/stat: bad field %d", pid, j+3)
		}
	}
	tick := func(n uint64) time.Duration { return time.Duration(n) * time.Second / clockTicks }
	return stat{ppid: int(v[0]), cpu: tick(v[1] + v[2]), reaped: tick(v[3] + v[4])}, nil
}

// ProcRSS returns the resident memory of process pid in MiB (0: none).
func ProcRSS(pid int) (float64, error) {
	if pid == 0 {
		return 0, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	v, ok := statusField(b, "VmRSS")
	if !ok {
		return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
	}
	kb, err := strconv.ParseFloat(strings.TrimSuffix(v, " kB"), 64)
	if err != nil {
		return 0, err
	}
	return kb / 1024, nil
}

// statusField is the value of key in a /proc status file.
func statusField(b []byte, key string) (string, bool) {
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			return strings.TrimSpace(rest), true
		}
	}
	return "", false
}

// ProcSwitches returns the context switches (voluntary and involuntary) of
// every thread of process pid so far: how often it was put to sleep and
// woken, which is what a process that ticks pays for (docs/benchmarks.md).
// Threads that have exited are not counted (Go rarely ends one).
func ProcSwitches(pid int) (uint64, error) {
	var n uint64
	err := eachThread(pid, "status", func(b []byte) error {
		for _, key := range []string{"voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"} {
			if s, ok := statusField(b, key); ok {
				v, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					return err
				}
				n += v
			}
		}
		return nil
	})
	return n, err
}

// ProcRunTime returns the time every thread of process pid has spent on a
// CPU so far, from /proc/PID/task/*/schedstat (the scheduler's own account,
// in nanoseconds; needs CONFIG_SCHED_INFO). Unlike the tick-sampled
// utime+stime of ProcCPU (4–10 ms granularity, and uneven for a process
// that wakes in step with the timer tick) it is exact, which is what a ratio
// between two processes using 0.3 % of a core needs. Threads that have
// exited are not counted.
func ProcRunTime(pid int) (time.Duration, error) {
	var ns uint64
	err := eachThread(pid, "schedstat", func(b []byte) error {
		f := strings.Fields(string(b))
		if len(f) < 1 {
			return errors.New("empty")
		}
		v, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return err
		}
		ns += v
		return nil
	})
	return time.Duration(ns), err
}

// eachThread calls fn with /proc/PID/task/TID/name of every thread of
// process pid (none for pid 0), skipping threads that end meanwhile; fn's
// error is prefixed with the file's path.
func eachThread(pid int, name string, fn func(b []byte) error) error {
	if pid == 0 {
		return nil
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		path := fmt.Sprintf("/proc/%d/task/%s/%s", pid, t.Name(), name)
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the thread ended meanwhile
		}
		if err := fn(b); err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
	}
	return nil
}
