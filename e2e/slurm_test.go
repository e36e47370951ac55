package e2e

import (
	"encoding/json"
	"fmt"
	"golang.org/x/sys/unix"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/fakenvml"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// slurmCluster is a one-node Slurm cluster on this machine: munged,
// slurmctld and slurmd from the distribution's packages, in temp dirs, on
// free ports, with proctrack/linuxproc (no cgroup setup).
type slurmCluster struct {
	t    *testing.T
	dir  string
	conf string
	env  []string // SLURM_CONF for the tools and the agent
}

func startSlurm(t *testing.T) *slurmCluster {
	t.Helper()
	for _, tool := range []string{"munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "runuser"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s not found: .ci/run installs slurm-wlm and munge", tool)
			}
			t.Skipf("%s not found (apt-get install slurm-wlm munge)", tool)
		}
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the Slurm test starts slurmd as root: CI runs as root")
		}
		t.Skip("the Slurm test starts slurmd as root")
	}
	// Under /tmp with short paths (munge's socket path), readable by the
	// jobs' user.
	dir, err := os.MkdirTemp("", "tmslurm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, d := range []string{"munge", "state", "spool", "log", "jobs"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "jobs"), 0o777); err != nil {
		t.Fatal(err)
	}
	s := &slurmCluster{t: t, dir: dir, conf: filepath.Join(dir, "slurm.conf")}
	s.env = []string{"SLURM_CONF=" + s.conf}
	m := filepath.Join(dir, "munge")
	s.must("mungekey", "-c", "-k", filepath.Join(m, "key"))
	s.daemon("munged", "-F", "-f", "--socket="+filepath.Join(m, "sock"), "--key-file="+filepath.Join(m, "key"),
		"--pid-file="+filepath.Join(m, "pid"), "--log-file="+filepath.Join(m, "log"), "--seed-file="+filepath.Join(m, "seed"))
	s.eventually("munged's socket", func() bool { _, err := os.Stat(filepath.Join(m, "sock")); return err == nil })
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ = strings.Cut(host, ".")
	conf := fmt.Sprintf(`ClusterName=tmtest
SlurmctldHost=%[1]s(127.0.0.1)
SlurmctldPort=%[2]s
SlurmdPort=%[3]s
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%[4]s/munge/sock
CredType=cred/munge
StateSaveLocation=%[4]s/state
SlurmdSpoolDir=%[4]s/spool
SlurmctldPidFile=%[4]s/ctld.pid
SlurmdPidFile=%[4]s/d.pid
SlurmctldLogFile=%[4]s/log/ctld.log
SlurmdLogFile=%[4]s/log/d.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=600
KillWait=2
GresTypes=gpu
NodeName=%[1]s NodeAddr=127.0.0.1 CPUs=8 Gres=gpu:5 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
`, host, freePort(t), freePort(t), dir)
	if err := os.WriteFile(s.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// The fake driver's five GPUs as slurmd's GRES, in the order of the
	// GPUs' indexes: character devices, as slurmd wants, that it never
	// opens (no task/cgroup); /dev/null's numbers.
	devs := filepath.Join(dir, "dev")
	if err := os.MkdirAll(devs, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := unix.Mknod(filepath.Join(devs, fmt.Sprintf("nvidia%d", i)), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatalf("a GRES device node: %v", err)
		}
	}
	gres := fmt.Sprintf("AutoDetect=off\nNodeName=%s Name=gpu File=%s/nvidia[0-4]\n", host, devs)
	if err := os.WriteFile(filepath.Join(dir, "gres.conf"), []byte(gres), 0o644); err != nil {
		t.Fatal(err)
	}
	s.daemon("slurmctld", "-D", "-c", "-f", s.conf)
	s.daemon("slurmd", "-D", "-f", s.conf)
	s.eventually("the node idle in sinfo", func() bool {
		out, _ := s.cmd("sinfo", "-h", "-o", "%t").Output()
		return strings.TrimSpace(string(out)) == "idle"
	})
	return s
}

func (s *slurmCluster) cmd(name string, args ...string) *exec.Cmd {
	c := exec.Command(name, args...)
	c.Env = append(os.Environ(), s.env...)
	return c
}

func (s *slurmCluster) must(name string, args ...string) string {
	s.t.Helper()
	out, err := s.cmd(name, args...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// daemon starts a daemon in the foreground and stops it at the end.
func (s *slurmCluster) daemon(name string, args ...string) {
	s.t.Helper()
	c := s.cmd(name, args...)
	logf, err := os.Create(filepath.Join(s.dir, "log", name+".out"))
	if err != nil {
		s.t.Fatal(err)
	}
	c.Stdout, c.Stderr = logf, logf
	if err := c.Start(); err != nil {
		s.t.Fatalf("%s: %v", name, err)
	}
	s.t.Cleanup(func() {
		_ = c.Process.Kill()
		_ = c.Wait()
		logf.Close()
		if s.t.Failed() {
			for _, f := range []string{name + ".out", "ctld.log", "d.log"} {
				if b, err := os.ReadFile(filepath.Join(s.dir, "log", f)); err == nil && len(b) > 0 {
					s.t.Logf("%s:\n%s", f, b[max(0, len(b)-3000):])
				}
			}
		}
	})
}

func (s *slurmCluster) eventually(what string, ok func() bool) {
	s.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// sbatch submits script as user (root: as is) and returns the job id.
func (s *slurmCluster) sbatch(user, name, account, script string, extra ...string) string {
	s.t.Helper()
	path := filepath.Join(s.dir, "jobs", name+".sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		s.t.Fatal(err)
	}
	args := append([]string{"--parsable", "-J", name, "-A", account, "-D", filepath.Join(s.dir, "jobs"), "-o", filepath.Join(s.dir, "jobs", name+".out")}, extra...)
	args = append(args, path)
	if user != "root" {
		args = append([]string{"-u", user, "--", "sbatch"}, args...)
		return s.must("runuser", args...)
	}
	return s.must("sbatch", args...)
}

// gpuDriver plays the driver's process list for the fake library: every
// GPU PID file in dir ("GPU PID", written by a job) is listed while its
// process lives, as NVML lists a process while it holds a GPU context.
func gpuDriver(t *testing.T, dir, procs string) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			var b strings.Builder
			files, _ := filepath.Glob(filepath.Join(dir, "*.gpu"))
			for _, f := range files {
				raw, _ := os.ReadFile(f)
				var g, pid int
				if _, err := fmt.Sscan(string(raw), &g, &pid); err == nil {
					if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
						fmt.Fprintf(&b, "%d %d 1024 80\n", g, pid)
					}
				}
			}
			tmp := procs + ".tmp"
			if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err == nil {
				_ = os.Rename(tmp, procs)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// Slurm jobs that never heard of trainmeter, on a real one-node Slurm, with
// the real agent on the fake driver: each job's processes on its GPU make
// the job a run, slurm-tmtest-JOBID, with the job's user, account and
// partition, ended with the job's end (exit 0, exit 3, cancelled). A fourth
// job runs the Python client with no run_id: its steps' tokens land in the
// job's run. Each run's energy is its GPU's true energy over the run.
func TestSlurmJobsBecomeRuns(t *testing.T) {
	slurm := startSlurm(t)
	jobs := filepath.Join(slurm.dir, "jobs")
	procs := filepath.Join(slurm.dir, "procs")
	config := fmt.Sprintf("epoch_us %d\ngpus 5\nhigh_w 300\nprocs_file %s\n", time.Now().Add(-time.Minute).UnixMicro(), procs)
	cfg, err := fakenvml.ParseConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	env := append(fakeNVML(t, config), slurm.env...)
	gpuDriver(t, jobs, procs)
	c := startCollector(t)
	sock := c.startAgentEnv("slurm-node", "nvml", env, "--warmup", "0s")
	c.waitStreaming("slurm-node")

	// doctor names the source it detects on this node.
	if out, _ := doctorEnv(t, env, "--gpu", "nvml", "--socket", sock, "--collector", c.addr, "--node", "slurm-node"); !strings.Contains(out,
		"OK    slurm") || !strings.Contains(out, "Slurm jobs own their GPU processes' runs: slurmd runs (pid ") {
		t.Errorf("doctor on a Slurm node:\n%s", out)
	}

	// Each job puts its shell (or the Python client) on its GPU.
	onGPU := func(g int, name string) string { return fmt.Sprintf("echo %d $$ > %s/%s.gpu\n", g, jobs, name) }
	okJob := slurm.sbatch("nobody", "ok", "physics", onGPU(1, "ok")+"sleep 4\nexit 0\n")
	failJob := slurm.sbatch("nobody", "fails", "chemistry", onGPU(2, "fails")+"sleep 4\nexit 3\n")
	cancelJob := slurm.sbatch("daemon", "cancelled", "physics", onGPU(3, "cancelled")+"sleep 300\n")
	// A job allocated a GPU (GRES IDX 0: GPU 0) that never touches it: it
	// pays for it all the same.
	holdJob := slurm.sbatch("nobody", "holds", "astro", "sleep 6\nexit 0\n", "--gres=gpu:1")
	client := fmt.Sprintf(`import os, sys, time
sys.path.insert(0, %q)
import trainmeter
open(%q, "w").write("4 %%d" %% os.getpid())
run = trainmeter.start(socket_path=%q, model="slurm-model", gpus=[4])
for i in range(8):
    time.sleep(0.5)
    run.step(step=i + 1, tokens=1000)
run.end()
`, repoPath(t, "clients/python"), filepath.Join(jobs, "client.gpu"), sock)
	if err := os.WriteFile(filepath.Join(jobs, "client.py"), []byte(client), 0o644); err != nil {
		t.Fatal(err)
	}
	clientJob := slurm.sbatch("root", "client", "ml", "exec python3 "+filepath.Join(jobs, "client.py")+"\n")

	runID := func(job string) string { return "slurm-tmtest-" + job }
	c.eventually("the cancelled job's run", func() bool {
		_, err := c.q.GetRun(t.Context(), &trainmeterv1.GetRunRequest{RunId: runID(cancelJob)})
		return err == nil
	})
	time.Sleep(2 * time.Second)
	slurm.must("scancel", cancelJob)

	want := map[string]struct{ user, account, status string }{
		okJob:     {"nobody", "physics", "ok"},
		failJob:   {"nobody", "chemistry", "exit 3"},
		cancelJob: {"daemon", "physics", "stopped: cancelled"},
		clientJob: {"root", "ml", "ok"},
		holdJob:   {"nobody", "astro", "ok"},
	}
	for job, w := range want {
		r := c.waitEnded(runID(job))
		row := c.csvRow(runID(job))
		t.Logf("job %s: run %s user %s attribution %s end_status %s wall_s %.2f gpus %s energy %.1f J tokens %d labels %v",
			job, r.RunId, r.User, r.Attribution, row["end_status"], r.WallS, row["gpus"], r.EnergyJ, r.TokensProcessed, r.Labels)
		if r.Attribution != "slurm" || r.User != w.user || row["end_status"] != w.status ||
			r.Labels["slurm.account"] != w.account || r.Labels["slurm.partition"] != "debug" || r.Labels["slurm.job_id"] != job {
			t.Errorf("job %s: run %+v, status %q; want %+v", job, r, row["end_status"], w)
		}
	}
	gpuOf := map[string]int{okJob: 1, failJob: 2, cancelJob: 3, clientJob: 4, holdJob: 0}
	for job, g := range gpuOf {
		r := c.waitEnded(runID(job))
		if row := c.csvRow(runID(job)); row["gpus"] != "1" {
			t.Errorf("job %s: gpus %s, want its one GPU", job, row["gpus"])
		}
		truth := truthJ(t, cfg, r, []int{g}, time.Time{})
		if d := 100 * (r.EnergyJ - truth) / truth; math.Abs(d) > 2 {
			t.Errorf("job %s: %.1f J, the fake's truth over the run %.1f J (%+.2f %%)", job, r.EnergyJ, truth, d)
		}
	}
	if r := c.waitEnded(runID(clientJob)); r.TokensProcessed != 8000 || r.GetMetadata().GetModel() != "slurm-model" {
		t.Errorf("client job's run: tokens %d, model %q; want the client's 8000 tokens and its model", r.TokensProcessed, r.GetMetadata().GetModel())
	}
	table := c.cli("usage", "--by", "account")
	t.Logf("usage --by account:\n%s", table)
	if !strings.HasPrefix(table, "ACCOUNT ") {
		t.Errorf("usage --by account names its column ACCOUNT:\n%s", table)
	}
	var u usageJSON
	if err := json.Unmarshal([]byte(c.cli("usage", "--by", "account", "--json")), &u); err != nil {
		t.Fatal(err)
	}
	byAccount := map[string]float64{}
	for _, r := range u.Rows {
		if !r.Idle {
			byAccount[r.Keys[0]] += r.GPUSeconds
		}
	}
	wall := func(job string) float64 { return c.waitEnded(runID(job)).WallS }
	within(t, "physics GPU-s", byAccount["physics"], wall(okJob)+wall(cancelJob), 1e-6)
	within(t, "chemistry GPU-s", byAccount["chemistry"], wall(failJob), 1e-6)
	within(t, "ml GPU-s", byAccount["ml"], wall(clientJob), 1e-6)
	// The job that held GPU 0 without a process on it was billed for it
	// while its step ran on the node (its 6 s sleep, found and ended
	// within a poll).
	within(t, "astro GPU-s", byAccount["astro"], wall(holdJob), 1e-6)
	if w := wall(holdJob); w < 4 || w > 9 {
		t.Errorf("the job holding GPU 0 for 6 s was billed %.2f s of it", w)
	}
}
