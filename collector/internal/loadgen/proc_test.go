package loadgen

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// lineChild starts `sh -c script`, which answers every line it reads with
// one line: poke sends a line and waits for the answer; stop ends it.
func lineChild(t *testing.T, script string) (pid int, poke, stop func()) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	answers := bufio.NewReader(stdout)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	poke = func() {
		if _, err := stdin.Write([]byte("x\n")); err != nil {
			t.Fatal(err)
		}
		if _, err := answers.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	stop = func() { stdin.Close(); _ = cmd.Wait() }
	return cmd.Process.Pid, poke, stop
}

// waitAsleep waits until process pid is in state S (sleeping): a process
// seen asleep has been switched out since it last ran.
func waitAsleep(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 0 && f[0] == "S" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d not asleep after 10 s: %s", pid, s)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// A child that blocks reading a pipe and is woken by each line (it echoes
// each back before waiting for the next) is switched out and in once per
// line: the count, over all the process's threads, grows by at least that.
// Each line is sent only once the child is seen asleep again: a line that
// arrives while the child is still running (on a busy machine, before it
// reached its first read, or between its echo and its next read) is read
// without a switch, which made the count one short in a CI run.
func TestProcSwitchesCountsAProcessWakeups(t *testing.T) {
	pid, echo, stop := lineChild(t, `while read line; do echo "$line"; done`)
	defer stop()
	echo()
	waitAsleep(t, pid)
	before, err := ProcSwitches(pid)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		echo()
		waitAsleep(t, pid)
	}
	// Counted before the child exits: then /proc has no threads of it.
	after, err := ProcSwitches(pid)
	if err != nil {
		t.Fatal(err)
	}
	if after < before+50 {
		t.Errorf("switches %d -> %d after 50 wakeups", before, after)
	}
	if _, err := ProcSwitches(1 << 30); err == nil {
		t.Error("no error for a process that does not exist")
	}
	if n, err := ProcSwitches(os.Getpid()); err != nil || n == 0 {
		t.Errorf("own process: %d, %v", n, err)
	}
}

// A child that burns CPU for a while has at least that much run time in
// schedstat, and the reading is finer than a scheduler tick: a second
// reading after a little more work is larger.
func TestProcRunTimeIsTheThreadsTimeOnCPU(t *testing.T) {
	pid, work, stop := lineChild(t, `while read line; do i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo done; done`)
	defer stop()
	r0, err := ProcRunTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	work()
	r1, err := ProcRunTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	work()
	r2, err := ProcRunTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	if !(r0 < r1 && r1 < r2) {
		t.Errorf("run time did not grow with work: %v, %v, %v", r0, r1, r2)
	}
	if _, err := ProcRunTime(1 << 30); err == nil {
		t.Error("no error for a process that does not exist")
	}
}
