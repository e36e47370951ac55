package owner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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
	// node is this node's Slurm name: slurmd's -N, else the short host name.
	node string

	mu   sync.Mutex
	jobs map[string]Owner // job id -> its owner, once known

	gres map[string][]int // job id -> its GPUs on this node (GRES IDX)
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
	s := &Slurm{proc: p, jobs: map[string]Owner{}, gres: map[string][]int{}}
	s.scontrol, _ = exec.LookPath("scontrol")
	s.sacct, _ = exec.LookPath("sacct")
	s.node = slurmdNode(p)
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

// slurmdNode is the node's Slurm name: the -N of a slurmd's command line,
// else the short host name.
func slurmdNode(p Proc) string {
	ents, _ := os.ReadDir(p.Root)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(p.Root, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != "slurmd" {
			continue
		}
		for i, a := range args {
			if a == "-N" && i+1 < len(args) {
				return args[i+1]
			}
		}
	}
	h, _ := os.Hostname()
	h, _, _ = strings.Cut(h, ".")
	return h
}

// Allocated implements Allocator: the jobs with a step on this node
// (`scontrol listpids`, which asks this node's slurmstepd daemons, not
// slurmctld: cheap each second) and the GPUs each was allocated here, read
// once per job (`scontrol -d show job`: the GRES IDX of this node, which is
// the GPU's device index when gres.conf lists /dev/nvidia0, 1, ... in
// order). Without scontrol, none.
func (s *Slurm) Allocated(_ time.Time, devs []Device) []Allocation {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.scontrol == "" || s.node == "" {
		return nil
	}
	out, err := s.run(s.scontrol, "listpids")
	if err != nil {
		// No job step on this node ("No job steps exist on this node")
		// is an error exit of scontrol too.
		out = nil
	}
	live := map[string]bool{}
	var alloc []Allocation
	for _, job := range ListpidsJobs(string(out)) {
		live[job] = true
		gpus, ok := s.gres[job]
		if !ok {
			info, err := s.run(s.scontrol, "-d", "show", "job", "-o", job)
			if err != nil {
				continue // asked again next time
			}
			gpus = SlurmJobGPUs(string(info), s.node)
			s.gres[job] = gpus
		}
		var idx []int
		for _, g := range gpus {
			if g < len(devs) {
				idx = append(idx, devs[g].Index)
			}
		}
		if len(idx) == 0 {
			continue
		}
		o, known := s.jobs[job]
		if !known {
			o = s.owner(0, job, nil)
			s.jobs[job] = o
		}
		alloc = append(alloc, Allocation{Owner: o, GPUs: idx})
	}
	for job := range s.gres {
		if !live[job] {
			delete(s.gres, job)
		}
	}
	return alloc
}

// ListpidsJobs reads the job ids of `scontrol listpids` output
// ("PID JOBID STEPID LOCALID GLOBALID" and a line per process), each once.
func ListpidsJobs(out string) []string {
	var jobs []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] == "PID" {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err == nil && !slices.Contains(jobs, f[1]) {
			jobs = append(jobs, f[1])
		}
	}
	return jobs
}

// gresIDX is a GPU GRES with its indexes in `scontrol -d show job`:
// GRES=gpu:2(IDX:0-1), gpu:a100:1(IDX:3), GRES_IDX=gpu(IDX:0,2).
var gresIDX = regexp.MustCompile(`gpu(?::[^:(,=]+)*\(IDX:([0-9,-]+)\)`)

// SlurmJobGPUs reads the GPU indexes a job was allocated on node from
// `scontrol -d show job -o` output, whose per-node lines read
// "Nodes=NODELIST CPU_IDs=... Mem=... GRES=gpu:N(IDX:...)".
func SlurmJobGPUs(info, node string) []int {
	var out []int
	onNode := false
	for _, f := range strings.Fields(info) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "Nodes":
			onNode = slices.Contains(ExpandHostlist(v), node)
		case "GRES", "GRES_IDX":
			if !onNode {
				continue
			}
			for _, m := range gresIDX.FindAllStringSubmatch(v, -1) {
				for _, g := range expandRanges(m[1]) {
					if !slices.Contains(out, g) {
						out = append(out, g)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// expandRanges reads "0-1,3" as 0, 1, 3.
func expandRanges(s string) []int {
	var out []int
	for _, part := range strings.Split(s, ",") {
		a, b, isRange := strings.Cut(part, "-")
		lo, err := strconv.Atoi(a)
		if err != nil {
			continue
		}
		hi := lo
		if isRange {
			if hi, err = strconv.Atoi(b); err != nil || hi < lo || hi-lo > 4096 {
				continue
			}
		}
		for i := lo; i <= hi; i++ {
			out = append(out, i)
		}
	}
	return out
}

// ExpandHostlist expands a Slurm host list: "n1,gpu[01-03,7]" as n1,
// gpu01, gpu02, gpu03, gpu7 (one bracket per name, as Slurm prints node
// lists of a job).
func ExpandHostlist(s string) []string {
	var out []string
	for len(s) > 0 {
		// The next name ends at a comma outside brackets.
		depth, end := 0, len(s)
		for i, c := range s {
			if c == '[' {
				depth++
			} else if c == ']' {
				depth--
			} else if c == ',' && depth == 0 {
				end = i
				break
			}
		}
		name := s[:end]
		s = strings.TrimPrefix(s[end:], ",")
		open, close := strings.IndexByte(name, '['), strings.IndexByte(name, ']')
		if open < 0 || close < open {
			out = append(out, name)
			continue
		}
		prefix, suffix := name[:open], name[close+1:]
		for _, part := range strings.Split(name[open+1:close], ",") {
			a, b, isRange := strings.Cut(part, "-")
			if !isRange {
				out = append(out, prefix+a+suffix)
				continue
			}
			lo, err1 := strconv.Atoi(a)
			hi, err2 := strconv.Atoi(b)
			if err1 != nil || err2 != nil || hi < lo || hi-lo > 65536 {
				continue
			}
			for i := lo; i <= hi; i++ {
				out = append(out, prefix+fmt.Sprintf("%0*d", len(a), i)+suffix)
			}
		}
	}
	return out
}
