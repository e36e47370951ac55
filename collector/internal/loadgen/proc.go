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
	if pid == 0 {
		return 0, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after it are
	// counted from the closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad cpu times", pid)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
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
