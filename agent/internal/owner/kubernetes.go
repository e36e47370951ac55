package owner

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/podresources"
)

// PodRuns names the run of a pod holding a GPU (podresources.Resolver:
// it may ask the API server, up to its timeout).
type PodRuns interface {
	Run(ctx context.Context, h podresources.Holder) podresources.Run
	Forget(s *podresources.Snapshot)
}

// Kubernetes finds the pod of a GPU process from the kubelet's
// pod-resources API: the pod the kubelet allocated the process's GPU to
// (its MIG device, for a process on one).
// One pod holding the GPU: that pod. Several (a time-sliced GPU): the pod
// whose UID is in the process's cgroup path, where the API server gave the
// pods' UIDs; otherwise the process is left to the next source. Refresh,
// called once a second off the sampling path and off the attribution
// poll, lists the pods and resolves new ones; Owners and Ended only read
// what the last Refresh found, so they never wait for the kubelet or the
// API server.
type Kubernetes struct {
	client *podresources.Client
	runs   PodRuns
	proc   Proc
	log    *slog.Logger

	mu     sync.Mutex
	snap   *podresources.Snapshot      // nil until a List answered
	listed bool                        // the last List answered
	pods   map[string]podresources.Run // NAMESPACE/POD -> its run, for the pods in snap
	live   map[string]bool             // run id -> some pod of it is in snap
	failAt time.Time                   // when a failed List was last logged
	shared map[string]bool             // GPUs whose processes were left to the next source, logged
}

// NewKubernetes is the Kubernetes source over a pod-resources client and
// the runs' namer; log may be nil.
func NewKubernetes(c *podresources.Client, runs PodRuns, p Proc, log *slog.Logger) *Kubernetes {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Kubernetes{client: c, runs: runs, proc: p, log: log, pods: map[string]podresources.Run{}, live: map[string]bool{}, shared: map[string]bool{}}
}

// Name implements Source.
func (k *Kubernetes) Name() string { return AttrKubernetes }

// Refresh lists the pods holding GPUs and names the run of each new one.
// now is the caller's clock's time (for the logging of failures).
func (k *Kubernetes) Refresh(ctx context.Context, now time.Time) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	snap, err := k.client.Snapshot(lctx)
	cancel()
	if err != nil {
		k.mu.Lock()
		k.listed = false
		log := now.Sub(k.failAt) > time.Minute
		if log {
			k.failAt = now
		}
		k.mu.Unlock()
		if log {
			k.log.Warn("cannot list the kubelet's pods: pods' GPU processes go to the next source meanwhile, and no pod's run ends", "err", err)
		}
		return
	}
	k.runs.Forget(snap)
	pods := map[string]podresources.Run{}
	live := map[string]bool{}
	for _, g := range snap.GPUs() {
		for _, h := range snap.Holders(g) {
			if _, done := pods[h.Key()]; done {
				continue
			}
			r := k.runs.Run(ctx, h)
			pods[h.Key()] = r
			live[r.ID] = true
		}
	}
	k.mu.Lock()
	k.snap, k.listed, k.pods, k.live = snap, true, pods, live
	k.mu.Unlock()
}

// podUIDRe is a pod's UID in a cgroup path: cgroupfs's
// /kubepods/burstable/pod<uid>/<container> and systemd's
// kubepods-burstable-pod<uid with _ for ->.slice.
var podUIDRe = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// PodUIDOfCgroup is the pod UID in cgroup paths, "" when none.
func PodUIDOfCgroup(cgroups []string) string {
	for _, c := range cgroups {
		if m := podUIDRe.FindStringSubmatch(c); m != nil {
			return strings.ReplaceAll(m[1], "_", "-")
		}
	}
	return ""
}

// Owners implements Source.
func (k *Kubernetes) Owners(procs []Process) map[int]Owner {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[int]Owner{}
	if k.snap == nil {
		return out
	}
	for _, p := range procs {
		if _, done := out[p.PID]; done || p.GPUUUID == "" && p.MIGUUID == "" {
			continue
		}
		// A MIG device is held under its own UUID; its parent GPU's UUID
		// is held only where the whole GPU was handed out.
		dev := cmp.Or(p.MIGUUID, p.GPUUUID)
		hs := k.snap.Holders(dev)
		if len(hs) == 0 && dev != p.GPUUUID && p.GPUUUID != "" {
			dev, hs = p.GPUUUID, k.snap.Holders(p.GPUUUID)
		}
		var run podresources.Run
		switch len(hs) {
		case 0:
			continue
		case 1:
			run = k.pods[hs[0].Key()]
		default:
			uid := ""
			if cg, err := k.proc.Cgroup(p.PID); err == nil {
				uid = PodUIDOfCgroup(cg)
			}
			for _, h := range hs {
				if r := k.pods[h.Key()]; uid != "" && r.PodUID == uid {
					run = r
				}
			}
			if run.ID == "" {
				if !k.shared[dev] {
					k.shared[dev] = true
					k.log.Info("a time-sliced GPU's process is in none of its pods' cgroups as the API server names them (no access to the API server, or not in a pod): it goes to the next source",
						"gpu", dev, "pid", p.PID, "pods", len(hs), "cgroup_pod_uid", uid)
				}
				continue
			}
		}
		if run.ID == "" {
			continue // not resolved (cannot happen: Refresh names every holder)
		}
		uid := -1
		if u, err := k.proc.UID(p.PID); err == nil {
			uid = u
		}
		out[p.PID] = Owner{Source: AttrKubernetes, RunID: run.ID, UID: uid, Labels: maps.Clone(run.Labels), Persistent: true}
	}
	return out
}

// Ended implements Source: a pod's run ends when no pod of it is in the
// kubelet's list any more (a Job's run, when none of the Job's pods on
// this node is). The pod-resources API does not say how the pod's
// containers exited: the run ends ok. While the kubelet does not answer,
// no run ends.
func (k *Kubernetes) Ended(o Owner) (End, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.listed || k.live[o.RunID] {
		return End{}, false
	}
	return End{Status: "ok"}, true
}

// Close closes the connection to the kubelet.
func (k *Kubernetes) Close() error { return k.client.Close() }

// Allocated implements Allocator: the GPUs each pod in the kubelet's last
// list holds (a Job's pods on this node together), whole GPUs and
// time-sliced replicas; MIG devices, which are no device index of the
// backend, are left out. While the kubelet does not answer, none.
func (k *Kubernetes) Allocated(_ time.Time, devs []Device) []Allocation {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.snap == nil || !k.listed {
		return nil
	}
	byRun := map[string]*Allocation{}
	var order []string
	for _, d := range devs {
		if d.UUID == "" {
			continue
		}
		for _, h := range k.snap.Holders(d.UUID) {
			r := k.pods[h.Key()]
			if r.ID == "" {
				continue
			}
			a := byRun[r.ID]
			if a == nil {
				a = &Allocation{Owner: Owner{Source: AttrKubernetes, RunID: r.ID, UID: -1, Labels: maps.Clone(r.Labels), Persistent: true}}
				byRun[r.ID] = a
				order = append(order, r.ID)
			}
			if !slices.Contains(a.GPUs, d.Index) {
				a.GPUs = append(a.GPUs, d.Index)
			}
		}
	}
	out := make([]Allocation, 0, len(order))
	for _, id := range order {
		out = append(out, *byRun[id])
	}
	return out
}
