package agent

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
	"github.com/trainmeter/trainmeter/agent/internal/ledger"
	"github.com/trainmeter/trainmeter/agent/internal/owner"
	"github.com/trainmeter/trainmeter/agent/internal/podresources"
	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// GPU attribution by process tree (run_start attribute_pid, which
// `trainmeter run` sets to its own PID): once a second, off the 50 ms
// sampling path, the agent lists each GPU's compute processes, walks /proc
// up from each to see whether it descends from a run's attribute_pid, and
// adds the GPUs found to that run (ledger.AddGPUs). The processes no
// trainer's run owns go to their owners (owned.go).

// attributeEvery is how often the GPUs' processes are listed (NVML takes
// milliseconds per GPU for it).
const attributeEvery = time.Second

// maxTreeDepth bounds the walk up from a process to its ancestors.
const maxTreeDepth = 1024

// initAttribution decides whether this backend can attribute GPUs by
// process tree. Backends without a lister (the simulator, whose GPUs run
// no processes, and replay) leave runs on every GPU.
func (a *Agent) initAttribution(backend gpu.Backend) bool {
	a.procRoot = cmp.Or(a.cfg.ProcfsRoot, "/proc")
	a.procs, _ = backend.(gpu.ProcessLister)
	a.migs, _ = backend.(gpu.MIGProcessLister)
	if a.procs != nil {
		// Scheduler sources, detected (docs/attribution.md); doctor says
		// which and why not.
		if agentconfig.Off(a.cfg.Attribution.Slurm) {
			a.log.Info("no Slurm source: attribution.slurm is off")
		} else if ok, why := owner.SlurmDetect(owner.Proc{Root: a.procRoot}); ok {
			a.owned.sources = append(a.owned.sources, owner.NewSlurm(owner.Proc{Root: a.procRoot}))
			a.log.Info("Slurm jobs own their GPU processes' runs", "why", why)
		}
		a.initKubernetes(backend)
	}
	return a.procs != nil
}

// initKubernetes adds the Kubernetes source when the kubelet's
// pod-resources API answers at the configured socket (docs/kubernetes.md).
// Device plugins that hand out indexes ("0", GKE's "nvidia0") instead of
// UUIDs are mapped to the backend's UUIDs.
func (a *Agent) initKubernetes(backend gpu.Backend) {
	sock := a.cfg.Kubernetes.PodResourcesSocket
	if sock == "" || agentconfig.Off(a.cfg.Attribution.Kubernetes) {
		return
	}
	if ok, why := podresources.Detect(sock); !ok {
		a.log.Debug("no Kubernetes source", "why", why)
		return
	}
	ids := map[string]string{}
	for _, d := range backend.Devices() {
		if d.UUID != "" {
			ids[strconv.Itoa(d.Index)] = d.UUID
			ids["nvidia"+strconv.Itoa(d.Index)] = d.UUID
		}
	}
	c, err := podresources.Dial(sock, podresources.Options{IDs: ids})
	if err != nil {
		a.log.Warn("no Kubernetes source", "err", err)
		return
	}
	var api *podresources.APIReader
	if cfg, ok, why := a.cfg.Kubernetes.API(); !ok {
		a.log.Info("Kubernetes pods' runs carry namespace, pod and container only", "why", why)
	} else if api, err = podresources.NewAPIReader(cfg, a.log); err != nil {
		a.log.Warn("Kubernetes pods' runs carry namespace, pod and container only", "err", err)
		api = nil
	}
	a.k8s = owner.NewKubernetes(c, podresources.NewResolver(api, a.cfg.Kubernetes.PodLabels), owner.Proc{Root: a.procRoot}, a.log)
	// The first list before the first attribution poll, so that a pod's
	// processes already on the GPUs are never its user's for a second.
	a.k8s.Refresh(context.Background(), a.clock.Now())
	a.owned.sources = append(a.owned.sources, a.k8s)
	a.log.Info("Kubernetes pods own their GPU processes' runs", "socket", sock)
}

// pollAttribution adds to every process-attributed run the GPUs its tree
// now computes on, and gives the processes no trainer's run owns to their
// owners (owned.go).
func (a *Agent) pollAttribution() {
	if a.procs == nil {
		return
	}
	onGPU := map[int][]int{} // pid -> GPUs
	complete := true
	for i := range a.backend.Devices() {
		pids, err := a.procs.ComputePIDs(i)
		if err != nil {
			complete = false
			if now := a.clock.Now(); now.Sub(a.lastProcErr) > time.Minute {
				a.lastProcErr = now
				a.log.Warn("cannot list a GPU's compute processes; runs attributed by process tree may miss it", "gpu", i, "err", err)
			}
			continue
		}
		for _, p := range pids {
			onGPU[int(p)] = append(onGPU[int(p)], i)
		}
	}
	ppids := map[int]int{} // one /proc read per process per poll
	for _, r := range a.ledger.AttributedRuns() {
		var gpus []int
		for pid, gs := range onGPU {
			if inTree(a.procRoot, pid, r.PID, ppids) {
				gpus = append(gpus, gs...)
			}
		}
		if len(gpus) > 0 {
			a.ledger.AddGPUs(a.clock.Now(), r.ID, gpus)
		}
	}
	a.pollOwners(onGPU, complete, ppids)
}

// pollMIGs is the MIG device of each GPU's compute processes (GPU -> PID
// -> MIG UUID), for the sources that know MIG devices by their UUID (the
// kubelet's pod-resources API); nil without such a source or a backend
// that can tell. A GPU that cannot be listed has none.
func (a *Agent) pollMIGs() map[int]map[uint32]string {
	if a.migs == nil || a.k8s == nil {
		return nil
	}
	out := map[int]map[uint32]string{}
	for i := range a.backend.Devices() {
		if m, err := a.migs.ComputeMIGs(i); err == nil && len(m) > 0 {
			out[i] = m
		}
	}
	return out
}

// checkAttributePID makes sure a run_start's attribute_pid names the sending
// process or one of its descendants, as the agent sees them. A client in
// another PID namespace (a container) sends its own view of its PID; the
// kernel's view of the sender (SO_PEERCRED) is used then. A client may not
// claim another process tree's GPUs either way.
func (a *Agent) checkAttributePID(p ledger.Peer, e *trainerproto.RunStart) {
	if e.AttributePID == nil || a.procs == nil || p.PID <= 0 {
		return
	}
	pid := int(*e.AttributePID)
	if pid == int(p.PID) || inTree(a.procRoot, pid, int(p.PID), map[int]int{}) {
		return
	}
	a.log.Info("run_start attribute_pid is not the sender or its descendant here (another PID namespace?): attributing the sender's process tree",
		"run_id", e.Run, "attribute_pid", pid, "sender_pid", p.PID)
	v := uint64(p.PID)
	e.AttributePID = &v
}

// inTree reports whether pid is root or descends from it, reading parent
// PIDs from procRoot/PID/stat (cached in ppids; -1 when unreadable).
func inTree(procRoot string, pid, root int, ppids map[int]int) bool {
	for range maxTreeDepth {
		if pid == root {
			return true
		}
		if pid <= 1 {
			return false
		}
		pp, ok := ppids[pid]
		if !ok {
			var err error
			if pp, err = readPPID(procRoot, pid); err != nil {
				pp = -1
			}
			ppids[pid] = pp
		}
		if pp < 0 || pp == pid {
			return false
		}
		pid = pp
	}
	return false
}

// readPPID returns the parent PID from /proc/PID/stat.
func readPPID(procRoot string, pid int) (int, error) {
	f, err := statFields(procRoot, pid, 2)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(string(f[1]))
}

// statFields reads procRoot/PID/stat and returns its fields from the
// state on (f[0] is field 3, state; f[1] ppid; ...), at least n of them.
// The command name (field 2) is in parentheses and may itself hold spaces
// and ')', so the fields are counted from the last ')'.
func statFields(procRoot string, pid, n int) ([][]byte, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("%d/stat: no command name", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < n {
		return nil, fmt.Errorf("%d/stat: too short", pid)
	}
	return f, nil
}
