package doctor

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
	"github.com/trainmeter/trainmeter/agent/internal/owner"
	"github.com/trainmeter/trainmeter/agent/internal/podresources"
)

// SectionAttribution says who the GPU processes that no run owns are billed
// to: which owner sources the agent detects on this node, and why one is
// not available (docs/attribution.md).
const SectionAttribution = "attribution"

func checkAttribution(o Options, r *Report) {
	proc := owner.Proc{Root: cmp.Or(o.Config.ProcfsRoot, "/proc")}
	gpu := o.Config.GPU
	// nvml and amd list GPU processes; sim and replay do not.
	if !strings.HasPrefix(gpu, "nvml") && !strings.HasPrefix(gpu, "amd") && gpu != "auto" {
		r.add(SectionAttribution, "processes", OK, "--gpu "+gpu+" lists no GPU processes: only trainers' runs are billed, the rest of the GPU time is idle", "")
		return
	}
	att := o.Config.Attribution
	if agentconfig.Off(att.Processes) {
		r.add(SectionAttribution, "processes", OK, "off (attribution.processes): the GPU time of processes that no run, job or pod owns is idle", "")
	} else {
		r.add(SectionAttribution, "processes", OK, "GPU processes that no run, job or pod owns are billed to their Linux user (a run per process group)", "")
	}
	ok, why := owner.SlurmDetect(proc)
	switch {
	case agentconfig.Off(att.Slurm):
		r.add(SectionAttribution, "slurm", OK, "off (attribution.slurm)", "")
	case !ok:
		r.add(SectionAttribution, "slurm", OK, "not used: "+why, "")
	default:
		msg := "Slurm jobs own their GPU processes' runs: " + why
		st, hint := OK, ""
		if _, err := exec.LookPath("scontrol"); err != nil {
			st, hint = Warn, "install Slurm's client tools (scontrol) on the node: without them a job's run ends when its processes leave the GPUs, with no end status"
			msg += "; scontrol not found"
		}
		r.add(SectionAttribution, "slurm", st, msg, hint)
		if denied := environDenied(proc); denied != "" {
			r.add(SectionAttribution, "slurm environ", Warn, denied,
				"run the agent as root (the packaged service does) so that jobs whose processes are not in a job_N cgroup (proctrack/linuxproc) are found by SLURM_JOB_ID")
		}
	}
	sock := o.Config.Kubernetes.PodResourcesSocket
	if agentconfig.Off(att.Kubernetes) {
		r.add(SectionAttribution, "kubernetes", OK, "off (attribution.kubernetes)", "")
		return
	}
	switch ok, why := podresources.Detect(sock); {
	case sock == "":
		r.add(SectionAttribution, "kubernetes", OK, "not used: kubernetes.pod_resources_socket is empty in the agent's configuration", "")
	case ok:
		msg := "Kubernetes pods own their GPU processes' runs: " + why
		st, hint := OK, ""
		if _, in, whyNot := o.Config.Kubernetes.API(); !in {
			st, hint = Warn, "run the agent as the DaemonSet in deploy/kubernetes does (its service account may read pods) for pod labels and the Jobs that own pods"
			msg += "; " + whyNot
		}
		r.add(SectionAttribution, "kubernetes", st, msg, hint)
	case !exists(sock):
		r.add(SectionAttribution, "kubernetes", OK, "not used: "+why, "")
	default:
		r.add(SectionAttribution, "kubernetes", Warn, "not used: "+why,
			"pods' GPU processes are billed to their Linux users until the agent can ask the kubelet")
	}
}

// exists reports whether path exists (as far as this process can tell).
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil || !errors.Is(err, fs.ErrNotExist)
}

// environDenied says whether this process can read other users' process
// environments ("" when it can, or no other user's process was found).
func environDenied(p owner.Proc) string {
	me := os.Geteuid()
	ents, err := os.ReadDir(p.Root)
	if err != nil {
		return ""
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if uid, err := p.UID(pid); err != nil || uid == me {
			continue
		}
		if _, err := os.ReadFile(filepath.Join(p.Root, e.Name(), "environ")); errors.Is(err, fs.ErrPermission) {
			return fmt.Sprintf("running as uid %d: no permission to read other users' /proc/PID/environ (SLURM_JOB_ID)", me)
		}
		return ""
	}
	return ""
}
