package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// slurmProcFixture writes a procfs tree in which a slurmd runs and the
// given PIDs are processes of Slurm job 77 of cluster e2e, account
// physics (their environment as slurmstepd sets it). No Slurm runs: the
// agents read the job from the processes as on a node with
// proctrack/linuxproc, and find no scontrol or sacct on their PATH.
func slurmProcFixture(t *testing.T, pids ...int) string {
	t.Helper()
	root := t.TempDir()
	write := func(pid int, name, body string) {
		d := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(4000000, "comm", "slurmd\n")
	for _, pid := range pids {
		write(pid, "stat", fmt.Sprintf("%d (python3) S 1 %d %d 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, pid, pid, 1000+pid))
		write(pid, "status", "Name:\tpython3\nUid:\t0\t0\t0\t0\n")
		write(pid, "cgroup", "0::/system.slice/slurmd.service\n")
		env := []string{"SLURM_JOB_ID=77", "SLURM_CLUSTER_NAME=e2e", "SLURM_JOB_ACCOUNT=physics", "SLURM_JOB_PARTITION=gpu",
			"SLURM_JOB_NAME=allreduce", "SLURM_JOB_NODELIST=slurm-a,slurm-b", "SLURM_JOB_UID=0"}
		write(pid, "environ", strings.Join(env, "\x00")+"\x00")
	}
	return root
}

// TestMultiNodeSlurmJobIsOneRun: one Slurm job's processes on two nodes
// (two real agents with node names slurm-a and slurm-b, each on its own
// fake libnvidia-ml: the job's rank on GPU 0 of slurm-a, on GPUs 0 and 1
// of slurm-b) become one run, slurm-e2e-77, in the collector, with both
// nodes' GPU time and energy: the run's GPU-seconds and energy are the sum
// of its rows of `usage --by node`, each node has its part, `usage --by
// account` bills physics the run's GPU-seconds, and each node's runs +
// idle = the node.
func TestMultiNodeSlurmJobIsOneRun(t *testing.T) {
	t.Parallel()
	const pidA, pidB = 4000001, 4000002
	proc := slurmProcFixture(t, pidA, pidB)
	dir := t.TempDir()
	noSlurm := "PATH=" + filepath.Join(dir, "bin") // no scontrol, no sacct
	c := startCollector(t)
	files := map[string]string{}
	for _, node := range []string{"slurm-a", "slurm-b"} {
		files[node] = filepath.Join(dir, node+".procs")
		if err := os.WriteFile(files[node], nil, 0o644); err != nil {
			t.Fatal(err)
		}
		env := fakeNVML(t, fmt.Sprintf("epoch_us %d\ngpus 2\nhigh_w 300\nprocs_file %s\n", time.Now().Add(-time.Minute).UnixMicro(), files[node]))
		c.startAgentEnv(node, "nvml", append(env, noSlurm), "--procfs-root", proc)
		c.waitStreaming(node)
	}
	if err := os.WriteFile(files["slurm-a"], fmt.Appendf(nil, "0 %d 1024 80\n", pidA), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(files["slurm-b"], fmt.Appendf(nil, "0 %d 1024 80\n1 %d 1024 80\n", pidB, pidB), 0o644); err != nil {
		t.Fatal(err)
	}
	c.eventually("the job's run", func() bool {
		for _, r := range c.listRuns() {
			if r.RunId == "slurm-e2e-77" {
				return true
			}
		}
		return false
	})
	time.Sleep(3 * time.Second)
	for _, f := range files {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := c.waitEnded("slurm-e2e-77")
	for _, other := range c.listRuns() {
		if other.RunId != r.RunId {
			t.Errorf("run %s (attribution %s, labels %v): only the job ran", other.RunId, other.Attribution, other.Labels)
		}
	}
	row := c.csvRow(r.RunId)
	gpuS := r.GpuHours * 3600
	t.Logf("run %s: gpus %s nodes %s wall_s %.2f gpu_s %.3f energy_j %.1f attribution %s labels %v", r.RunId, row["gpus"], row["nodes"], r.WallS, gpuS, r.EnergyJ, row["attribution"], r.Labels)
	if row["attribution"] != "slurm" || row["nodes"] != "2" || r.Labels["slurm.account"] != "physics" || r.Labels["slurm.job_id"] != "77" {
		t.Errorf("run: %v", row)
	}

	var byNode usageJSON
	if err := json.Unmarshal([]byte(c.cli("usage", "--by", "node", "--json")), &byNode); err != nil {
		t.Fatal(err)
	}
	runS, runJ := map[string]float64{}, map[string]float64{}
	idle := map[string]float64{}
	for _, u := range byNode.Rows {
		if u.Idle {
			idle[u.IdleNode] += u.GPUSeconds
			continue
		}
		node := strings.Join(u.Keys, "/")
		runS[node] += u.GPUSeconds
		runJ[node] += u.EnergyJ
	}
	t.Logf("usage --by node: runs %v s, %v J; idle %v s", runS, runJ, idle)
	if len(byNode.Nodes) != 2 {
		t.Fatalf("nodes %+v", byNode.Nodes)
	}
	for _, n := range byNode.Nodes {
		if runS[n.Node] <= 0 || runJ[n.Node] <= 0 {
			t.Errorf("node %s has no part of the job: %.3f GPU-s, %.1f J", n.Node, runS[n.Node], runJ[n.Node])
		}
		within(t, n.Node+": runs + idle", runS[n.Node]+n.IdleS, n.GPUSeconds, 1e-6)
	}
	// slurm-b ran the job on two GPUs, slurm-a on one, for about as long.
	if runS["slurm-b"] < 1.5*runS["slurm-a"] {
		t.Errorf("slurm-b's part %.3f GPU-s is not about twice slurm-a's %.3f", runS["slurm-b"], runS["slurm-a"])
	}
	within(t, "the run's GPU-seconds, both nodes'", gpuS, runS["slurm-a"]+runS["slurm-b"], 1e-6)
	within(t, "the run's energy, both nodes'", r.EnergyJ, runJ["slurm-a"]+runJ["slurm-b"], 1e-6)

	var byAccount usageJSON
	if err := json.Unmarshal([]byte(c.cli("usage", "--by", "account", "--json")), &byAccount); err != nil {
		t.Fatal(err)
	}
	for _, u := range byAccount.Rows {
		if !u.Idle {
			if strings.Join(u.Keys, "/") != "physics" {
				t.Errorf("usage --by account row %v", u)
			}
			within(t, "physics's GPU-seconds", u.GPUSeconds, gpuS, 1e-6)
		}
	}
}
