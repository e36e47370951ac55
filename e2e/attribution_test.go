package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// asUser starts `sh -c 'echo $$; exec CMD'` as a Linux user with runuser
// and returns the process and its PID (the shell's, which becomes CMD).
func asUser(t *testing.T, user, cmd string) (*exec.Cmd, int) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("runuser needs root: CI runs the e2e tests as root")
		}
		t.Skip("runuser needs root")
	}
	c := exec.Command("runuser", "-u", user, "--", "sh", "-c", "echo $$; exec "+cmd)
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatalf("runuser -u %s: %v", user, err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("runuser -u %s: no PID: %v", user, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	return c, pid
}

// listRuns is every run the collector has.
func (c *cluster) listRuns() []*trainmeterv1.RunReport {
	c.t.Helper()
	resp, err := c.q.ListRuns(context.Background(), &trainmeterv1.ListRunsRequest{})
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.Runs
}

// GPU processes of two Linux users that never spoke to the agent (no
// client, no trainmeter run) on GPUs 0 and 1 of the fake driver; GPU 2 runs
// nothing. Each user's processes become a run of their own (attribution
// process, the user, the command as a label) that ends when they exit,
// `usage --by user` bills each user the GPU-seconds their process was
// listed on its GPU, and idle is GPU 2 plus the time around the processes.
func TestUnownedGPUProcessesBilledToTheirUsers(t *testing.T) {
	t.Parallel()
	procs := filepath.Join(t.TempDir(), "procs")
	if err := os.WriteFile(procs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env := fakeNVML(t, fmt.Sprintf("epoch_us %d\ngpus 3\nhigh_w 300\nprocs_file %s\n", time.Now().Add(-time.Minute).UnixMicro(), procs))
	c := startCollector(t)
	c.startAgentEnv("users-node", "nvml", env)
	c.waitStreaming("users-node")

	nobody, pidN := asUser(t, "nobody", "sleep 5")
	daemon, pidD := asUser(t, "daemon", "sleep 5")
	// As the driver lists them: each process on its GPU while it runs.
	if err := os.WriteFile(procs, fmt.Appendf(nil, "0 %d 1024 60\n1 %d 2048 40\n", pidN, pidD), 0o644); err != nil {
		t.Fatal(err)
	}
	listed := time.Now()
	_ = nobody.Wait()
	_ = daemon.Wait()
	if err := os.WriteFile(procs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	gone := time.Since(listed).Seconds()

	byUser := map[string]*trainmeterv1.RunReport{}
	c.eventually("both users' runs ended", func() bool {
		for _, r := range c.listRuns() {
			if r.Attribution == "process" && r.Ended {
				byUser[r.User] = r
			}
		}
		return byUser["nobody"] != nil && byUser["daemon"] != nil
	})
	for user, r := range byUser {
		row := c.csvRow(r.RunId)
		t.Logf("%s: run %s gpus %s wall_s %s gpu_hours %s end_status %s attribution %s", user, r.RunId, row["gpus"], row["wall_s"], row["gpu_hours"], row["end_status"], row["attribution"])
		if row["attribution"] != "process" || row["end_status"] != "ok" || row["user"] != "" && row["user"] != user {
			t.Errorf("%s's run: %v", user, row)
		}
		if !strings.HasPrefix(r.RunId, "proc-users-node-") || r.Labels["process.command"] != "sleep" {
			t.Errorf("%s's run id %q, labels %v", user, r.RunId, r.Labels)
		}
		// Listed for `gone` seconds, found within a poll (1 s) of it and
		// ended within a poll of its exit.
		if r.WallS < gone-1.5 || r.WallS > gone+1.5 {
			t.Errorf("%s's run lasted %.2f s; its process was on the GPU for %.2f s", user, r.WallS, gone)
		}
	}
	if g := byUser["nobody"].GetGpus(); g != 1 {
		t.Errorf("nobody's run has %d GPUs, want GPU 0 alone", g)
	}

	var u usageJSON
	if err := json.Unmarshal([]byte(c.cli("usage", "--by", "user", "--json")), &u); err != nil {
		t.Fatal(err)
	}
	rows := map[string]float64{}
	var runS float64
	for _, r := range u.Rows {
		key := strings.Join(r.Keys, "/")
		rows[key] += r.GPUSeconds
		if !r.Idle {
			runS += r.GPUSeconds
		}
	}
	t.Logf("usage --by user: %v, nodes %+v", rows, u.Nodes)
	for user, r := range byUser {
		// A user's GPU-seconds are its run's: one GPU for its wall time.
		within(t, user+"'s GPU-seconds", rows[user], r.WallS, 1e-6)
	}
	if len(u.Nodes) != 1 {
		t.Fatalf("nodes %+v", u.Nodes)
	}
	n := u.Nodes[0]
	within(t, "runs + idle", runS+n.IdleS, n.GPUSeconds, 1e-6)
	// Idle is everything but the two processes' time: 3 GPUs over the
	// node's time less the users' GPU-seconds.
	within(t, "idle", n.IdleS, n.GPUSeconds-byUser["nobody"].WallS-byUser["daemon"].WallS, 1e-6)
}
