package owner

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

func TestJobOfCgroup(t *testing.T) {
	for _, c := range []struct {
		cg   []string
		want string
	}{
		{[]string{"/slurm/uid_1000/job_4242/step_batch/task_0"}, "4242"},                        // v1
		{[]string{"/system.slice/slurmstepd.scope/job_77/step_0/user/task_0"}, "77"},            // v2
		{[]string{"/", "/slurm/uid_0/job_5"}, "5"},                                              // v1, job level
		{[]string{"/user.slice/user-1000.slice/session-3.scope"}, ""},                           // a login
		{[]string{"/system.slice/docker-0123abcd.scope", "/kubepods/burstable/podx/job_x"}, ""}, // not a job id
	} {
		if got := JobOfCgroup(c.cg); got != c.want {
			t.Errorf("JobOfCgroup(%q) = %q, want %q", c.cg, got, c.want)
		}
	}
}

func TestContainerID(t *testing.T) {
	id := "4f2b9c0a8d1e7f3a6b5c4d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a"
	for _, cg := range []string{
		"/system.slice/docker-" + id + ".scope",
		"/kubepods/burstable/pod1234/" + id,
		"/system.slice/cri-containerd-" + id + ".scope",
		"/machine.slice/libpod-" + id + ".scope/container",
		"/docker/" + id,
	} {
		if got := ContainerID([]string{cg}); got != id {
			t.Errorf("ContainerID(%q) = %q", cg, got)
		}
	}
	if got := ContainerID([]string{"/user.slice/user-0.slice/session-1.scope", "/process_api/a98d0d9171b618cb26ef59861430e7ae"}); got != "" {
		t.Errorf("no container: %q", got)
	}
}

func TestSlurmEnd(t *testing.T) {
	for _, c := range []struct {
		state, code string
		want        End
		done        bool
	}{
		{"RUNNING", "0:0", End{}, false},
		{"COMPLETING", "0:0", End{}, false},
		{"COMPLETED", "0:0", End{Status: "ok"}, true},
		{"FAILED", "3:0", End{Status: "exit 3"}, true},
		{"FAILED", "0:9", End{Status: "signal SIGKILL"}, true},
		{"CANCELLED", "0:15", End{Status: "stopped: cancelled"}, true},
		{"TIMEOUT", "0:15", End{Status: "stopped: timeout"}, true},
		{"OUT_OF_MEMORY", "0:125", End{Status: "error", Error: "out of memory (Slurm OUT_OF_MEMORY)"}, true},
		{"NODE_FAIL", "0:0", End{Status: "error", Error: "Slurm job state NODE_FAIL"}, true},
	} {
		got, done := SlurmEnd(c.state, c.code)
		if got != c.want || done != c.done {
			t.Errorf("SlurmEnd(%s, %s) = %+v, %v; want %+v, %v", c.state, c.code, got, done, c.want, c.done)
		}
	}
}

// A job found by the environment alone (proctrack/linuxproc puts no job
// cgroup): its run id names the cluster and job, its labels the job's
// account, partition, name and array ids, its uid the job's user.
func TestSlurmOwnersFromEnviron(t *testing.T) {
	dir := t.TempDir()
	write := func(pid int, files map[string]string) {
		d := filepath.Join(dir, strconv.Itoa(pid))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for n, b := range files {
			if err := os.WriteFile(filepath.Join(d, n), []byte(b), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(10, map[string]string{"cgroup": "0::/\n", "status": "Uid:\t1000\t1000\t1000\t1000\n",
		"environ": "PATH=/bin\x00SLURM_JOB_ID=812\x00SLURM_CLUSTER_NAME=hpc one\x00SLURM_JOB_ACCOUNT=physics\x00SLURM_JOB_PARTITION=gpu\x00" +
			"SLURM_JOB_NAME=train\x00SLURM_ARRAY_JOB_ID=800\x00SLURM_ARRAY_TASK_ID=12\x00SLURM_JOB_NODELIST=n[1-2]\x00SLURM_JOB_UID=1000\x00"})
	write(11, map[string]string{"cgroup": "0::/system.slice/slurmstepd.scope/job_812/step_0/user/task_0\n", "status": "Uid:\t1000\t1000\t1000\t1000\n"})
	write(12, map[string]string{"cgroup": "0::/user.slice\n", "status": "Uid:\t0\t0\t0\t0\n", "environ": "PATH=/bin\x00"})
	s := &Slurm{proc: Proc{Root: dir}, jobs: map[string]Owner{}}
	got := s.Owners([]Process{{PID: 10, GPU: 0}, {PID: 11, GPU: 1}, {PID: 12, GPU: 1}})
	if len(got) != 2 {
		t.Fatalf("owners %+v: want PIDs 10 and 11 (one job), not 12", got)
	}
	o := got[10]
	if o.RunID != "slurm-hpc_one-812" || got[11].RunID != o.RunID || o.UID != 1000 || !o.Persistent || o.Source != AttrSlurm {
		t.Errorf("owner %+v, %+v", o, got[11])
	}
	for k, v := range map[string]string{"slurm.account": "physics", "slurm.partition": "gpu", "slurm.job_name": "train",
		"slurm.array_job_id": "800", "slurm.array_task_id": "12", "slurm.nodelist": "n[1-2]", "slurm.job_id": "812", "slurm.cluster": "hpc one"} {
		if o.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, o.Labels[k], v)
		}
	}
}

func TestProcessOwner(t *testing.T) {
	dir := t.TempDir()
	for pid, body := range map[int]string{
		300: "300 (bash) S 1 300 300 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5000 0 0\n",
		301: "301 (python3 (x)) S 300 300 300 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 6000 0 0\n",
	} {
		d := filepath.Join(dir, strconv.Itoa(pid))
		_ = os.MkdirAll(d, 0o755)
		_ = os.WriteFile(filepath.Join(d, "stat"), []byte(body), 0o644)
		_ = os.WriteFile(filepath.Join(d, "status"), []byte("Uid:\t1001\t1001\t1001\t1001\n"), 0o644)
		_ = os.WriteFile(filepath.Join(d, "cgroup"), []byte("0::/system.slice/docker-4f2b9c0a8d1e7f3a6b5c4d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a.scope\n"), 0o644)
	}
	o, err := ProcessOwner(Proc{Root: dir}, "node/1", 301)
	if err != nil {
		t.Fatal(err)
	}
	// The group leader's start time names the run: every process of the
	// group is in it.
	if o.RunID != "proc-node_1-1001-300-5000" || o.UID != 1001 || o.Persistent || o.Labels["process.command"] != "python3 (x)" ||
		o.Labels["container.id"] != "4f2b9c0a8d1e7f3a6b5c4d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a" {
		t.Errorf("owner %+v", o)
	}
	if _, err := ProcessOwner(Proc{Root: dir}, "n", 999); err == nil {
		t.Error("a gone process has an owner")
	}
}

func TestSlurmJobGPUs(t *testing.T) {
	// scontrol -d show job -o of a two-node job (Slurm 23.x prints GRES,
	// older ones GRES_IDX).
	info := "JobId=42 JobName=train UserId=alice(1000) JobState=RUNNING NodeList=gpu[01-02] " +
		"Nodes=gpu01 CPU_IDs=0-3 Mem=0 GRES=gpu:a100:2(IDX:0-1) Nodes=gpu02 CPU_IDs=0-3 Mem=0 GRES=gpu:a100:2(IDX:2,3),mps:0 TresPerNode=gres/gpu:2"
	for node, want := range map[string][]int{"gpu01": {0, 1}, "gpu02": {2, 3}, "gpu03": nil} {
		if got := SlurmJobGPUs(info, node); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", node, got, want)
		}
	}
	if got := SlurmJobGPUs("Nodes=n[1-2,5] CPU_IDs=0 Mem=0 GRES_IDX=gpu(IDX:1)", "n5"); !slices.Equal(got, []int{1}) {
		t.Errorf("GRES_IDX: %v", got)
	}
}

func TestExpandHostlist(t *testing.T) {
	got := ExpandHostlist("login,gpu[01-03,7],cpu[9-10]x")
	want := []string{"login", "gpu01", "gpu02", "gpu03", "gpu7", "cpu9x", "cpu10x"}
	if !slices.Equal(got, want) {
		t.Errorf("%v, want %v", got, want)
	}
}

func TestListpidsJobs(t *testing.T) {
	out := "PID      JOBID    STEPID   LOCALID GLOBALID\n2101     4        batch    0       0       \n2102     4        batch    -       -       \n2200     12       0        0       0\n"
	if got := ListpidsJobs(out); !slices.Equal(got, []string{"4", "12"}) {
		t.Errorf("%v", got)
	}
}
