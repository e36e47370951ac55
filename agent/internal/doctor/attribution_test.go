package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
)

// The doctor says which owner sources the agent would use: Slurm when
// slurmd runs on the node (a process named slurmd), and why not otherwise.
func TestAttributionSources(t *testing.T) {
	check := func(procs map[string]string) map[string]Check {
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
	if c := none["kubernetes"]; !strings.Contains(c.Message, "no kubelet pod-resources socket") && !strings.Contains(c.Message, "does not ask it yet") {
		t.Errorf("kubernetes: %+v", c)
	}
	with := check(map[string]string{"1": "systemd", "77": "slurmd"})
	if c := with["slurm"]; !strings.Contains(c.Message, "Slurm jobs own their GPU processes' runs: slurmd runs (pid 77)") {
		t.Errorf("with slurmd: %+v", c)
	}
}
