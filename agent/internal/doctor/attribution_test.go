package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
	"github.com/trainmeter/trainmeter/internal/kubelettest"
)

// The doctor says which owner sources the agent would use: Slurm when
// slurmd runs on the node (a process named slurmd), and why not otherwise.
func TestAttributionSources(t *testing.T) {
	check := func(procs map[string]string, socket ...string) map[string]Check {
		dir := t.TempDir()
		for pid, comm := range procs {
			if err := os.MkdirAll(filepath.Join(dir, pid), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, pid, "comm"), []byte(comm+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		cfg := agentconfig.DefaultConfig()
		cfg.GPU, cfg.ProcfsRoot = "nvml", dir
		cfg.Kubernetes.PodResourcesSocket = filepath.Join(dir, "no-kubelet.sock")
		if len(socket) > 0 {
			cfg.Kubernetes.PodResourcesSocket = socket[0]
		}
		r := &Report{OK: true}
		checkAttribution(Options{Config: cfg}, r)
		out := map[string]Check{}
		for _, c := range r.Checks {
			out[c.Name] = c
		}
		return out
	}
	none := check(map[string]string{"1": "systemd", "42": "python3"})
	if c := none["slurm"]; c.Status != OK || c.Message != "not used: no slurmd process on this node" {
		t.Errorf("without slurmd: %+v", c)
	}
	if c := none["processes"]; !strings.Contains(c.Message, "billed to their Linux user") {
		t.Errorf("processes: %+v", c)
	}
	if c := none["kubernetes"]; c.Status != OK || !strings.Contains(c.Message, "not used: no kubelet socket at ") {
		t.Errorf("kubernetes without a kubelet: %+v", c)
	}
	// A kubelet's pod-resources API (the stand-in: no kubelet runs here),
	// the agent not in a pod: used, and pods' labels not read.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	k := kubelettest.New()
	k.Add("ml", "train", kubelettest.Container{Name: "t", Devices: map[string][]string{"nvidia.com/gpu": {"GPU-1"}}})
	if c := check(nil, kubelettest.Serve(t, k))["kubernetes"]; c.Status != Warn ||
		!strings.Contains(c.Message, "Kubernetes pods own their GPU processes' runs: kubelet pod-resources API at ") ||
		!strings.Contains(c.Message, "1 pods hold 1 GPUs; not in a Kubernetes pod") {
		t.Errorf("kubernetes with a kubelet: %+v", c)
	}
	notSock := filepath.Join(t.TempDir(), "kubelet.sock")
	if err := os.WriteFile(notSock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if c := check(nil, notSock)["kubernetes"]; c.Status != Warn || !strings.Contains(c.Message, "exists but is not a socket") {
		t.Errorf("kubernetes, a file for a socket: %+v", c)
	}
	if c := check(nil, "")["kubernetes"]; c.Status != OK || !strings.Contains(c.Message, "pod_resources_socket is empty") {
		t.Errorf("kubernetes off: %+v", c)
	}
	with := check(map[string]string{"1": "systemd", "77": "slurmd"})
	if c := with["slurm"]; !strings.Contains(c.Message, "Slurm jobs own their GPU processes' runs: slurmd runs (pid 77)") {
		t.Errorf("with slurmd: %+v", c)
	}
}

// Sources turned off in agent.yaml's attribution section are shown off,
// whatever the node has.
func TestAttributionSourcesOff(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "77"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "77", "comm"), []byte("slurmd\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	k := kubelettest.New()
	cfg := agentconfig.DefaultConfig()
	cfg.GPU, cfg.ProcfsRoot = "nvml", dir
	cfg.Kubernetes.PodResourcesSocket = kubelettest.Serve(t, k)
	cfg.Attribution = agentconfig.AttributionConfig{Processes: "off", Slurm: "off", Kubernetes: "off"}
	r := &Report{OK: true}
	checkAttribution(Options{Config: cfg}, r)
	got := map[string]string{}
	for _, c := range r.Checks {
		got[c.Name] = c.Message
	}
	want := map[string]string{
		"processes":  "off (attribution.processes): the GPU time of processes that no run, job or pod owns is idle",
		"slurm":      "off (attribution.slurm)",
		"kubernetes": "off (attribution.kubernetes)",
	}
	for name, msg := range want {
		if got[name] != msg {
			t.Errorf("%s: %q, want %q", name, got[name], msg)
		}
	}
}
