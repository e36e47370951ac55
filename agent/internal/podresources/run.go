package podresources

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
)

// The labels a Kubernetes run carries besides the selected pod labels, in
// the k8s. namespace as Slurm's are in slurm. (usage --by namespace groups
// by k8s.namespace).
const (
	LabelNamespace = "k8s.namespace"
	LabelPod       = "k8s.pod"       // the pod's name; on pod runs only
	LabelJob       = "k8s.job"       // the owning Job's name; on Job runs only
	LabelContainer = "k8s.container" // the containers holding GPUs, comma-separated
)

// Reserved are the label keys RunFor sets itself; a selected pod label of
// the same key is not copied.
var Reserved = []string{LabelNamespace, LabelPod, LabelJob, LabelContainer}

// maxRunID is the agent's and the collector's bound on a run id.
const maxRunID = 256

// Run is the run a pod's GPU time is booked to.
type Run struct {
	// ID is k8s-NAMESPACE-POD, or k8s-NAMESPACE-job-JOB for a pod that a
	// Job controls (one run for all the Job's pods, on every node).
	ID string
	// Name is the pod's or the Job's name.
	Name string
	// Job reports whether the run is a Job's.
	Job bool
	// Labels: k8s.namespace, k8s.pod or k8s.job, k8s.container, and the
	// selected pod labels the pod has.
	Labels map[string]string
	// PodUID is the pod's UID as the API server gave it; "" when it was
	// not read. It tells apart the pods sharing a time-sliced GPU by
	// their processes' cgroups.
	PodUID string
}

// RunFor names the run of a pod holding a GPU. meta is what the API
// server said of the pod (nil: not known; the run is then the pod's, with
// k8s.namespace, k8s.pod and k8s.container). podLabels are the pod label keys to copy.
func RunFor(h Holder, meta *PodMeta, podLabels []string) Run {
	r := Run{ID: "k8s-" + h.Namespace + "-" + h.Pod, Name: h.Pod, Labels: map[string]string{LabelNamespace: h.Namespace}}
	if j := meta.Job(); j != nil {
		r = Run{ID: "k8s-" + h.Namespace + "-job-" + j.Name, Name: j.Name, Job: true, Labels: map[string]string{LabelNamespace: h.Namespace, LabelJob: j.Name}}
	} else {
		r.Labels[LabelPod] = h.Pod
	}
	if len(h.Containers) > 0 {
		r.Labels[LabelContainer] = strings.Join(h.Containers, ",")
	}
	if meta != nil {
		r.PodUID = meta.UID
		for _, k := range podLabels {
			if v, ok := meta.Labels[k]; ok {
				if _, taken := r.Labels[k]; !taken {
					r.Labels[k] = v
				}
			}
		}
	}
	r.ID = boundID(r.ID)
	return r
}

// boundID keeps an id within maxRunID bytes: a longer one is cut and ends
// in a hash of the whole, so that two long names stay two runs.
func boundID(id string) string {
	if len(id) <= maxRunID {
		return id
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	return fmt.Sprintf("%s-%016x", id[:maxRunID-17], h.Sum64())
}

// Resolver names the runs of the pods holding GPUs, reading each pod's
// labels and owners from the API server once (api may be nil: none
// read). A pod's run is fixed at its first lookup, so that it keeps one
// identity while it lives even if the API server answers only later.
type Resolver struct {
	api       *APIReader
	podLabels []string

	mu   sync.Mutex
	runs map[string]Run // NAMESPACE/POD -> its run
}

// NewResolver makes a resolver; api may be nil.
func NewResolver(api *APIReader, podLabels []string) *Resolver {
	return &Resolver{api: api, podLabels: podLabels, runs: map[string]Run{}}
}

// Run is the run of the pod holding a GPU. The container label is that
// of the pod's first lookup.
func (r *Resolver) Run(ctx context.Context, h Holder) Run {
	key := h.Key()
	r.mu.Lock()
	run, ok := r.runs[key]
	r.mu.Unlock()
	if ok {
		return run
	}
	var meta *PodMeta
	if r.api != nil {
		meta, _ = r.api.Pod(ctx, h.Namespace, h.Pod) // the reader says once why not
	}
	run = RunFor(h, meta, r.podLabels)
	r.mu.Lock()
	if prev, ok := r.runs[key]; ok {
		run = prev // a concurrent lookup came first
	} else {
		r.runs[key] = run
	}
	r.mu.Unlock()
	return run
}

// Forget drops the pods not in s, so that a pod of the same name later
// is read afresh.
func (r *Resolver) Forget(s *Snapshot) {
	live := map[string]bool{}
	for _, p := range s.Pods() {
		live[p.Key()] = true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.runs {
		if !live[k] {
			delete(r.runs, k)
		}
	}
}
