package e2e

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/kubelettest"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// apiServerPods stands in for the Kubernetes API server's
// GET /api/v1/namespaces/NS/pods/NAME (bearer token, TLS with its own CA):
// the pods' UIDs, labels and owners.
type apiServerPods struct {
	mu   sync.Mutex
	pods map[string]any // NAMESPACE/NAME -> the pod object
}

func (a *apiServerPods) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	rest, _ := strings.CutPrefix(r.URL.Path, "/api/v1/namespaces/")
	ns, name, _ := strings.Cut(rest, "/pods/")
	pod, ok := a.pods[ns+"/"+name]
	switch {
	case r.Header.Get("Authorization") != "Bearer e2e-token":
		w.WriteHeader(http.StatusForbidden)
	case !ok:
		w.WriteHeader(http.StatusNotFound)
	default:
		_ = json.NewEncoder(w).Encode(pod)
	}
}

func (a *apiServerPods) add(ns, name, uid string, labels map[string]string, job string) {
	meta := map[string]any{"name": name, "namespace": ns, "uid": uid, "labels": labels}
	if job != "" {
		meta["ownerReferences"] = []map[string]any{{"kind": "Job", "name": job, "uid": "job-" + uid, "controller": true}}
	}
	a.mu.Lock()
	a.pods[ns+"/"+name] = map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": meta}
	a.mu.Unlock()
}

// inPodCgroup starts `sleep 60` in a cgroup named as the kubelet names a
// pod's (…/pod<UID>), as a container runtime would put a container's
// process, and returns it and its PID. It needs root (CI runs the e2e
// tests as root).
func inPodCgroup(t *testing.T, uid string) (*exec.Cmd, int) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("making cgroups needs root: CI runs the e2e tests as root")
		}
		t.Skip("making cgroups needs root")
	}
	base := "/sys/fs/cgroup" // cgroup v2
	if _, err := os.Stat(filepath.Join(base, "cgroup.controllers")); err != nil {
		base = "/sys/fs/cgroup/pids" // cgroup v1
	}
	parent := filepath.Join(base, fmt.Sprintf("trainmeter-e2e-kubepods-%d", os.Getpid()))
	dir := filepath.Join(parent, "pod"+uid)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Process.Kill()
		_ = c.Wait()
		_ = os.Remove(dir) // an empty cgroup's directory
		_ = os.Remove(parent)
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(c.Process.Pid)), 0o644); err != nil {
		t.Fatalf("moving a process into %s: %v", dir, err)
	}
	return c, c.Process.Pid
}

// TestKubernetesPodsBecomeRuns: the real agent on the fake libnvidia-ml
// (three GPUs), pointed through agent.yaml at the real podresources v1 gRPC
// service that the test serves on a Unix socket as the kubelet would (no
// kubelet runs here), and at a stand-in API server for the pods' UIDs,
// labels and owners. A Job's pod holds GPU 0; two pods of two namespaces
// share GPU 1, time-sliced; two pods hold two MIG devices of GPU 2 (a
// 3-slice and a 4-slice GPU instance, under their profiles' resources, the
// kubelet naming them by their MIG UUIDs); a pod holds GPU 3 and never runs
// a process on it (it pays for it all the same). Each pod's process (a real
// process in a cgroup named as the kubelet names the pod's) is listed on
// its GPU (on GPU 2, on its MIG device's instances), then exits, then the
// pods go. Each pod (the Job's pod: the Job) is one run, attribution
// kubernetes, with its namespace and labels; the two on GPU 1 each get
// their own process's pod, the two on GPU 2 their MIG device's; no GPU
// time goes to a Linux user; `usage --by namespace` bills each namespace
// its runs' GPU-seconds, and runs + idle = the node.
func TestKubernetesPodsBecomeRuns(t *testing.T) {
	t.Parallel()
	const (
		uidTrain = "0a0a0a0a-0000-4000-8000-000000000001"
		uidNB    = "0b0b0b0b-0000-4000-8000-000000000002"
		uidInfer = "0c0c0c0c-0000-4000-8000-000000000003"
		uidMIG3  = "0d0d0d0d-0000-4000-8000-000000000004"
		uidMIG4  = "0e0e0e0e-0000-4000-8000-000000000005"
		mig3     = "MIG-3a3a3a3a-0000-4000-8000-000000000003" // GPU 2, GPU instance 1, compute instance 0
		mig4     = "MIG-4b4b4b4b-0000-4000-8000-000000000004" // GPU 2, GPU instance 2, compute instance 0
	)
	_, pidTrain := inPodCgroup(t, uidTrain)
	_, pidNB := inPodCgroup(t, uidNB)
	_, pidInfer := inPodCgroup(t, uidInfer)
	_, pidMIG3 := inPodCgroup(t, uidMIG3)
	_, pidMIG4 := inPodCgroup(t, uidMIG4)

	dir := t.TempDir()
	procs := filepath.Join(dir, "procs")
	if err := os.WriteFile(procs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env := fakeNVML(t, fmt.Sprintf("epoch_us %d\ngpus 4\nhigh_w 300\nprocs_file %s\nmig 2 1 0 3 %s\nmig 2 2 0 4 %s\n",
		time.Now().Add(-time.Minute).UnixMicro(), procs, mig3, mig4))
	gpu := func(i int) string { return fmt.Sprintf("GPU-fa4e0000-0000-4000-8000-%012d", i) } // the fake's UUIDs

	kubelet := kubelettest.New()
	sock := kubelettest.Serve(t, kubelet)
	api := &apiServerPods{pods: map[string]any{}}
	srv := httptest.NewTLSServer(api)
	t.Cleanup(srv.Close)
	ca, token := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(token, []byte("e2e-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "kubernetes:\n  pod_resources_socket: %s\n  pod_labels: [team]\n  api_server: %s\n  token_file: %s\n  ca_file: %s\n",
		sock, srv.URL, token, ca), 0o600); err != nil {
		t.Fatal(err)
	}

	// The pods are scheduled and their containers started before their
	// processes reach the GPUs.
	api.add("ml", "bert-x7k2p", uidTrain, map[string]string{"team": "nlp"}, "bert")
	api.add("team-a", "notebook", uidNB, map[string]string{"team": "vision"}, "")
	api.add("team-b", "infer", uidInfer, nil, "")
	api.add("team-c", "mig-small", uidMIG3, nil, "")
	api.add("team-d", "mig-large", uidMIG4, nil, "")
	api.add("team-e", "reserved", "0d0d0d0d-0000-4000-8000-000000000004", nil, "")
	kubelet.Add("ml", "bert-x7k2p", kubelettest.Container{Name: "trainer", Devices: map[string][]string{"nvidia.com/gpu": {gpu(0)}}})
	kubelet.Add("team-a", "notebook", kubelettest.Container{Name: "jupyter", Devices: map[string][]string{"nvidia.com/gpu": {gpu(1) + "::0"}}})
	kubelet.Add("team-b", "infer", kubelettest.Container{Name: "server", Devices: map[string][]string{"nvidia.com/gpu": {gpu(1) + "::1", gpu(1) + "::2"}}})
	kubelet.Add("team-c", "mig-small", kubelettest.Container{Name: "small", Devices: map[string][]string{"nvidia.com/mig-3g.40gb": {mig3}}})
	kubelet.Add("team-d", "mig-large", kubelettest.Container{Name: "large", Devices: map[string][]string{"nvidia.com/mig-4g.40gb": {mig4}}})
	kubelet.Add("team-e", "reserved", kubelettest.Container{Name: "idle", Devices: map[string][]string{"nvidia.com/gpu": {gpu(3)}}})

	c := startCollector(t)
	c.startAgentEnv("k8s-node", "nvml", env, "--config", cfg)
	c.waitStreaming("k8s-node")

	if err := os.WriteFile(procs, fmt.Appendf(nil, "0 %d 1024 80\n1 %d 512 30\n1 %d 512 60\n2 %d 256 50 1 0\n2 %d 256 50 2 0\n",
		pidTrain, pidNB, pidInfer, pidMIG3, pidMIG4), 0o644); err != nil {
		t.Fatal(err)
	}
	ids := []string{"k8s-ml-job-bert", "k8s-team-a-notebook", "k8s-team-b-infer", "k8s-team-c-mig-small", "k8s-team-d-mig-large", "k8s-team-e-reserved"}
	c.eventually("the pods' runs", func() bool {
		live := 0
		for _, r := range c.listRuns() {
			for _, id := range ids {
				if r.RunId == id {
					live++
				}
			}
		}
		return live == len(ids)
	})
	time.Sleep(3 * time.Second)
	// The processes exit; the pods hold their GPUs a moment longer (as a
	// pod does while the kubelet tears it down), then go.
	if err := os.WriteFile(procs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	for _, p := range [][2]string{{"ml", "bert-x7k2p"}, {"team-a", "notebook"}, {"team-b", "infer"}, {"team-c", "mig-small"}, {"team-d", "mig-large"}, {"team-e", "reserved"}} {
		kubelet.Remove(p[0], p[1])
	}

	runs := map[string]*trainmeterv1.RunReport{}
	for _, id := range ids {
		runs[id] = c.waitEnded(id)
	}
	for _, r := range c.listRuns() {
		if r.Attribution != "kubernetes" {
			t.Errorf("run %s (attribution %s, user %s, labels %v): only pods ran on the GPUs", r.RunId, r.Attribution, r.User, r.Labels)
		}
	}
	wantLabels := map[string]map[string]string{
		"k8s-ml-job-bert":      {"k8s.namespace": "ml", "k8s.job": "bert", "k8s.container": "trainer", "team": "nlp"},
		"k8s-team-a-notebook":  {"k8s.namespace": "team-a", "k8s.pod": "notebook", "k8s.container": "jupyter", "team": "vision"},
		"k8s-team-b-infer":     {"k8s.namespace": "team-b", "k8s.pod": "infer", "k8s.container": "server"},
		"k8s-team-c-mig-small": {"k8s.namespace": "team-c", "k8s.pod": "mig-small", "k8s.container": "small"},
		"k8s-team-d-mig-large": {"k8s.namespace": "team-d", "k8s.pod": "mig-large", "k8s.container": "large"},
		"k8s-team-e-reserved":  {"k8s.namespace": "team-e", "k8s.pod": "reserved", "k8s.container": "idle"},
	}
	gpuS := map[string]float64{}
	for id, r := range runs {
		row := c.csvRow(id)
		gpuS[id] = r.GpuHours * 3600
		t.Logf("%s: gpus %s wall_s %.2f gpu_s %.3f end_status %s attribution %s labels %v", id, row["gpus"], r.WallS, gpuS[id], row["end_status"], row["attribution"], r.Labels)
		if row["attribution"] != "kubernetes" || row["end_status"] != "ok" || r.GetGpus() != 1 {
			t.Errorf("%s: %v", id, row)
		}
		for k, v := range wantLabels[id] {
			if r.Labels[k] != v {
				t.Errorf("%s: label %s = %q, want %q (labels %v)", id, k, r.Labels[k], v, r.Labels)
			}
		}
	}
	// The Job's pod had GPU 0 alone: one GPU for its wall time.
	within(t, "the Job's GPU-seconds", gpuS["k8s-ml-job-bert"], runs["k8s-ml-job-bert"].WallS, 1e-6)
	// The pod that held GPU 3 with no process on it paid for it while it
	// was in the kubelet's list: one GPU for its wall time, which spans
	// the other pods' processes.
	within(t, "the idle-holding pod's GPU-seconds", gpuS["k8s-team-e-reserved"], runs["k8s-team-e-reserved"].WallS, 1e-6)
	if w := runs["k8s-team-e-reserved"].WallS; w < 4 {
		t.Errorf("the pod holding GPU 3 was billed %.2f s: it held it from before the other pods' processes to their pods' end", w)
	}
	// The two pods on GPU 1 had it alone or together, never idle, from the
	// first's start to the last's end: their shares add up to that span.
	a, b := runs["k8s-team-a-notebook"], runs["k8s-team-b-infer"]
	first, last := a.Start.AsTime(), a.End.AsTime()
	if b.Start.AsTime().Before(first) {
		first = b.Start.AsTime()
	}
	if b.End.AsTime().After(last) {
		last = b.End.AsTime()
	}
	span := last.Sub(first).Seconds()
	within(t, "GPU 1's pods' GPU-seconds", gpuS["k8s-team-a-notebook"]+gpuS["k8s-team-b-infer"], span, 1e-3)
	if gpuS["k8s-team-a-notebook"] <= 0 || gpuS["k8s-team-b-infer"] <= 0 {
		t.Errorf("a time-sliced pod got no share of GPU 1: %v", gpuS)
	}

	// The two MIG pods had GPU 2 together, never idle while they ran: their
	// GPU-seconds add up to their span, the 4-slice instance's pod more.
	s3, s4 := runs["k8s-team-c-mig-small"], runs["k8s-team-d-mig-large"]
	first, last = s3.Start.AsTime(), s3.End.AsTime()
	if s4.Start.AsTime().Before(first) {
		first = s4.Start.AsTime()
	}
	if s4.End.AsTime().After(last) {
		last = s4.End.AsTime()
	}
	within(t, "GPU 2's MIG pods' GPU-seconds", gpuS["k8s-team-c-mig-small"]+gpuS["k8s-team-d-mig-large"], last.Sub(first).Seconds(), 1e-3)
	if gpuS["k8s-team-c-mig-small"] <= 0 || gpuS["k8s-team-d-mig-large"] <= gpuS["k8s-team-c-mig-small"] {
		t.Errorf("GPU 2's MIG pods: the 4-slice pod's %.3f GPU-seconds should exceed the 3-slice pod's %.3f (> 0)",
			gpuS["k8s-team-d-mig-large"], gpuS["k8s-team-c-mig-small"])
	}

	var u usageJSON
	if err := json.Unmarshal([]byte(c.cli("usage", "--by", "namespace", "--json")), &u); err != nil {
		t.Fatal(err)
	}
	rows := map[string]float64{}
	var runSum float64
	for _, r := range u.Rows {
		if !r.Idle {
			rows[strings.Join(r.Keys, "/")] += r.GPUSeconds
			runSum += r.GPUSeconds
		}
	}
	t.Logf("usage --by namespace: %v, nodes %+v", rows, u.Nodes)
	want := map[string]float64{"ml": gpuS["k8s-ml-job-bert"], "team-a": gpuS["k8s-team-a-notebook"], "team-b": gpuS["k8s-team-b-infer"],
		"team-c": gpuS["k8s-team-c-mig-small"], "team-d": gpuS["k8s-team-d-mig-large"], "team-e": gpuS["k8s-team-e-reserved"]}
	if len(rows) != len(want) {
		t.Errorf("usage --by namespace rows %v, want %v", rows, want)
	}
	for ns, s := range want {
		within(t, ns+"'s GPU-seconds", rows[ns], s, 1e-6)
	}
	if len(u.Nodes) != 1 {
		t.Fatalf("nodes %+v", u.Nodes)
	}
	n := u.Nodes[0]
	within(t, "runs + idle", runSum+n.IdleS, n.GPUSeconds, 1e-6)
}
