// Package owner says who owns the processes on a node's GPUs when no run
// of a trainer does: a scheduler's job (Slurm) or pod (Kubernetes), else the
// Linux user of the process group (docs/attribution.md). The agent asks the
// sources in order, once a second, off the sampling path, and books each
// owner as a run of its own.
package owner

import "time"

// Attribution values (RunStart.attribution): where a run came from.
const (
	AttrRun        = "run"        // a trainer's run_start or trainmeter run
	AttrSlurm      = "slurm"      // a Slurm job
	AttrKubernetes = "kubernetes" // a Kubernetes pod
	AttrProcess    = "process"    // a Linux user's process group
)

// Process is one compute process on one GPU, as the GPU backend lists it.
type Process struct {
	PID     int
	GPU     int    // device index on this node
	GPUUUID string // "" when the backend has none
	MIGUUID string // the MIG device it runs on (MIG-…); "" outside MIG or unknown
}

// Owner is who a process is billed to: one run per owner.
type Owner struct {
	// Source is the attribution: AttrSlurm, AttrKubernetes or AttrProcess.
	Source string
	// RunID is the run's id, the same on every node the owner spans (a
	// multi-node Slurm job is one run).
	RunID string
	// UID owns the run (the run's user); -1 when the source does not know
	// it (the agent then books it to root).
	UID int
	// Labels go on the run (slurm.account, k8s.namespace, process.command).
	Labels map[string]string
	// Persistent owners (a job, a pod) keep their run while the scheduler
	// says they live, even with no process on a GPU for a while; the run
	// of one that is not (a process group) ends when its processes leave
	// the GPUs.
	Persistent bool
}

// End is how an owner's run ended.
type End struct {
	// Status is a run_end status ("ok", "exit 3", "signal SIGKILL",
	// "stopped: cancelled", "error"); "" when unknown (the run ends "lost"
	// unless a trainer in it ended it).
	Status string
	// Error is the cause of a failed end ("out of memory").
	Error string
}

// Source finds the owners of GPU processes. A Kubernetes source (the
// kubelet's pod-resources API, which names the devices each container
// holds) plugs in beside Slurm through this interface.
type Source interface {
	// Name is the source's attribution (AttrSlurm, AttrKubernetes).
	Name() string
	// Owners returns the owner of each process this source knows, by PID;
	// the processes it leaves out go to the next source.
	Owners(procs []Process) map[int]Owner
	// Ended says whether a persistent owner whose run is live has ended,
	// and how; the agent asks once a second while none of the owner's
	// processes is on a GPU. done false: it still runs (or the source
	// cannot tell yet).
	Ended(o Owner) (end End, done bool)
}

// Device is one GPU of the node: its index and UUID ("" when none).
type Device struct {
	Index int
	UUID  string
}

// Allocation is a live owner and the GPUs (device indices) its scheduler
// allocated to it on this node.
type Allocation struct {
	Owner Owner
	GPUs  []int
}

// Allocator is a Source that also knows which GPUs its scheduler allocated
// to the owners that live now, whether or not a process of theirs is on
// them: a GPU with no process on it is booked to the owners holding it (a
// tenant who holds a GPU pays for it). now is the caller's clock's time.
type Allocator interface {
	Allocated(now time.Time, devs []Device) []Allocation
}
