package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The collector runs on machines without GPUs or drivers, often as a static
// binary: it must not link NVML or AMD SMI (nor the AMD sysfs backend), nor
// need cgo.
func TestCollectorDoesNotImportNVMLOrNeedCgo(t *testing.T) {
	deps := goList(t, "github.com/trainmeter/trainmeter/collector/cmd/trainmeter")
	for _, d := range deps {
		if strings.Contains(d, "go-nvml") || strings.HasSuffix(d, "/agent/internal/gpu/nvmlgpu") || strings.HasSuffix(d, "/agent/internal/gpuopen") ||
			strings.Contains(d, "/internal/gpu/amdgpu") {
			t.Errorf("collector imports %s", d)
		}
	}
	// Positive control: the same check sees NVML in the agent.
	agent := strings.Join(goList(t, "github.com/trainmeter/trainmeter/agent/cmd/trainmeter-agent"), "\n")
	if !strings.Contains(agent, "github.com/NVIDIA/go-nvml/pkg/nvml") || !strings.Contains(agent, "/internal/gpu/amdgpu/amdsmi") {
		t.Error("dependency listing did not find go-nvml and amdsmi in the agent; the check above proves nothing")
	}

	cmd := exec.Command("go", "build", "-o", os.DevNull, "github.com/trainmeter/trainmeter/collector/cmd/trainmeter")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("collector does not build with CGO_ENABLED=0: %v\n%s", err, out)
	}
}

func goList(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}
