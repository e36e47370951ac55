package amdgpu_test

import (
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu"
	"github.com/trainmeter/trainmeter/pkg/gpu"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// BenchmarkProcessUsageRealProc is the once-a-second cost of per-process
// usage on this machine's /proc (every process's fdinfo is read), for one
// card of the MI300X fixture.
func BenchmarkProcessUsageRealProc(b *testing.B) {
	clk := clock.NewFake(time.Unix(0, 0))
	be, err := amdgpu.New(amdgpu.Options{SysfsRoot: "testdata/mi300x/sys", ProcfsRoot: "/proc", Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	for b.Loop() {
		clk.Advance(time.Second) // every call rescans
		if _, err := be.ProcessUsage(0, time.Time{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadMI300X is one sampling tick of the two-card MI300X fixture:
// per card hwmon power, gpu_metrics, VRAM used/total and busy %, each an
// open/read/close of a small file. On real sysfs the driver builds each
// answer (gpu_metrics from a table it caches for 1 ms), so this is the
// agent's side of the cost only.
func BenchmarkReadMI300X(b *testing.B) {
	be, err := amdgpu.New(amdgpu.Options{SysfsRoot: "testdata/mi300x/sys", ProcfsRoot: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	dst := make([]gpu.Sample, 2)
	now := time.Unix(0, 0)
	for b.Loop() {
		now = now.Add(50 * time.Millisecond)
		if err := be.Read(now, dst); err != nil {
			b.Fatal(err)
		}
	}
}
