package owner

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Slurm finds the Slurm job of a process: from its cgroup (.../job_N/...,
// cgroup v1 and v2, where slurmd's task/cgroup or proctrack/cgroup plugin
// puts it), else from SLURM_JOB_ID in its environment (/proc/PID/environ,
// which only root and the job's user may read). The job's metadata comes
// from that environment and, where it is installed, `scontrol show job`;
// its end status from scontrol, else sacct.
type Slurm struct {
	proc Proc
	// Cluster is the cluster's name (scontrol show config ClusterName); ""
	// until known, then a job's SLURM_CLUSTER_NAME names it.
	cluster string
	// scontrol, sacct: the tools' paths, "" when not installed.
	scontrol, sacct string

	mu   sync.Mutex
	jobs map[string]Owner // job id -> its owner, once known
}

// SlurmDetect reports whether slurmd runs on this node (a process named
// slurmd under procRoot) and, when it does not, why.
func SlurmDetect(p Proc) (bool, string) {
	ents, err := os.ReadDir(p.Root)
	if err != nil {
		return false, "cannot list " + p.Root + ": " + err.Error()
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(p.Root, e.Name(), "comm")); err == nil && strings.TrimSpace(string(b)) == "slurmd" {
			return true, "slurmd runs (pid " + strconv.Itoa(pid) + ")"
		}
	}
	return false, "no slurmd process on this node"
}

// NewSlurm is the Slurm source over procfs p; it asks scontrol for the
// cluster's name when scontrol is installed.
func NewSlurm(p Proc) *Slurm {
	s := &Slurm{proc: p, jobs: map[string]Owner{}}
	s.scontrol, _ = exec.LookPath("scontrol")
	s.sacct, _ = exec.LookPath("sacct")
	if out, err := s.run(s.scontrol, "show", "config"); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok && strings.TrimSpace(k) == "ClusterName" {
				s.cluster = strings.TrimSpace(v)
			}
		}
	}
	return s
}

// Name implements Source.
func (s *Slurm) Name() string { return AttrSlurm }

var cgroupJob = regexp.MustCompile(`/job_([0-9]+)(?:/|$)`)

// JobOfCgroup is the Slurm job id in cgroup paths, "" when none.
func JobOfCgroup(cgroups []string) string {
	for _, c := range cgroups {
		if m := cgroupJob.FindStringSubmatch(c); m != nil {
			return m[1]
		}
	}
	return ""
}

// Owners implements Source.
func (s *Slurm) Owners(procs []Process) map[int]Owner {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int]Owner{}
	for _, p := range procs {
		if _, done := out[p.PID]; done {
			continue
		}
		job := ""
		if cg, err := s.proc.Cgroup(p.PID); err == nil {
			job = JobOfCgroup(cg)
		}
		env, _ := s.proc.Environ(p.PID) // nil when not readable (doctor says so)
		if job == "" {
			job = env["SLURM_JOB_ID"]
		}
		if job == "" {
			continue
		}
		o, ok := s.jobs[job]
		if !ok {
			o = s.owner(p.PID, job, env)
			s.jobs[job] = o
		}
		out[p.PID] = o
	}
	return out
}

// owner builds the job's owner from its environment (env may be nil) and
// scontrol.
func (s *Slurm) owner(pid int, job string, env map[string]string) Owner {
	info := map[string]string{}
	if out, err := s.run(s.scontrol, "show", "job", "-o", job); err == nil {
		info = parseKV(string(out))
	}
	pick := func(envKey, infoKey string) string {
		if v := env[envKey]; v != "" {
			return v
		}
		return info[infoKey]
	}
	cluster := pick("SLURM_CLUSTER_NAME", "")
	if cluster == "" {
		cluster = s.cluster
	}
	id := "slurm-" + job
	if cluster != "" {
		id = "slurm-" + sanitize(cluster) + "-" + job
	}
	o := Owner{Source: AttrSlurm, RunID: id, UID: -1, Persistent: true, Labels: map[string]string{"slurm.job_id": job}}
	set := func(label, v string) {
		if v != "" && v != "(null)" && v != "N/A" {
			o.Labels[label] = v
		}
	}
	set("slurm.cluster", cluster)
	set("slurm.account", pick("SLURM_JOB_ACCOUNT", "Account"))
	set("slurm.partition", pick("SLURM_JOB_PARTITION", "Partition"))
	set("slurm.job_name", pick("SLURM_JOB_NAME", "JobName"))
	set("slurm.array_job_id", pick("SLURM_ARRAY_JOB_ID", "ArrayJobId"))
	set("slurm.array_task_id", pick("SLURM_ARRAY_TASK_ID", "ArrayTaskId"))
	set("slurm.nodelist", pick("SLURM_JOB_NODELIST", "NodeList"))
	set("slurm.gpus", pick("SLURM_JOB_GPUS", ""))
	if v := env["SLURM_STEP_ID"]; v != "" {
		set("slurm.step_id", v)
	}
	// The job's user: SLURM_JOB_UID, scontrol's UserId=name(uid), else the
	// process's.
	if u, err := strconv.Atoi(env["SLURM_JOB_UID"]); err == nil {
		o.UID = u
	} else if m := userIDUID.FindStringSubmatch(info["UserId"]); m != nil {
		o.UID, _ = strconv.Atoi(m[1])
	} else if u, err := s.proc.UID(pid); err == nil {
		o.UID = u
	}
	return o
}

var userIDUID = regexp.MustCompile(`\(([0-9]+)\)`)

// parseKV reads scontrol's one-line Key=Value output.
func parseKV(s string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(s) {
		if k, v, ok := strings.Cut(f, "="); ok {
			if _, seen := m[k]; !seen {
				m[k] = v
			}
		}
	}
	return m
}

// Ended implements Source: the job's state from scontrol (while slurmctld
// remembers the job, MinJobAge), else sacct (with accounting). Without
// either tool the job's run ends as soon as none of its processes is on a
// GPU, its status unknown.
func (s *Slurm) Ended(o Owner) (End, bool) {
	job := o.Labels["slurm.job_id"]
	state, code := "", ""
	if out, err := s.run(s.scontrol, "show", "job", "-o", job); err == nil {
		kv := parseKV(string(out))
		state, code = kv["JobState"], kv["ExitCode"]
	} else if out, err := s.run(s.sacct, "-n", "-P", "-X", "-j", job, "-o", "State,ExitCode"); err == nil {
		if f := strings.Split(strings.TrimSpace(string(out)), "|"); len(f) == 2 {
			if w := strings.Fields(f[0]); len(w) > 0 { // "CANCELLED by 0"
				state, code = w[0], f[1]
			}
		}
	}
	if state == "" {
		if s.scontrol == "" && s.sacct == "" {
			return End{}, true
		}
		return End{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	end, done := SlurmEnd(state, code)
	if done {
		delete(s.jobs, job)
	}
	return end, done
}

// SlurmEnd maps a job's state and ExitCode ("status:signal") to how its run
// ended; done false while the job has not ended.
func SlurmEnd(state, exitCode string) (End, bool) {
	st, sig := 0, 0
	if a, b, ok := strings.Cut(exitCode, ":"); ok {
		st, _ = strconv.Atoi(a)
		sig, _ = strconv.Atoi(b)
	}
	switch strings.ToUpper(state) {
	case "PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED":
		return End{}, false
	case "COMPLETED":
		return End{Status: "ok"}, true
	case "CANCELLED":
		return End{Status: "stopped: cancelled"}, true
	case "TIMEOUT", "DEADLINE":
		return End{Status: "stopped: timeout"}, true
	case "PREEMPTED":
		return End{Status: "stopped: preempted"}, true
	case "OUT_OF_MEMORY":
		return End{Status: "error", Error: "out of memory (Slurm OUT_OF_MEMORY)"}, true
	case "FAILED":
		switch {
		case sig > 0:
			return End{Status: "signal " + unix.SignalName(unix.Signal(sig))}, true
		case st > 0:
			return End{Status: "exit " + strconv.Itoa(st)}, true
		}
	}
	return End{Status: "error", Error: "Slurm job state " + state}, true
}

// run runs a Slurm tool ("" when not installed) for at most 5 s.
func (s *Slurm) run(tool string, args ...string) ([]byte, error) {
	if tool == "" {
		return nil, errors.New("not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, errors.New(strings.TrimSpace(err.Error() + ": " + stderr.String()))
	}
	return out, nil
}
